"""Plain FIFO, the baseline the policy is measured against (`bench/scheduler_sim.py`)."""

from __future__ import annotations

from collections.abc import Iterable
from operator import attrgetter

from orchestrator.policy.admission import free_capacity, oversize_reason, oversize_why
from orchestrator.policy.queue import QuotaBook, quota_reason
from orchestrator.policy.room import Shape, View, at_sizes
from orchestrator.policy.types import Allocation, Decision, JobRequest, Node

DEFAULT_GROW_AFTER_S = 120.0  # unused: the signature matches `Policy`'s


class FifoPolicy:
    """Plain FIFO for comparison: submission order, no priorities, backfill or preemption.

    Jobs start in submission order until the first that cannot start; everything behind it
    waits. An elastic job starts at the largest of its sizes that fits, and waits for its
    smallest; running jobs are never resized. Same interface as `Policy` (the backfill,
    preemption and grow switches are ignored).
    """

    def __init__(
        self,
        nodes: list[Node],
        quotas: dict[str, dict[str, float]] | None = None,
        backfill: bool = False,
        preemption: bool = False,
        backfill_window: int = 0,
        grow_after_s: float = DEFAULT_GROW_AFTER_S,
    ) -> None:
        self.quotas = {q: dict(limits) for q, limits in (quotas or {}).items()}
        self.set_nodes(nodes)

    def set_nodes(self, nodes: Iterable[Node]) -> None:
        self.nodes = list(nodes)
        self._oversize: dict[Shape, str | None] = {}

    def rejection_reason(self, job: JobRequest) -> str | None:
        smallest = job.at_size(job.allowed_sizes()[-1])
        return oversize_reason(smallest, self.nodes) or quota_reason(smallest, self.quotas)

    def schedule(self, now: float, pending: list[JobRequest], running: list[Allocation]) -> Decision:
        running = list(running)
        free = View(free_capacity(self.nodes, running))
        quotas = QuotaBook(self.quotas, running)
        running_ids = {allocation.job_id for allocation in running}
        decision = Decision()
        for job in sorted(pending, key=attrgetter("submitted_at", "id")):
            if job.id in running_ids:
                continue
            sized = at_sizes(job)
            smallest, shape = sized[-1]
            if shape not in self._oversize:
                self._oversize[shape] = oversize_why(smallest, self.nodes)
            if self._oversize[shape] is not None:
                # it can never start here: skipping it keeps the queue from stalling for good
                why = self._oversize[shape]
                decision.notes[job.id] = f"cannot start on the cluster as it is now: it {why}"
                continue
            if not quotas.allows(smallest):
                decision.notes[job.id] = quotas.note(smallest)
                break
            for request, request_shape in sized:  # largest first
                placement = free.place(request, request_shape) if quotas.allows(request) else None
                if placement is not None:
                    break
            if placement is None:
                decision.notes[job.id] = "next in line (FIFO): waiting for resources"
                break
            free.take(placement, job.per_worker)
            quotas.charge(request)
            decision.admit.append((job.id, placement))
        return decision
