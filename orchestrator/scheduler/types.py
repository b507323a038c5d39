"""The values the scheduling policy reads and returns; plain data, no behaviour beyond checks.

Resources are plain dicts from a resource name to an amount (`{"GPU": 1, "CPU": 8}`); names
are arbitrary strings, as in Ray, so a custom resource stands in for a GPU in tests. The
helpers that do arithmetic on them live in `admission.py`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

Resources = dict[str, float]


def _check_resources(what: str, resources: Resources) -> None:
    for name, amount in resources.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"{what}: resource names must be non-empty strings, got {name!r}")
        if not math.isfinite(amount) or amount < 0:
            raise ValueError(f"{what}: {name} must be a finite amount >= 0, got {amount!r}")


@dataclass
class JobRequest:
    """A job waiting to run: `workers` workers, each needing all of `per_worker` on one node.

    `submitted_at` is the time of the first submission: the service keeps it when it requeues
    a preempted job, which is what gives a requeued job its place in the queue back (aging).
    `est_runtime_s` is the estimated remaining runtime, when the user gave one.
    """

    id: str
    priority: int
    workers: int
    per_worker: Resources
    submitted_at: float
    preemptible: bool = False
    queue: str = "default"
    est_runtime_s: float | None = None

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"job {self.id}: workers must be >= 1, got {self.workers}")
        _check_resources(f"job {self.id}", self.per_worker)
        if self.est_runtime_s is not None and not self.est_runtime_s >= 0:
            raise ValueError(f"job {self.id}: est_runtime_s must be >= 0, got {self.est_runtime_s}")

    def total(self) -> Resources:
        """Everything the job holds once started: `workers` x `per_worker`."""
        return {name: amount * self.workers for name, amount in self.per_worker.items()}


@dataclass
class Node:
    """A machine of the cluster and what it offers in total (free or not)."""

    id: str
    capacity: Resources

    def __post_init__(self) -> None:
        _check_resources(f"node {self.id}", self.capacity)


@dataclass
class Allocation:
    """A running job (or one being stopped) and where its workers are: node id -> workers.

    `stopping` marks a job that was told to stop (a preemption victim) and still holds its
    resources until it has stopped. `est_end` is when it is expected to finish, if known.
    """

    job_id: str
    priority: int
    placement: dict[str, int]
    per_worker: Resources
    started_at: float
    preemptible: bool = False
    queue: str = "default"
    est_end: float | None = None
    stopping: bool = False

    @property
    def workers(self) -> int:
        return sum(self.placement.values())

    def total(self) -> Resources:
        return {name: amount * self.workers for name, amount in self.per_worker.items()}


@dataclass
class Decision:
    """What one scheduling pass decided.

    - `admit`: jobs to start now, in queue order, each with its placement (node id -> workers).
    - `preempt`: running jobs to stop so that `reserved_for` can start once they have stopped.
    - `reserved_for`: the job waiting for victims (chosen now or still stopping); nothing else
      is placed into the resources promised to it.
    - `head`, `head_start`: the first job that could not start and holds a backfill
      reservation, and when it is expected to start by the runtime estimates (None: unknown).
    - `notes`: why a pending job did not start, for people (`orchestrator` CLI); only for the
      jobs this pass looked at (those ahead of the head, the head, and the backfill window).
    """

    admit: list[tuple[str, dict[str, int]]] = field(default_factory=list)
    preempt: list[str] = field(default_factory=list)
    reserved_for: str | None = None
    notes: dict[str, str] = field(default_factory=dict)
    head: str | None = None
    head_start: float | None = None
