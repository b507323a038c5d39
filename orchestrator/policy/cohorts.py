"""Fair share between teams: nominal quotas, borrowing within a cohort, and reclaim (Kueue).

Each queue in a cohort has a nominal quota per resource. The cohort's pool is the sum of its
queues' nominal quotas. A queue may use more than its nominal quota (borrow) as long as:

- the cohort's pool has room (what the others leave unused),
- it stays within its `borrowing_limit` above nominal (None: no limit but the pool),
- the job is `preemptible`: borrowed quota is taken back by preemption, so a job that
  cannot be preempted runs within its queue's nominal quota only, and
- no other queue of the cohort has a job waiting that fits within its nominal quota (a
  lender's job goes before any borrowing: that is what "nominal" guarantees; while it waits,
  the room that running jobs free is kept for it instead of being borrowed again). A waiting
  job that needs to borrow itself has no such guarantee and pauses nobody: otherwise two
  queues whose jobs both need to borrow would wait for each other for good.

Reclaim: a job of a queue below its nominal quota that does not fit the pool (others
borrowed it) is a reclaim head: borrowers, running jobs of other queues of the cohort that
use more than their nominal quota, are preempted (zero-loss: a checkpointed stop, then
requeued), the most recently started first, until it fits, but never so many that a
borrower's queue drops below its own nominal quota: so two queues never take the same
GPUs back and forth. Reclaim ignores priority: a nominal quota is a guarantee.

Resources a queue has no nominal quota for are not counted (unlimited). Running and stopping
jobs count: a stopping job holds its quota until it has stopped.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from enum import Enum

from core.queues import QueueConfig
from orchestrator.policy.admission import EPS, format_resources
from orchestrator.policy.types import Allocation, JobRequest, Resources


class Verdict(Enum):
    OK = "ok"  # fits its nominal quota, or may borrow
    RECLAIM = "reclaim"  # fits its nominal quota once borrowers give it back
    BLOCKED = "blocked"  # waits for its own queue to use less


class CohortLayout:
    """What a config says about cohorts, worked out once: queues, pools, members."""

    def __init__(self, config: QueueConfig) -> None:
        self.queues = {name: q for name, q in config.queues.items() if q.cohort is not None}
        self.cohort_of = {name: q.cohort for name, q in self.queues.items()}
        self.nominal = {name: dict(q.nominal) for name, q in self.queues.items()}
        self.pool: dict[str, Resources] = {}
        for queue in self.queues.values():
            pool = self.pool.setdefault(queue.cohort, {})
            for resource, amount in queue.nominal.items():
                pool[resource] = pool.get(resource, 0.0) + amount
        self.members: dict[str, list[str]] = {}
        for name, cohort in self.cohort_of.items():
            self.members.setdefault(cohort, []).append(name)


class CohortBook:
    """Use of every cohort queue against its nominal quota, borrowing limit and cohort pool."""

    def __init__(self, config: QueueConfig | CohortLayout, allocations: Iterable[Allocation] = ()) -> None:
        layout = config if isinstance(config, CohortLayout) else CohortLayout(config)
        self.queues, self.cohort_of, self.nominal = layout.queues, layout.cohort_of, layout.nominal
        self.pool, self.members = layout.pool, layout.members
        self.used: dict[str, Resources] = {name: dict.fromkeys(n, 0.0) for name, n in self.nominal.items()}
        # per queue, its waiting jobs in queue order (smallest size); `done`: started or skipped
        self.waiting: dict[str, deque[JobRequest]] = {name: deque() for name in self.queues}
        self.done: set[str] = set()
        # verdicts and notes are the same for jobs of one queue and shape until use changes
        self._verdicts: dict[tuple, Verdict] = {}
        self._notes: dict[tuple, str] = {}
        for allocation in allocations:  # (this runs on every pass: no dicts made per job)
            used = self.used.get(allocation.queue)
            if used is not None:
                workers, per_worker = sum(allocation.placement.values()), allocation.per_worker
                for name in used:
                    used[name] += per_worker.get(name, 0.0) * workers
        self.cohort_used: dict[str, Resources] = {cohort: {} for cohort in self.pool}
        for name, used in self.used.items():
            cohort_used = self.cohort_used[self.cohort_of[name]]
            for resource, amount in used.items():
                cohort_used[resource] = cohort_used.get(resource, 0.0) + amount

    def manages(self, queue: str) -> bool:
        return queue in self.queues

    def note_waiting(self, ordered: Iterable[JobRequest]) -> None:
        """The pass's pending jobs in queue order (each at its smallest size): a queue whose
        next job fits its nominal quota pauses borrowing by the other queues of its cohort."""
        for job in ordered:
            if job.queue in self.waiting:
                self.waiting[job.queue].append(job)

    def lender_waiting(self, cohort: str, borrower: str) -> bool:
        """True when another queue of the cohort has a job waiting that fits within its
        nominal quota (one that would need to borrow too waits like any borrower)."""
        for name in self.members[cohort]:
            waiting = self.waiting[name]
            while waiting and waiting[0].id in self.done:
                waiting.popleft()
            if name != borrower and waiting and self._within_nominal(name, waiting[0].total()):
                return True
        return False

    def lenders(self) -> set[str]:
        """The queues that use less than their nominal quota of some resource."""
        return {name for name in self.queues if self.below_nominal(name, self.queues[name].nominal)}

    def below_nominal(self, queue: str, need: Resources) -> bool:
        """True when the queue uses less than its nominal quota of a resource that `need` asks for."""
        used = self.used[queue]
        return any(
            need.get(name, 0.0) > 0 and used.get(name, 0.0) < nominal - EPS
            for name, nominal in self.queues[queue].nominal.items()
        )

    def skip(self, job: JobRequest) -> None:
        """The pass leaves the job (it cannot start on the cluster): it waits for nothing."""
        self.done.add(job.id)
        self._verdicts.clear()

    def verdict(self, job: JobRequest) -> Verdict:
        """OK, RECLAIM or BLOCKED (see the module docstring); remembered per queue and shape
        until a job starts, is skipped or is counted out (most jobs of a pass share a few)."""
        if job.queue not in self.queues:
            return Verdict.OK
        key = (job.queue, job.preemptible, job.workers, *job.per_worker.items())
        verdict = self._verdicts.get(key)
        if verdict is None:
            verdict = self._verdicts[key] = self._verdict(job)
        return verdict

    def _verdict(self, job: JobRequest) -> Verdict:
        cohort, per_worker, workers = self.cohort_of[job.queue], job.per_worker, job.workers
        total = {name: per_worker.get(name, 0.0) * workers for name in self.pool[cohort]}
        pool_ok = all(
            self.cohort_used[cohort].get(name, 0.0) + total[name] <= limit + EPS
            for name, limit in self.pool[cohort].items()
        )
        if self._within_nominal(job.queue, total):
            return Verdict.OK if pool_ok else Verdict.RECLAIM
        queue = self.queues[job.queue]
        within_limit = queue.borrowing_limit is None or all(
            self.used[job.queue].get(name, 0.0) + total.get(name, 0.0) <= nominal + limit + EPS
            for name, nominal in queue.nominal.items()
            if (limit := queue.borrowing_limit.get(name)) is not None
        )
        if not (job.preemptible and within_limit) or self.lender_waiting(cohort, job.queue):
            return Verdict.BLOCKED
        if pool_ok:
            return Verdict.OK
        return Verdict.RECLAIM if self.below_nominal(job.queue, total) else Verdict.BLOCKED

    def _within_nominal(self, queue: str, total: Resources) -> bool:
        used = self.used[queue]
        return all(
            used[name] + total.get(name, 0.0) <= nominal + EPS
            for name, nominal in self.nominal[queue].items()
        )

    def charge(self, job: JobRequest) -> None:
        """The job starts, or holds its share as the head: its queue and cohort use it."""
        self.done.add(job.id)
        self._charge(job.queue, job.total())

    def _charge(self, queue: str, total: Resources, sign: float = 1.0) -> None:
        if queue not in self.queues:
            return
        self._notes.clear()
        self._verdicts.clear()
        cohort_used = self.cohort_used[self.cohort_of[queue]]
        used = self.used[queue]
        for name in self.queues[queue].nominal:
            amount = sign * total.get(name, 0.0)
            used[name] = used.get(name, 0.0) + amount
            cohort_used[name] = cohort_used.get(name, 0.0) + amount

    def release(self, allocation: Allocation) -> None:
        self._charge(allocation.queue, allocation.total(), -1.0)

    def charge_allocation(self, allocation: Allocation) -> None:
        self._charge(allocation.queue, allocation.total())

    def borrowing(self, queue: str) -> bool:
        """True when the queue uses more than its nominal quota of some resource."""
        nominal, used = self.queues[queue].nominal, self.used[queue]
        return any(used.get(name, 0.0) > amount + EPS for name, amount in nominal.items())

    def reclaimable(self, head: JobRequest):
        """The running jobs a reclaim for `head` may preempt: borrowers of its cohort."""
        cohort = self.cohort_of[head.queue]

        def may_reclaim(allocation: Allocation) -> bool:
            return (
                not allocation.stopping
                and allocation.queue != head.queue
                and self.cohort_of.get(allocation.queue) == cohort
                and self.keeps_nominal(allocation)
            )

        return may_reclaim

    def keeps_nominal(self, allocation: Allocation) -> bool:
        """True when its queue stays at or above its nominal quota without it (in this book)."""
        used, total = self.used[allocation.queue], allocation.total()
        return all(
            used.get(name, 0.0) - total.get(name, 0.0) >= nominal - EPS
            for name, nominal in self.queues[allocation.queue].nominal.items()
        )

    def note(self, job: JobRequest, verdict: Verdict) -> str:
        key = (job.queue, verdict, job.preemptible)
        if key not in self._notes:
            self._notes[key] = self._note(job, verdict)
        return self._notes[key]

    def _note(self, job: JobRequest, verdict: Verdict) -> str:
        queue, cohort = self.queues[job.queue], self.cohort_of[job.queue]
        use = f"uses {format_resources(self.used[job.queue])} of nominal {format_resources(queue.nominal)}"
        if verdict is Verdict.RECLAIM:
            return f"queue '{job.queue}' {use}: reclaiming its nominal quota from cohort '{cohort}'"
        if not job.preemptible:
            why = "not preemptible, so it runs within the nominal quota only"
        elif self.lender_waiting(cohort, job.queue):
            why = f"borrowing paused: another queue of cohort '{cohort}' waits for its nominal quota"
        else:
            why = f"nothing left to borrow in cohort '{cohort}' (or its borrowing limit is reached)"
        return f"queue '{job.queue}' {use}; {why}"

    def never_reason(self, job: JobRequest) -> str | None:
        """Why the job can never start in its queue (beyond what it may ever use), or None."""
        if job.queue not in self.queues:
            return None
        queue, pool, total = self.queues[job.queue], self.pool[self.cohort_of[job.queue]], job.total()
        for name, nominal in queue.nominal.items():
            limit = pool[name] - nominal
            if queue.borrowing_limit is not None and name in queue.borrowing_limit:
                limit = min(limit, queue.borrowing_limit[name])
            most = nominal + (max(0.0, limit) if job.preemptible else 0.0)
            if total.get(name, 0.0) > most + EPS:
                extra = "" if job.preemptible else " (it is not preemptible, so it may not borrow)"
                return (
                    f"job {job.id} needs {total[name]:g} {name} but queue '{job.queue}' may use at most"
                    f" {most:g}{extra}"
                )
        return None

    def report(self) -> dict[str, dict]:
        """Per cohort queue: use, nominal quota, what it borrows and what it lends (its unused
        nominal quota times the share of the cohort's unused quota that others borrow)."""
        unused: dict[tuple[str, str], float] = {}  # (cohort, resource) -> nominal left unused
        borrowed: dict[tuple[str, str], float] = {}
        for name, queue in self.queues.items():
            for r, n in queue.nominal.items():
                key, use = (queue.cohort, r), self.used[name].get(r, 0.0)
                unused[key] = unused.get(key, 0.0) + max(0.0, n - use)
                borrowed[key] = borrowed.get(key, 0.0) + max(0.0, use - n)
        out = {}
        for name, queue in self.queues.items():
            used, lent = self.used[name], {}
            for r, n in queue.nominal.items():
                key, free = (queue.cohort, r), max(0.0, n - used.get(r, 0.0))
                lent[r] = free * min(1.0, borrowed[key] / unused[key]) if unused[key] > EPS else 0.0
            out[name] = {
                "cohort": queue.cohort,
                "used": {r: used.get(r, 0.0) for r in queue.nominal},
                "nominal": dict(queue.nominal),
                "borrowed": {r: max(0.0, used.get(r, 0.0) - n) for r, n in queue.nominal.items()},
                "lent": lent,
            }
        return out
