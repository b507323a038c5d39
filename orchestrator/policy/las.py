"""Discretized least attained service (Tiresias' 2D-LAS) for queues with order `las` (or `las-share`).

Without runtimes, the best guess of which job ends first is the one that has run least:
DL training times are heavy-tailed, so a job that has received little service is likely
short. A job's attained service is its GPU-seconds (worker-seconds for a job without GPUs)
over all its attempts: `attained_s` (the finished attempts, carried by the service) plus the
current attempt's part, computed here from `started_at` and `now`. Thresholds cut it into a
few levels; level 0 goes first. Discretizing (instead of ordering by the exact service) keeps
two jobs of one level from preempting each other back and forth: within a level, order is
FIFO by first submission, and only a job of a strictly lower level preempts.

Rules, all within one priority level (strict priority between levels stays):

- Order: level, then (for jobs with a `user`) the user's total attained service in that
  queue, so users share it by service, then first submission, then id. Jobs of `fifo`
  queues count as level 0 with no user share.
- Demotion: a job's level follows its service, so it drops a level as it accumulates it.
- Promotion: a pending job that has waited since it last became pending for
  `starve_after_s`, and for `starve_factor` times the time it has run so far (Tiresias'
  STARVE_LIMIT: a job that has run long waits longer, which bounds the preemptions that
  promotions cause), is at level 0 again, ahead of later submissions there: nothing starves.
- Preemption: a head of a `las` queue may preempt running jobs of its own queue and
  priority whose level is strictly higher than its own and whose current attempt has run at
  least `min_run_s` (bounding each job to one preemption per `min_run_s` of running, so the
  stop-and-restart overhead stays bounded), and only once the head has waited `preempt_after_s`
  since it last became pending (`las-share`: an hour, issue 51: running jobs often make room by
  then, and each stop costs a checkpoint and a restart). A queue's `las` order is its jobs' consent to
  this: they need not be `preemptible`, which governs preemption by higher priorities only.
  Across queues, sharing is the business of cohorts (`cohorts.py`), not of LAS.

Tuning beyond the queue file's settings (`LasTuning`, off by default; `LAS_SHARE_SETTINGS`
and `LAS_SHARE_TUNING`, the order `las-share`, meet issue 34's targets on every Philly VC,
docs/scheduler.md; a queue file chooses them with `order: las-share`, `las_of`):

- Victims: `latest-submitted` takes, within the highest level, the job that is last in queue
  order (latest first submission) instead of the most recently started one, so the victims
  are those the order would start last, and the oldest jobs of a level keep running.
- Top share: the jobs of the top level (the longest served) of a queue and priority are
  entitled to `top_share` of the cluster's GPUs, oldest first (FIFO, as a level is). While
  they hold it, the entitled running ones are not LAS victims, and an entitled waiting one
  counts as promoted (level 0, holds its place). Without it, a burst of shorter jobs stops
  every long job at once, and promotion then shares the cluster among all long jobs, so
  none of them finishes (processor sharing is worst for the tail when the long jobs are
  alike); FIFO inside a guaranteed share lets the oldest finish. A job that would not fit
  even beside the protected jobs alone cannot be the head (`policy.py`, step 2): it could stop
  none of them, and as the head it held every GPU it needs idle, and kept the jobs behind it
  from stopping anyone, until they ended (issue 51: hundreds of hours on `11cb48` at 35 GPUs).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import total_ordering
from typing import Literal

from core.queues import LAS_SHARE_DEFAULTS, LasSettings, QueueConfig, QueueNames
from orchestrator.policy.types import Allocation, JobRequest


def service_rate(per_worker: Mapping[str, float], workers: int) -> float:
    """Service per second of running: GPUs held, or workers for a job without GPUs."""
    gpus = per_worker.get("GPU", 0.0) * workers
    return gpus if gpus > 0 else float(workers)


def attained(allocation: Allocation, now: float) -> float:
    """Service over all attempts of a running job, this one included."""
    return _served(allocation, now)[0]


def _served(allocation: Allocation, now: float) -> tuple[float, float]:
    workers = sum(allocation.placement.values())
    rate = allocation.per_worker.get("GPU", 0.0) * workers or float(workers)  # as `service_rate`
    return allocation.attained_s + max(0.0, now - allocation.started_at) * rate, rate


Served = Mapping[str, tuple[float, float]]  # job id -> (attained service, service per second)

VictimOrder = Literal["recently-started", "latest-submitted"]


@dataclass(frozen=True)
class LasTuning:
    """LAS knobs that the queue file does not carry (yet): see the module docstring."""

    victims: VictimOrder = "recently-started"
    top_share: float = 0.0  # of the cluster's GPUs, for the top level's oldest jobs; 0: none

    def __post_init__(self) -> None:
        if not 0.0 <= self.top_share <= 1.0:
            raise ValueError(f"top_share must be within [0, 1], got {self.top_share}")


# Issue 34: the order that meets every target on the ten Philly VCs (docs/scheduler.md)
# (its `las:` values live in core/queues.py: the queue file fills them in for `order: las-share`)
LAS_SHARE_SETTINGS = LasSettings(**LAS_SHARE_DEFAULTS)
LAS_SHARE_TUNING = LasTuning(victims="latest-submitted", top_share=0.4)


def las_of(config: QueueConfig, tuning: LasTuning | None = None) -> Las | None:
    """The LAS of a queue config's LAS queues (None: it has none; every queue it does not list
    has its `order`), tuned as `las-share` when its queues are; an explicit `tuning` wins (the
    benchmarks try tunings the file cannot name)."""
    queues = config.las_queues()
    if not queues:
        return None
    if tuning is None and config.las_share():
        tuning = LAS_SHARE_TUNING
    return Las(config.las, queues, tuning)


@total_ordering
class _Later:
    """Sorts the later (submission time, id) first: victims in reverse queue order."""

    __slots__ = ("key",)

    def __init__(self, key: tuple[float, str]) -> None:
        self.key = key

    def __lt__(self, other: _Later) -> bool:
        return self.key > other.key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Later) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)


def _submitted(allocation: Allocation) -> float:
    """When a running job was first submitted (its start where the caller does not say)."""
    return allocation.started_at if allocation.submitted_at is None else allocation.submitted_at


class Las:
    """LAS levels, order, victims and wake-up times for the `las` queues of one config."""

    def __init__(
        self, settings: LasSettings, queues: Iterable[str] | QueueNames, tuning: LasTuning | None = None
    ) -> None:
        self.thresholds = list(settings.thresholds_gpu_s)
        self.starve_after_s = settings.starve_after_s
        self.starve_factor = settings.starve_factor
        self.min_run_s = settings.min_run_s
        self.preempt_after_s = settings.preempt_after_s
        # `in` is all it asks; every queue but some when LAS is the default order
        self.queues = queues if isinstance(queues, QueueNames) else frozenset(queues)
        self.tuning = tuning or LasTuning()
        # the top share's verdicts of the current pass (`begin_pass`; the policy runs one pass
        # at a time), as job ids
        self.protected: frozenset[str] = frozenset()  # running: not LAS victims
        self.lifted: frozenset[str] = frozenset()  # waiting: promoted

    def begin_pass(
        self, pending: Iterable[JobRequest], running: Iterable[Allocation], capacity: float, served: Served
    ) -> None:
        """Which top-level jobs the top share protects or lifts in this pass (see the module
        docstring). `capacity`: the cluster's GPUs (its service per second when all is held)."""
        self.protected = self.lifted = frozenset()
        if not self.tuning.top_share or capacity <= 0:
            return
        protected, lifted = set(), set()
        for members in self._top_level(pending, running, served).values():
            left = self.tuning.top_share * capacity
            for _, job_id, rate, is_running in sorted(members):  # oldest first, as the level's order
                if rate > left + 1e-9:
                    break
                left -= rate
                (protected if is_running else lifted).add(job_id)
        self.protected, self.lifted = frozenset(protected), frozenset(lifted)

    def _top_level(
        self, pending: Iterable[JobRequest], running: Iterable[Allocation], served: Served
    ) -> dict[tuple[str, int], list[tuple[float, str, float, bool]]]:
        """(queue, priority) -> its jobs at the top level: (first submission, id, service per
        second, running), the running ones not stopping."""
        top = len(self.thresholds)
        groups: dict[tuple[str, int], list[tuple[float, str, float, bool]]] = {}
        held = set()
        for allocation in running:
            held.add(allocation.job_id)
            found = served.get(allocation.job_id)
            if found is not None and not allocation.stopping and self.level(found[0]) >= top:
                member = (_submitted(allocation), allocation.job_id, found[1], True)
                groups.setdefault((allocation.queue, allocation.priority), []).append(member)
        for job in pending:  # (a running job the service still lists as pending counts once)
            if job.queue in self.queues and job.id not in held and self.level(job.attained_s) >= top:
                member = (job.submitted_at, job.id, service_rate(job.per_worker, job.workers), False)
                groups.setdefault((job.queue, job.priority), []).append(member)
        return groups

    def level(self, service: float) -> int:
        return bisect_right(self.thresholds, service)

    def served(self, running: Iterable[Allocation], now: float) -> dict[str, tuple[float, float]]:
        """The service of every running job of a `las` queue, computed once per pass."""
        return {a.job_id: _served(a, now) for a in running if a.queue in self.queues}

    def _service(self, allocation: Allocation, now: float, served: Served) -> tuple[float, float]:
        found = served.get(allocation.job_id)
        return found if found is not None else _served(allocation, now)

    def promoted_at(self, job: JobRequest) -> float:
        """When a waiting job is promoted to level 0 (see the module docstring)."""
        since = job.submitted_at if job.queued_since is None else job.queued_since
        if not job.attained_s:
            return since + self.starve_after_s
        run_s = job.attained_s / (job.per_worker.get("GPU", 0.0) * job.workers or job.workers)
        return since + max(self.starve_after_s, self.starve_factor * run_s)

    def preempts_at(self, job: JobRequest) -> float:
        """When a waiting job may start stopping LAS victims (`preempt_after_s` after it last
        became pending: running jobs often make room by then, and each stop costs a restart)."""
        since = job.submitted_at if job.queued_since is None else job.queued_since
        return since + self.preempt_after_s

    def promoted(self, job: JobRequest, now: float) -> bool:
        return job.id in self.lifted or now >= self.promoted_at(job)

    def pending_level(self, job: JobRequest, now: float) -> int:
        if job.queue not in self.queues or self.promoted(job, now):
            return 0
        return self.level(job.attained_s)

    def pending_levels(self, pending: Iterable[JobRequest], now: float) -> dict[str, int]:
        """`pending_level` of every job of a pass, once (the hot path: inlined, same result)."""
        queues, thresholds, starve_before = self.queues, self.thresholds, now - self.starve_after_s
        lifted = self.lifted
        levels = {}
        for job in pending:
            if job.queue not in queues or job.id in lifted:
                levels[job.id] = 0
                continue
            since = job.submitted_at if job.queued_since is None else job.queued_since
            if since > starve_before or now < self.promoted_at(job):
                levels[job.id] = bisect_right(thresholds, job.attained_s)
            else:
                levels[job.id] = 0
        return levels

    def order(
        self,
        pending: Iterable[JobRequest],
        running: Iterable[Allocation],
        now: float,
        first: set[str] = frozenset(),
        served: Served | None = None,
        levels: Mapping[str, int] | None = None,
    ) -> list[JobRequest]:
        """Pending jobs in queue order with LAS levels and user shares inside each priority;
        jobs of the `first` queues (cohort queues below their nominal quota) lead each priority."""
        pending = list(pending)
        users: dict[tuple[str, str], float] = {}
        for job in pending:
            if job.user is not None and job.queue in self.queues:
                key = (job.queue, job.user)
                users[key] = users.get(key, 0.0) + job.attained_s
        served = self.served(running, now) if served is None else served
        for allocation in running:
            if allocation.user is not None and allocation.queue in self.queues:
                key = (allocation.queue, allocation.user)
                users[key] = users.get(key, 0.0) + self._service(allocation, now, served)[0]

        levels = self.pending_levels(pending, now) if levels is None else levels

        def key(job: JobRequest) -> tuple:
            share = users.get((job.queue, job.user), 0.0) if job.user is not None else 0.0
            lead = job.queue not in first
            return (-job.priority, lead, levels[job.id], share, job.submitted_at, job.id)

        return sorted(pending, key=key)

    def may_pass(self, job: JobRequest, head: JobRequest, now: float) -> bool:
        """Whether `job` may start ahead of the waiting `head` in resources not promised to it.

        Yes within the `las` queues of one priority, unless the head is starving (promoted):
        LAS is work-conserving, as Tiresias is; a head that has waited `starve_after_s` holds
        its reservation, so nothing passes it any more and it starts as running jobs end.
        """
        return (
            job.queue in self.queues
            and head.queue in self.queues
            and job.priority == head.priority
            and not self.promoted(head, now)
        )

    def eligible(self, head: JobRequest, now: float, served: Served | None = None):
        """The running jobs that `head` may preempt by LAS (see the module docstring).
        `served`: `self.served(running, now)` if the caller has it (it saves work)."""
        served = served or {}
        if head.queue not in self.queues or now < self.preempts_at(head):
            return None
        head_level = self.pending_level(head, now)
        protected = self.protected

        def may_preempt(allocation: Allocation) -> bool:
            return (
                allocation.queue == head.queue
                and allocation.priority == head.priority
                and not allocation.stopping
                and now - allocation.started_at >= self.min_run_s
                and allocation.job_id not in protected
                and self.level(self._service(allocation, now, served)[0]) > head_level
            )

        return may_preempt

    def rank(self, now: float, served: Served | None = None):
        """Victim order: the highest level first, then the most recently started (or, tuned
        `latest-submitted`, the last in queue order)."""
        served = served or {}
        by_submission = self.tuning.victims == "latest-submitted"

        def victim_rank(allocation: Allocation) -> tuple:
            level = self.level(self._service(allocation, now, served)[0])
            if by_submission:
                return (-level, _Later((_submitted(allocation), allocation.job_id)))
            return (-level, -allocation.started_at, allocation.job_id)

        return victim_rank

    def wake_at(
        self,
        waiting: Iterable[JobRequest],
        running: Iterable[Allocation],
        now: float,
        served: Served | None = None,
        levels: Mapping[str, int] | None = None,
    ) -> float | None:
        """When a pass could decide otherwise with no event; None if nothing can change.

        A waiting job is promoted; or a running job of a queue and priority with jobs waiting
        at a lower level becomes a possible victim: its minimum run time ends, or it passes the
        threshold above the lowest waiting level. (Nothing else changes a LAS decision, so the
        service, or a simulator, need not pass more often than that.)
        """
        served = served or {}
        times, lowest = [], {}  # (queue, priority) -> the lowest level among its waiting jobs
        waiting = list(waiting)
        levels = self.pending_levels(waiting, now) if levels is None else levels
        for job in waiting:
            if job.queue not in self.queues:
                continue
            level = levels[job.id]
            if level:  # not promoted (yet)
                times.append(self.promoted_at(job))
            if self.preempt_after_s:
                times.append(self.preempts_at(job))
            key = (job.queue, job.priority)
            if level < lowest.get(key, len(self.thresholds) + 1):
                lowest[key] = level
        for allocation in running:
            floor = lowest.get((allocation.queue, allocation.priority))
            if floor is None or allocation.stopping:
                continue
            service, rate = self._service(allocation, now, served)
            eligible_at = allocation.started_at + self.min_run_s
            if self.level(service) <= floor:  # it becomes a victim once it passes the next threshold
                if floor >= len(self.thresholds):
                    continue
                eligible_at = max(eligible_at, now + (self.thresholds[floor] - service) / rate)
            times.append(eligible_at)
        later = [t for t in times if t > now + 1e-6]
        return min(later, default=None)
