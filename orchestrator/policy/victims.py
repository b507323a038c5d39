"""Whom a pass stops for its head: the reasons to preempt, in order, and reclaiming quota.

`Victims` is the part of `policy._Pass` that chooses jobs to stop so that the head of the
queue can start: lower-priority preemptible jobs (`preemption.py`); jobs of its own `las`
queue that have received more service (`las.py`); borrowers of its cohort when its queue is
below its nominal quota (`cohorts.py`); and, when free room is only spread too thin, jobs
that move elsewhere (`defrag.py`). It reads the pass's state.
"""

from __future__ import annotations

from orchestrator.policy.cohorts import Verdict
from orchestrator.policy.defrag import plan_moves
from orchestrator.policy.preemption import choose_victims
from orchestrator.policy.types import Allocation, JobRequest

MOVE = "move"  # the reason to stop jobs that only move to make room (`defrag.py`)


class Victims:
    """Jobs to stop for the head, and why (mixed into `policy._Pass`)."""

    def _victims(self, head: JobRequest) -> tuple[list[str], str]:
        """Jobs to stop for the head, and why: lower-priority preemptible jobs; failing that,
        jobs of its own `las` queue and priority at a higher LAS level (`las.py`); failing
        that, when its queue is below its nominal quota, borrowers of its cohort (reclaim of
        room on the nodes); failing that, when free room is only spread too thin, jobs to
        move elsewhere so that it fits (`defrag.py`)."""
        nodes, free = self.policy.nodes, self.free.by_node
        chosen = choose_victims(head, self.running, nodes, free)
        if chosen is not None:
            return chosen, "lower-priority"
        las, cohorts = self.policy.las, self.cohorts
        if las is not None:
            eligible = las.eligible(head, self.now, self.served)
            if eligible is not None:
                rank = las.rank(self.now, self.served)
                chosen = choose_victims(head, self.running, nodes, free, eligible, rank)
                if chosen is not None:
                    return chosen, "more-served (LAS)"
        reclaims = cohorts is not None and cohorts.manages(head.queue)
        if reclaims and cohorts.below_nominal(head.queue, head.total()):
            chosen = self._victims_for_quota(head, cohorts.reclaimable(head), _recent_first, reclaim=True)
            if chosen:
                return chosen, "borrowing"
        moves = plan_moves(head, self.running, free, self.now, self.policy.move_after_s)
        return (moves, MOVE) if moves else ([], "")

    def _quota_preemption(self, head: JobRequest, verdict: Verdict) -> tuple[list[str], str] | None:
        """Victims that give a head its quota back, and why; None when there are none.

        Reclaim (`verdict` RECLAIM): borrowers of its cohort, the most recently started first.
        Failing that, for a job of a `las` queue: jobs of its own queue at a higher LAS level
        (as for room on the nodes), which frees its queue's quota too. Only the head of a pass
        chooses victims, and none while jobs are stopping (as in `_reserve`).
        """
        if self.reservation is not None or not self.policy.preemption or head.queue in self.quota_tried:
            return None
        self.quota_tried.add(head.queue)  # once per queue and pass: a failed search costs a lot
        if any(allocation.stopping for allocation in self.running):
            return None
        if verdict is Verdict.RECLAIM:
            chosen = self._victims_for_quota(head, self.cohorts.reclaimable(head), _recent_first, True)
            if chosen:
                return chosen, "borrowing"
        las = self.policy.las
        eligible = las.eligible(head, self.now, self.served) if las is not None else None
        if eligible is None:
            return None
        chosen = self._victims_for_quota(head, eligible, las.rank(self.now, self.served), reclaim=False)
        return (chosen, "more-served (LAS)") if chosen else None

    def _victims_for_quota(self, head: JobRequest, eligible, rank, reclaim: bool) -> list[str]:
        """Eligible jobs to stop so that the head fits the nodes and its quota; [] if none do.

        First those that make room on the nodes (`choose_victims`), then more in `rank` order
        until the quota fits too (a reclaim takes only from queues still borrowing).
        """
        chosen = choose_victims(head, self.running, self.policy.nodes, self.free.by_node, eligible, rank)
        if chosen is None:
            return []
        by_id = {allocation.job_id: allocation for allocation in self.running}
        released = [by_id[job_id] for job_id in chosen]
        self._quota_release(released, -1)
        # a reclaim never takes a borrower's queue below its nominal quota
        fits = not reclaim or all(not self.cohorts.below_nominal(a.queue, a.total()) for a in released)
        extra = sorted((a for a in self.running if eligible(a) and a.job_id not in chosen), key=rank)
        for allocation in extra if fits else []:
            if self._quota_fits(head):
                break
            if not reclaim or self.cohorts.keeps_nominal(allocation):
                self._quota_release([allocation], -1)
                released.append(allocation)
        fits = fits and self._quota_fits(head)
        self._quota_release(released, +1)  # they hold their quota until they have stopped
        return [allocation.job_id for allocation in released] if fits else []

    def _quota_fits(self, head: JobRequest) -> bool:
        return self.quotas.allows(head) and (self.cohorts is None or self.cohorts.verdict(head) is Verdict.OK)

    def _quota_release(self, allocations: list[Allocation], sign: int) -> None:
        """Take the allocations out of the quota books (-1), or put them back (+1)."""
        for allocation in allocations:
            self.quotas.add(allocation, sign)
            if self.cohorts is not None:
                if sign < 0:
                    self.cohorts.release(allocation)
                else:
                    self.cohorts.charge_allocation(allocation)


def _recent_first(allocation: Allocation) -> tuple[float, str]:
    """Reclaim order: the most recently started borrower first (the least work since it started)."""
    return (-allocation.started_at, allocation.job_id)
