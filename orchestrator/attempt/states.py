"""One attempt's states, the events that move it, and its progress: plain data, no Ray.

    Starting --the workers loaded their start (RunStarted)--> Training
    Starting --a worker fails before the first step--> Starting (Ray Train starts the group again)
    Training --a worker fails--> Restarting --the new group loaded the newest checkpoint--> Training
    Starting --stop, preempt or abort--> Aborting (no step to keep: ended at once)
    Training | Restarting --stop or preempt--> Stopping (checkpoint at the next step, then end)
    any but the ends --abort (the service requeued the job)--> Aborting
    any but Ended --the run returned, or was aborted--> Ended(summary)

As Ray Train V2's controller states: each state is a class and carries what is known in it
(`Training(start_step)`, `Stopping(request)`, `Ended(summary)`); `AttemptController._set_state`
is the only place that changes the current one, checked against `TRANSITIONS`. The job's states
across attempts (queued, admitted, running, ...) are the service's: `core/jobs.py`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from core import records

# -- states ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Starting:
    """The run's workers come up (Ray Train starts the group, loads the start)."""


@dataclass(frozen=True)
class Training:
    """The workers loaded their start and train: a stop checkpoints the steps they take."""

    start_step: int


@dataclass(frozen=True)
class Restarting:
    """A worker failed; Ray Train restarts the group from the newest complete checkpoint."""

    rank: int
    reason: str


@dataclass(frozen=True)
class Stopping:
    """Asked to checkpoint and stop ("stop"), or to yield its nodes ("preempt")."""

    request: str


@dataclass(frozen=True)
class Aborting:
    """Ended at once, without a checkpoint: `status` is stopped or preempted (before its first
    step) or aborted (the service requeued the job)."""

    status: str
    why: str


@dataclass(frozen=True)
class Ended:
    """The run is over; `summary["status"]` is the attempt's outcome."""

    summary: dict


State = Starting | Training | Restarting | Stopping | Aborting | Ended

TRANSITIONS: dict[type, set[type]] = {
    Starting: {Starting, Training, Aborting, Ended},
    Training: {Restarting, Stopping, Aborting, Ended},
    Restarting: {Restarting, Training, Stopping, Aborting, Ended},
    Stopping: {Aborting, Ended},
    Aborting: {Ended},
    Ended: set(),
}


class IllegalTransition(RuntimeError):
    pass


def check_transition(before: State, after: State) -> None:
    if type(after) not in TRANSITIONS[type(before)]:
        raise IllegalTransition(f"attempt: {name(before)} -> {name(after)} is not allowed")


def name(state: State | type) -> str:
    return (state if isinstance(state, type) else type(state)).__name__.lower()


# -- what the workers tell the attempt ------------------------------------------------------------


@dataclass
class WorkersStarted:
    group: int  # 0 for the first worker group, n for its n-th restart (or replacement)
    members: dict[int, dict]  # rank -> {"pid", "node", "node_id"}
    replica: int = 0  # its replica group (fault_tolerance.replica_groups)


@dataclass
class RunStarted:
    group: int
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
    durable: bool = False  # to the log in storage at once (a record a joined group lacks)


@dataclass
class RankRecord:
    """The newest record of a rank other than 0 (per-rank metrics; not logged)."""

    rank: int
    record: dict


@dataclass
class Rewound:
    """The log now holds exactly `records` (the group resumed from a checkpoint)."""

    records: list[dict]


@dataclass
class WorkerFailed:
    rank: int
    reason: str
    retry: bool  # False: another try would fail the same way


@dataclass
class GroupChanged:
    """One of the job's replica groups started, joined, healed from a peer, or was lost:
    `fields` (its "state" and when) update what the attempt shows of it."""

    group: int
    fields: dict


@dataclass
class StopRequested:
    """From the service (its reply to a report), or from the driver of `orchestrator run`:
    "stop", "preempt" or "abort", and why."""

    request: str
    reason: str | None = None


Event = (
    WorkersStarted
    | RunStarted
    | CheckpointSaved
    | Records
    | RankRecord
    | Rewound
    | WorkerFailed
    | GroupChanged
)


# -- progress -------------------------------------------------------------------------------------


@dataclass
class Progress:
    """What the attempt knows of its run, kept from the events: shown, logged and reported."""

    total_steps: int | None  # an epoch-based job learns it from its records
    last_step: int | None = None
    last_checkpoint: str | None = None
    checkpoint_step: int | None = None  # of the newest checkpoint (saved or resumed from)
    start_step: int | None = None  # where the current group started (None: not yet)
    start_time: float | None = None  # and when
    resumed_from: int | None = None  # the first group's start
    workers_started: bool = False
    restarts: int = 0
    step_times: list[tuple[float, int]] = field(default_factory=list)  # (time, step), newest 20
    ranks: dict[int, dict] = field(default_factory=dict)  # the newest record of each rank but 0
    workers: dict[int, dict] = field(default_factory=dict)  # rank -> where it runs, current group
    # with replica groups: group -> {"state", "nodes", "started_at", "joined_at", "healed_at", ...}
    replica_groups: dict[int, dict] = field(default_factory=dict)

    def apply(self, event: Any) -> None:
        if isinstance(event, WorkersStarted) and self.replica_groups:
            # one of several groups: its ranks after those of the groups before it
            self.workers_started = True
            size = len(event.members)
            self.workers.update({event.replica * size + r: where for r, where in event.members.items()})
        elif isinstance(event, WorkersStarted):
            self.workers_started, self.restarts = True, event.group
            self.ranks, self.workers = {}, dict(event.members)
            self.start_step = None  # until the group has loaded its start
        elif isinstance(event, RunStarted):
            self.checkpoint_step = self.start_step = self.last_step = event.step
            self.start_time = event.time
            if event.group == 0:
                self.resumed_from = event.step
        elif isinstance(event, CheckpointSaved):
            self.last_checkpoint, self.checkpoint_step = event.uri, event.step
        elif isinstance(event, GroupChanged) and event.fields.get("state") == "starting":
            self.replica_groups[event.group] = dict(event.fields)  # a new group: the lost one's past goes
        elif isinstance(event, GroupChanged):
            self.replica_groups.setdefault(event.group, {}).update(event.fields)
        elif isinstance(event, RankRecord):
            self.ranks[event.rank] = event.record
        elif isinstance(event, Records):
            for record in event.records:
                self.last_step = record.get("step", self.last_step)
                if records.is_train(record):
                    self.total_steps = record.get("total_steps") or self.total_steps
                    step_time = (record.get("time", time.time()), record["step"])
                    self.step_times = (self.step_times + [step_time])[-20:]

    @property
    def step_time_s(self) -> float | None:
        if len(self.step_times) < 2:
            return None
        (t0, s0), (t1, s1) = self.step_times[0], self.step_times[-1]
        return (t1 - t0) / (s1 - s0) if s1 > s0 else None

    def report(self) -> dict:
        """What the service's record takes of it."""
        return {
            "step": self.last_step,
            "total_steps": self.total_steps,
            "step_time_s": self.step_time_s,
            "checkpoint": self.last_checkpoint,
            "workers_started": self.workers_started,
            "restarts": self.restarts,
            "start_step": self.start_step,
            "start_time": self.start_time,
            "ranks": self.ranks,
            "workers": self.workers,  # where each rank runs: hang stacks, straggler nodes
            **self._groups_report(),
        }

    def _groups_report(self) -> dict:
        if not self.replica_groups:
            return {}
        return {"replica_groups": {str(g): dict(v) for g, v in sorted(self.replica_groups.items())}}
