"""The state and control of one run: one actor on the job's node, which also runs the run's
`fit()` and Ray Train's controller loop in its own process (`launcher.run_controller_here`), so
the workers and their placement group belong to it: killing it ends the run at once.

`ray.train.report()` is a barrier that can block for seconds in Ray Train V2, so the workers
use it only to register checkpoints. Everything else goes through this actor: rank 0 sends
its metrics records in batches, fire-and-forget; the driver reads what changed since its last
look (new events, new records, a rewind after a restart) to print progress and keep the
metrics log; and the driver sets a stop request here that rank 0 reads and folds into the
collective the loop already makes, so every rank stops at the same step.

Each start of the worker group is an *attempt*; Ray Train restarts the whole group after a
failure, and every group has a placement group of its own, so a new placement group id means
a new attempt. Records are tagged with their attempt, so a late record from a dead worker can
never land in the log after the restarted run rewound it to its checkpoint.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import ray

from orchestrator.ray.cluster import yield_to_training


@dataclass
class WorkersStarted:
    attempt: int
    members: dict[int, dict]  # rank -> {"pid", "node", "node_id"}


@dataclass
class RunStarted:
    attempt: int
    step: int  # 0: from scratch; else the checkpoint's step
    checkpoint: str | None = None  # the checkpoint it resumed from
    skipped: list[dict] = field(default_factory=list)  # newer ones that were incomplete, and why
    time: float = field(default_factory=time.time)  # when the workers had loaded it


@dataclass
class CheckpointSaved:
    step: int
    uri: str


@dataclass
class Records:
    records: list[dict]


@dataclass
class RankRecord:
    """The newest record of a rank other than 0 (for per-rank metrics; not logged)."""

    rank: int
    record: dict


@dataclass
class Rewound:
    """The log now holds exactly `records` (a restart resumed from a checkpoint)."""

    records: list[dict]


@dataclass
class WorkerFailed:
    rank: int
    reason: str
    retry: bool  # False: another attempt would fail the same way


Event = WorkersStarted | RunStarted | CheckpointSaved | Records | RankRecord | Rewound | WorkerFailed


@dataclass
class Outcome:
    summary: dict | None
    error: dict | None
    attempts: int
    resumed_from: int | None
    workers_started: bool


class EventLog:
    """The events the driver has yet to read. The driver asks for the events from a cursor on,
    which says it holds every event before it: those are dropped, or a long run logging every
    step would pile up all its records here."""

    def __init__(self):
        self.events: list[Any] = []
        self.dropped = 0  # events before self.events[0]

    def append(self, event: Any) -> None:
        self.events.append(event)

    def since(self, cursor: int) -> tuple[list[Any], int]:
        """The events from `cursor` on, and the cursor after them."""
        if cursor > self.dropped:
            del self.events[: cursor - self.dropped]
            self.dropped = cursor
        return self.events[cursor - self.dropped :], self.dropped + len(self.events)


class RunState:
    """The run's state, as an actor (`RunStateActor`, beside a driver) or as the part of the
    service's attempt controller (`orchestrator.attempt_controller`) that the workers call."""

    def __init__(self):
        yield_to_training()  # this actor's calls run on this thread
        self.groups: list[str] = []  # placement group id of each attempt, in order
        self.workers: dict[int, dict[int, dict]] = {}  # attempt -> rank -> worker
        self.events = EventLog()  # what the driver reads, in order
        self.summary: dict | None = None
        self.error: dict | None = None
        self.resumed_from: int | None = None
        self.stop: str | None = None  # a stop request: its reason
        self.fitting = False  # fit() runs (its thread drives Ray Train's controller loop)

    def _current(self, attempt: int) -> bool:
        return attempt == len(self.groups) - 1

    # -- called by the workers -----------------------------------------------------------

    def join(self, group: str, rank: int, world_size: int, pid: int, node: str, node_id: str) -> int:
        """A worker started; returns its attempt number (0 for the first start)."""
        if group not in self.groups:
            self.groups.append(group)
        attempt = self.groups.index(group)
        members = self.workers.setdefault(attempt, {})
        members[rank] = {"pid": pid, "node": node, "node_id": node_id}
        if len(members) == world_size:
            self.events.append(WorkersStarted(attempt, dict(sorted(members.items()))))
        return attempt

    def restore(self, attempt: int, history: list[dict], resumed: dict | None = None) -> None:
        """The run (re)started from a checkpoint holding `history`, or from scratch ([]);
        `resumed` says which checkpoint, and which newer ones were skipped as incomplete."""
        if not self._current(attempt):
            return
        resumed = resumed or {}
        # the checkpoint's own step: its log may end a few steps earlier, at the last logged one
        steps = [r["step"] for r in history if "step" in r]
        step = resumed["step"] if resumed.get("checkpoint") else max(steps, default=0)
        if attempt == 0:
            self.resumed_from = step
        self.events.append(Rewound(list(history)))
        self.events.append(RunStarted(attempt, step, resumed.get("checkpoint"), resumed.get("skipped") or []))

    def log(self, attempt: int, records: list[dict]) -> None:
        if self._current(attempt):  # else: from a worker group that has since been replaced
            self.events.append(Records(records))

    def log_rank(self, attempt: int, rank: int, record: dict) -> None:
        if self._current(attempt):
            self.events.append(RankRecord(rank, record))

    def checkpoint(self, attempt: int, step: int, uri: str) -> None:
        self.events.append(CheckpointSaved(step, uri))

    def fail(self, rank: int, reason: str, retry: bool) -> None:
        if self.error is None or (not retry and self.error["retry"]):
            self.error = {"rank": rank, "reason": reason, "retry": retry}
        self.events.append(WorkerFailed(rank, reason, retry))

    def fatal(self) -> str | None:
        """The reason of a failure not worth retrying, if there was one."""
        return self.error["reason"] if self.error and not self.error["retry"] else None

    def stop_requested(self) -> str | None:
        return self.stop

    def finish(self, summary: dict) -> None:
        self.summary = summary

    # -- called by the driver ----------------------------------------------------------------

    @ray.method(concurrency_group="fit")
    def fit(self, make_trainer) -> dict | None:
        """`make_trainer(state)`'s `fit()`, with this actor as the workers' state; how it failed
        (`describe_failure`), or None."""
        self.fitting = True
        try:
            make_trainer(ray.get_runtime_context().current_actor).fit()
        except BaseException as err:  # reported in the summary, with the workers' own reason
            return describe_failure(err)
        finally:
            self.fitting = False
        return None

    def request_stop(self, reason: str) -> None:
        """Ask the workers to checkpoint at the step they next learn of it, and stop."""
        self.stop = self.stop or reason

    def events_since(self, cursor: int) -> tuple[list[Any], int]:
        return self.events.since(cursor)

    def outcome(self) -> Outcome:
        return Outcome(self.summary, self.error, len(self.groups), self.resumed_from, bool(self.workers))


