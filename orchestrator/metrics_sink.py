"""The driver-owned actor that carries per-step metrics, checkpoints and the outcome of a run.

`ray.train.report()` is a barrier that can block for seconds in Ray Train V2, so the workers
use it only to register checkpoints. Everything else goes to this actor: rank 0 sends its
metrics records in batches, fire-and-forget (the call returns at once), and the driver polls
the actor to print progress and keep `metrics.jsonl` in storage up to date.

Each start of the worker group is an *attempt*; Ray Train restarts the whole group after a
failure, and every group has a placement group of its own, so a new placement group id
means a new attempt. Records are tagged with their attempt, so a late record from a dead
worker can never land in the log after the restarted run rewound it to its checkpoint.
"""

from __future__ import annotations

from typing import Any

import ray


@ray.remote(num_cpus=0)
class MetricsSink:
    def __init__(self):
        self.groups: list[str] = []  # placement group id of each attempt, in order
        self.workers: dict[int, dict[int, dict]] = {}  # attempt -> rank -> {pid, node}
        self.records: list[dict] = []  # the metrics log as it stands
        self.version = 0  # bumped whenever `records` changes
        self.events: list[tuple] = []  # what the driver prints, in order
        self.summary: dict | None = None
        self.error: dict | None = None
        self.resumed_from: int | None = None

    # -- called by the workers -----------------------------------------------------------

    def join(self, group: str, rank: int, world_size: int, pid: int, node: str) -> int:
        """A worker started; returns its attempt number (0 for the first start)."""
        if group not in self.groups:
            self.groups.append(group)
        attempt = self.groups.index(group)
        members = self.workers.setdefault(attempt, {})
        members[rank] = {"pid": pid, "node": node}
        if len(members) == world_size:
            self.events.append(("workers", attempt, dict(sorted(members.items()))))
        return attempt

    def restore(self, attempt: int, history: list[dict]) -> None:
        """The run (re)started from a checkpoint holding `history`, or from scratch ([])."""
        if attempt != len(self.groups) - 1:
            return
        self.records = list(history)
        self.version += 1
        steps = [r["step"] for r in history if "step" in r]
        step = max(steps) if steps else 0
        if attempt == 0:
            self.resumed_from = step
        self.events.append(("start", attempt, step))

    def log(self, attempt: int, records: list[dict]) -> None:
        if attempt != len(self.groups) - 1:
            return  # from a worker group that has since been replaced
        self.records.extend(records)
        self.version += 1
        self.events.extend(("record", r) for r in records)

    def checkpoint(self, attempt: int, step: int, uri: str) -> None:
        self.events.append(("checkpoint", step, uri))

    def fail(self, rank: int, reason: str, retry: bool) -> None:
        """A worker failed; `retry` False means another attempt would fail the same way."""
        if self.error is None or (not retry and self.error["retry"]):
            self.error = {"rank": rank, "reason": reason, "retry": retry}

    def fatal(self) -> str | None:
        """The reason of a failure not worth retrying, if there was one."""
        return self.error["reason"] if self.error and not self.error["retry"] else None

    def finish(self, summary: dict) -> None:
        self.summary = summary

    # -- called by the driver ----------------------------------------------------------------

    def poll(self, cursor: int, version: int) -> dict[str, Any]:
        """Events after `cursor`, and the whole log if it changed since `version`."""
        return {
            "events": self.events[cursor:],
            "cursor": len(self.events),
            "records": self.records if self.version != version else None,
            "version": self.version,
        }

    def outcome(self) -> dict[str, Any]:
        return {
            "summary": self.summary,
            "error": self.error,
            "attempts": len(self.groups),
            "resumed_from": self.resumed_from,
        }
