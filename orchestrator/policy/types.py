"""The values the scheduling policy reads and returns; plain data, no behaviour beyond checks.

Resources are plain dicts from a resource name to an amount (`{"GPU": 1, "CPU": 8}`); names
are arbitrary strings, as in Ray, so a custom resource stands in for a GPU in tests. The
helpers that do arithmetic on them live in `admission.py`.

An elastic job may run at any of several worker counts (`sizes`, largest first: the counts at
which its global batch splits evenly); a job of one size has `sizes == ()`. `allowed_sizes()`
gives the counts to try either way, so the policy treats both alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

Resources = dict[str, float]


def _check_sizes(what: str, sizes: tuple[int, ...], workers: int | None = None) -> None:
    """Sizes are worker counts >= 1, strictly descending; the first is the job's largest size."""
    if any(not isinstance(size, int) or size < 1 for size in sizes):
        raise ValueError(f"{what}: sizes must be worker counts >= 1, got {sizes}")
    if any(a <= b for a, b in zip(sizes, sizes[1:])):
        raise ValueError(f"{what}: sizes must be in descending order without repeats, got {sizes}")
    if workers is not None and sizes and sizes[0] != workers:
        raise ValueError(f"{what}: the first size must be workers ({workers}), the largest; got {sizes}")


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
    `sizes`: an elastic job's allowed worker counts, descending, the first being `workers`
    (its largest size); () for a job that runs at `workers` only.

    Read only by queues configured with order `las` or a cohort (`las.py`, `cohorts.py`):
    `user`, who submitted it (users of one queue share it by attained service);
    `attained_s`, the service it received in earlier attempts (GPU-seconds, or worker-seconds
    for a job without GPUs; the service adds up its finished attempts); `queued_since`, when
    it last became pending (None: `submitted_at`), from which a starving job is promoted.

    `avoid_nodes`: node ids the job must not be placed on (the service adds the node of a
    straggler it restarted the job away from, `fault_tolerance.on_straggler`); placement skips
    them, and every cache of placement verdicts keys on them (`room.shape_of`).
    """

    id: str
    priority: int
    workers: int
    per_worker: Resources
    submitted_at: float
    preemptible: bool = False
    queue: str = "default"
    est_runtime_s: float | None = None
    sizes: tuple[int, ...] = ()
    user: str | None = None
    attained_s: float = 0.0
    queued_since: float | None = None
    avoid_nodes: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        self.avoid_nodes = frozenset(self.avoid_nodes)
        if self.workers < 1:
            raise ValueError(f"job {self.id}: workers must be >= 1, got {self.workers}")
        _check_resources(f"job {self.id}", self.per_worker)
        if self.est_runtime_s is not None and not self.est_runtime_s >= 0:
            raise ValueError(f"job {self.id}: est_runtime_s must be >= 0, got {self.est_runtime_s}")
        if not self.attained_s >= 0:
            raise ValueError(f"job {self.id}: attained_s must be >= 0, got {self.attained_s}")
        if self.sizes:
            self.sizes = tuple(self.sizes)
            _check_sizes(f"job {self.id}", self.sizes, self.workers)

    def allowed_sizes(self) -> tuple[int, ...]:
        """The worker counts it may start at, largest first (`(workers,)` for a job of one size)."""
        return self.sizes or (self.workers,)

    def at_size(self, workers: int) -> JobRequest:
        """The same job as a job of one size, `workers` workers: what placement and quotas see."""
        if workers == self.workers and not self.sizes:
            return self
        return replace(self, workers=workers, sizes=())

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

    `stopping` marks a job that was told to stop (a preemption victim, or a job being resized)
    and still holds its resources until it has stopped. `est_end` is when it is expected to
    finish, if known. `sizes`: an elastic job's allowed worker counts, descending (as in
    `JobRequest`); its current size is `workers`. () for a job of one size. `user` and
    `attained_s` as in `JobRequest`: service of the attempts before this one (the policy adds
    this attempt's part from `started_at`). `avoid_nodes` as in `JobRequest`: where it may not
    go when it starts again (after a resize). `starting`: admitted, its workers not training
    yet; such a job is neither grown nor moved (it has not run at its size, where it is).
    `submitted_at`: its first submission, as in `JobRequest` (None: unknown; LAS then takes
    `started_at`, where a tuned order needs it: `las.LasTuning`).
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
    sizes: tuple[int, ...] = ()
    user: str | None = None
    attained_s: float = 0.0
    avoid_nodes: frozenset[str] = frozenset()
    starting: bool = False
    submitted_at: float | None = None

    def __post_init__(self) -> None:
        self.avoid_nodes = frozenset(self.avoid_nodes)
        if self.sizes:
            self.sizes = tuple(self.sizes)
            _check_sizes(f"allocation {self.job_id}", self.sizes)

    @property
    def workers(self) -> int:
        return sum(self.placement.values())

    @property
    def elastic(self) -> bool:
        """True when it may run at another size (it can be shrunk or grown)."""
        return len(self.sizes) > 1

    def total(self) -> Resources:
        return {name: amount * self.workers for name, amount in self.per_worker.items()}


@dataclass
class Decision:
    """What one scheduling pass decided.

    - `admit`: jobs to start now, in queue order, each with its placement (node id -> workers).
    - `preempt`: running jobs to stop so that `reserved_for` can start once they have stopped;
      with `moving`, they only move: each fits again elsewhere once it has stopped (`defrag.py`).
    - `resize`: running elastic jobs to restart at another size (job id -> that size): smaller
      to make room for `reserved_for` (then nothing is in `preempt`), or larger to use free
      room when no job waits. A resize is a checkpointed stop followed by re-admission.
    - `reserved_for`: the job waiting for victims (chosen now or still stopping, preempted or
      shrunk); nothing else is placed into the resources promised to it.
    - `head`, `head_start`: the first job that could not start and holds a backfill
      reservation, and when it is expected to start by the runtime estimates (None: unknown).
    - `notes`: why a pending job did not start, for people (`orchestrator` CLI); only for the
      jobs this pass looked at (those ahead of the head, the head, and the backfill window).
    - `wake_at`: the earliest time at which a pass could decide otherwise with no new event (a
      running job's minimum run time ends, a waiting job is promoted); None: only on events.
      The service passes every second anyway; a simulator schedules a pass then.
    """

    admit: list[tuple[str, dict[str, int]]] = field(default_factory=list)
    preempt: list[str] = field(default_factory=list)
    moving: bool = False
    resize: dict[str, int] = field(default_factory=dict)
    reserved_for: str | None = None
    notes: dict[str, str] = field(default_factory=dict)
    head: str | None = None
    head_start: float | None = None
    wake_at: float | None = None
