"""Queue order of pending jobs, and per-queue quota accounting.

Order: strict priority (higher first), then age within a priority level (oldest
`submitted_at` first), then job id so that equal times still give one deterministic order.

Aging: a job's age counts from its first submission and never restarts. When a running job
is preempted or otherwise requeued, the service passes it back with its original
`submitted_at`, so it goes back to the place it had (ahead of everything submitted after
it) instead of the back of its level. Age never lifts a job above a higher priority level.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from operator import attrgetter

from orchestrator.policy.admission import EPS, format_resources
from orchestrator.policy.types import Allocation, JobRequest, Resources

Quotas = Mapping[str, Mapping[str, float]]


def queue_key(job: JobRequest) -> tuple[int, float, str]:
    """Sort key of the queue order: smaller goes first."""
    return (-job.priority, job.submitted_at, job.id)


def order_pending(pending: Iterable[JobRequest]) -> list[JobRequest]:
    """Pending jobs in queue order (the same as sorting by `queue_key`).

    Two stable sorts on C-level keys instead of one on a Python tuple key: about twice as
    fast on 10,000 jobs, and near-linear when the input is already in submission order.
    """
    ordered = sorted(pending, key=attrgetter("submitted_at", "id"))
    ordered.sort(key=attrgetter("priority"), reverse=True)  # reverse keeps the sort stable
    return ordered


def quota_reason(job: JobRequest, quotas: Quotas | None) -> str | None:
    """None when the job fits its queue's quota on its own; otherwise why it never can."""
    quota = (quotas or {}).get(job.queue)
    if quota is None:
        return None
    total = job.total()
    over = {name: total[name] for name, limit in quota.items() if total.get(name, 0.0) > limit + EPS}
    if not over:
        return None
    return (
        f"job {job.id} needs {format_resources(over)} but the quota of queue '{job.queue}'"
        f" is {format_resources({name: quota[name] for name in over})}"
    )


class QuotaBook:
    """What each queue with a quota holds, so that admissions never take it over the quota.

    Running and stopping jobs both count: a stopping job holds its resources until it stops.
    Queues without a quota are unlimited and not tracked.
    """

    def __init__(self, quotas: Quotas | None, allocations: Iterable[Allocation] = ()) -> None:
        self.quotas = {queue: dict(limits) for queue, limits in (quotas or {}).items()}
        self.used: dict[str, Resources] = {queue: {} for queue in self.quotas}
        self.reserved_for: dict[str, str] = {}
        for allocation in allocations:
            if allocation.queue in self.quotas:
                self._charge(allocation.queue, allocation.total())

    def allows(self, job: JobRequest) -> bool:
        quota = self.quotas.get(job.queue)
        if quota is None:
            return True
        used = self.used[job.queue]
        for name, limit in quota.items():
            need = job.per_worker.get(name, 0.0) * job.workers
            if need > 0 and used.get(name, 0.0) + need > limit + EPS:
                return False
        return True

    def charge(self, job: JobRequest) -> None:
        if job.queue in self.quotas:
            self._charge(job.queue, job.total())

    def reserve(self, job: JobRequest) -> None:
        """Hold the job's share of its queue's quota for it while it waits for resources."""
        if job.queue in self.quotas:
            self._charge(job.queue, job.total())
            self.reserved_for[job.queue] = job.id

    def add(self, allocation: Allocation, sign: int) -> None:
        """Count a running job's use in (+1) or out (-1): what-if checks before preempting."""
        if allocation.queue in self.quotas:
            total = allocation.total()
            self._charge(allocation.queue, {name: sign * amount for name, amount in total.items()})

    def _charge(self, queue: str, total: Resources) -> None:
        used = self.used[queue]
        for name, amount in total.items():
            used[name] = used.get(name, 0.0) + amount

    def note(self, job: JobRequest) -> str:
        """Why `allows(job)` is False, for people."""
        quota = self.quotas[job.queue]
        used = self.used[job.queue]
        total = job.total()
        short = [
            f"{total[name]:g} {name} with {used.get(name, 0.0):g} of {limit:g} in use"
            for name, limit in quota.items()
            if total.get(name, 0.0) > 0 and used.get(name, 0.0) + total[name] > limit + EPS
        ]
        held_for = self.reserved_for.get(job.queue)
        including = f" (including the share kept for job {held_for}, next in line)" if held_for else ""
        return f"quota of queue '{job.queue}' reached: needs {'; '.join(short)}{including}"
