"""Elastic jobs within a pass: what a resize leads to, and growing into free room.

A resize is a checkpointed stop and a new admission, so a pass keeps one only when its own
next pass would start the job again at no less than the new size (`Resizes._come_back`).
`Resizes` is the part of `policy._Pass` that does this; it reads the pass's state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from orchestrator.policy.admission import place
from orchestrator.policy.queue import QuotaBook
from orchestrator.policy.room import at_sizes, released, take
from orchestrator.policy.types import Allocation, JobRequest, Resources


def requeued(allocation: Allocation) -> JobRequest:
    """A running elastic job as the pending job it becomes once stopped for a resize (the
    service requeues it with all its sizes)."""
    return JobRequest(
        allocation.job_id,
        allocation.priority,
        allocation.sizes[0] if allocation.sizes else allocation.workers,
        allocation.per_worker,
        allocation.started_at,
        allocation.preemptible,
        allocation.queue,
        sizes=allocation.sizes,
        avoid_nodes=allocation.avoid_nodes,
    )


def return_order(allocation: Allocation) -> tuple[int, float, str]:
    """Queue order of stopped jobs coming back: priority, then the longest running (as submitted)."""
    return (-allocation.priority, allocation.started_at, allocation.job_id)


class Resizes:
    """What a resize leads to, and growing (mixed into `policy._Pass`)."""

    def _next_pass(
        self, job: JobRequest | None, future: Mapping[str, Resources], returning: list[Allocation]
    ) -> tuple[dict[str, int] | None, dict[str, Resources], dict[str, int]]:
        """What the next pass starts once `returning` have stopped and are pending again.

        `future`: the free resources per node by then. The head `job` (if any) goes first at
        the largest size that fits, then the returning elastic jobs in queue order, each at the
        largest size that fits (and fits its queue's quota), as a pass admits them. Returns the
        head's placement (None: it does not fit), what is left free per node, and the size each
        returning job starts at (0: none).
        """
        room = {node_id: dict(node_free) for node_id, node_free in future.items()}
        book = self._quota_book(allocation.job_id for allocation in returning)
        head_placement = None
        if job is not None:
            sized = at_sizes(job)
            for index, (request, _) in enumerate(sized):
                # its smallest size passed the quota check of this pass already
                if index < len(sized) - 1 and not book.allows(request):
                    continue
                head_placement = place(request, room)
                if head_placement is not None:
                    take(room, head_placement, job.per_worker)
                    book.charge(request)
                    break
        started: dict[str, int] = {}
        for allocation in sorted(returning, key=return_order):
            started[allocation.job_id] = 0
            for request, _ in at_sizes(requeued(allocation)):
                placement = place(request, room) if book.allows(request) else None
                if placement is not None:
                    take(room, placement, allocation.per_worker)
                    book.charge(request)
                    started[allocation.job_id] = request.workers
                    break
        return head_placement, room, started

    def _quota_book(self, leaving: Iterable[str]) -> QuotaBook:
        """Quota use of the jobs that hold resources after this pass, less those in `leaving`."""
        if not self.policy.quotas:
            return QuotaBook(None)
        leaving = set(leaving)
        return QuotaBook(self.policy.quotas, [a for a in self.held if a.job_id not in leaving])

    def _come_back(
        self, head: JobRequest | None, plan: Mapping[str, int], by_id: Mapping[str, Allocation]
    ) -> bool:
        """True when, after stopping for this resize plan, every job in it starts again at no
        less than its planned size next to the head (see `_next_pass`)."""
        resized = [by_id[job_id] for job_id in plan]
        _, _, started = self._next_pass(head, released(self.free.by_node, resized), resized)
        return all(started[job_id] >= size for job_id, size in plan.items())

    def _grow(self, blocked_queues: set[str]) -> None:
        """Grow running elastic jobs into the free room (nothing waits; see the module docstring).

        Each job grows to the largest size that fits into its own placement plus what is still
        free after this pass's starts and the grows before it, so no free room is promised to
        two jobs; a grow is kept only if the job would start again at that size (`_come_back`)
        and it leaves its queue within its quota.
        """
        now, grow_after_s = self.now, self.policy.grow_after_s
        elastic = [a for a in self.running if a.elastic]
        if not elastic or any(a.stopping for a in self.running):  # a stopping job comes back first
            return
        candidates = sorted(
            (
                a
                for a in elastic
                if a.queue not in blocked_queues
                and not a.starting  # it grows once it has run at its size
                and now - a.started_at >= grow_after_s
                and a.workers < a.sizes[0]
                and all(node_id in self.free.by_node for node_id in a.placement)  # none on a node gone
            ),
            key=return_order,
        )
        by_id = {a.job_id: a for a in candidates}
        room = {node_id: dict(node_free) for node_id, node_free in self.free.by_node.items()}
        for allocation in candidates:
            avail = released(room, [allocation])
            request = requeued(allocation)
            for size in (size for size in allocation.sizes if size > allocation.workers):
                extra = request.at_size(size - allocation.workers)  # what the queue's quota must hold
                if not self._quota_allows(extra):
                    continue
                placement = place(request.at_size(size), avail)
                plan = {**self.decision.resize, request.id: size}
                if placement is None or not self._come_back(None, plan, by_id):
                    continue
                self.decision.resize[request.id] = size
                self.quotas.charge(extra)
                if self.cohorts is not None:
                    self.cohorts.charge(extra)
                take(avail, placement, allocation.per_worker)
                room = avail
                break