# fit() runs on a thread of its own; the workers' and the driver's calls on the default one
RUN_STATE_OPTIONS = dict(num_cpus=0, max_restarts=0)
RunStateActor = ray.remote(**RUN_STATE_OPTIONS, concurrency_groups={"fit": 1})(RunState)


@dataclass
class MetricsLog:
    """The driver's copy of the run's metrics log, kept from the events."""

    records: list[dict] = field(default_factory=list)
    changed: bool = False

    def apply(self, event: Any) -> None:
        if isinstance(event, Rewound):
            self.records = list(event.records)
            self.changed = True
        elif isinstance(event, Records):
            self.records.extend(event.records)
            self.changed = True


def describe_failure(err: BaseException) -> dict:
    """What the summary needs of a failed `fit()`, as plain data: the ranks that died, the
    error's first lines, and whether Ray gave up on a worker group (out of restarts)."""
    failures = getattr(err, "worker_failures", None) or {}  # WorkerGroupError: rank -> error
    # a dead worker shows up as a failed health check wrapping the actor's death
    died = [
        rank
        for rank, e in sorted(failures.items())
        if isinstance(getattr(e, "health_check_failure", e), ray.exceptions.RayActorError)
    ]
    lines = [line for line in str(err).splitlines() if line.strip()]
    return {
        "died": died,
        "text": " ".join(lines[:2]) if lines else type(err).__name__,
        "group": bool(failures),
    }
