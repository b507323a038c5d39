"""One scheduling pass: which pending jobs start now, where, and which running jobs to stop.

`Policy.schedule(now, pending, running)` is a pure function of its arguments and the
configuration: the service calls it on every event (submission, a job ending, a node coming
or going) and applies the `Decision`. One pass:

1. Free capacity per node = capacity minus every running or stopping job's placement.
2. Walk the pending jobs in queue order (priority, then age, then id). A job whose queue is at
   its quota is skipped, and so is the rest of that queue (a quota never holds up other
   queues, and a queue stays FIFO). Every job that fits as a gang starts, until the first one
   that does not: the head.
3. The head gets a reservation. If victims of an earlier pass are still stopping, and the head
   fits once they are gone, it waits for them (no new victims). Otherwise, with preemption on,
   lower-priority preemptible jobs are chosen as victims when stopping them lets it fit. Else
   its start is estimated EASY-backfill style: running jobs release their resources at their
   estimated ends, in order, until the head fits: that is its shadow time and placement.
4. Backfill: the next `backfill_window` jobs may start ahead of the head only if they cannot
   delay it: a job with a runtime estimate that ends before the shadow time, or that fits
   beside the head's reserved placement; a job without an estimate only if it is preemptible
   and of lower priority than the head (the head can take its resources back). Resources
   promised to a head waiting for victims are never given to anyone else.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from operator import attrgetter

from orchestrator.scheduler.admission import (
    EPS,
    UNBOUNDED,
    format_resources,
    free_capacity,
    oversize_reason,
    place,
    positive,
    slots,
)
from orchestrator.scheduler.preemption import choose_victims
from orchestrator.scheduler.queue import QuotaBook, order_pending, quota_reason
from orchestrator.scheduler.types import Allocation, Decision, JobRequest, Node, Resources

DEFAULT_BACKFILL_WINDOW = 100

Shape = tuple[int, tuple[tuple[str, float], ...]]


def _shape(job: JobRequest) -> Shape:
    # dict order is part of the key: equal dicts in another order only miss a cache, never hit wrongly
    return (job.workers, tuple(job.per_worker.items()))


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


@dataclass
class _Reservation:
    """Where and when the head job is expected to start, and whether it waits for victims."""

    job: JobRequest
    start: float | None  # None: depends on jobs without a runtime estimate
    placement: dict[str, int]
    promised: bool  # the head waits for victims: nothing may use its resources, even briefly


class _View:
    """Resources per node that a pass may still hand out, with cluster totals.

    Within a pass a view only shrinks, so a job shape that did not fit will not fit later in
    the pass, and neither will a shape with at least as many workers each needing at least as
    much: both are answered without another placement search.
    """

    def __init__(self, by_node: dict[str, Resources]) -> None:
        self.by_node = by_node
        self.totals: Resources = {}
        for node_free in by_node.values():
            for name, amount in node_free.items():
                self.totals[name] = self.totals.get(name, 0.0) + amount
        self._failed_shapes: set[Shape] = set()
        self._failed: list[tuple[int, Resources]] = []

    def place(self, job: JobRequest, shape: Shape) -> dict[str, int] | None:
        if shape in self._failed_shapes:
            return None
        need = job.per_worker
        for workers, failed_need in self._failed:
            if job.workers >= workers and all(need.get(n, 0.0) >= a for n, a in failed_need.items()):
                self._failed_shapes.add(shape)
                return None
        placement = None
        if all(a * job.workers <= self.totals.get(n, 0.0) + EPS for n, a in need.items() if a > 0):
            placement = place(job, self.by_node)
        if placement is None:
            self._failed_shapes.add(shape)
            self._failed.append((job.workers, positive(need)))
        return placement

    def set_node(self, node_id: str, resources: Resources) -> None:
        old = self.by_node[node_id]
        for name in resources.keys() | old.keys():
            self.totals[name] = self.totals.get(name, 0.0) + resources.get(name, 0.0) - old.get(name, 0.0)
        self.by_node[node_id] = resources

    def take(self, placement: Mapping[str, int], per_worker: Mapping[str, float]) -> None:
        for node_id, count in placement.items():
            self.set_node(node_id, _minus(self.by_node[node_id], per_worker, count))


class _Spare(_View):
    """What backfill may use beside the head's reservation: free now, and free when it starts."""

    def __init__(self, free: dict[str, Resources], headroom: dict[str, Resources]) -> None:
        self.free = free  # the pass's free resources per node (kept current by the pass)
        self.headroom = headroom  # per node when the head starts: free then, minus its placement
        super().__init__({node_id: self._min_of_both(node_id) for node_id in free})

    def _min_of_both(self, node_id: str) -> Resources:
        free, room = self.free[node_id], self.headroom[node_id]
        return {name: min(amount, room.get(name, 0.0)) for name, amount in free.items()}

    def refresh(self, node_ids: Iterable[str]) -> None:
        for node_id in node_ids:
            self.set_node(node_id, self._min_of_both(node_id))

    def take_headroom(self, placement: Mapping[str, int], per_worker: Mapping[str, float]) -> None:
        for node_id, count in placement.items():
            self.headroom[node_id] = _minus(self.headroom[node_id], per_worker, count)


class Policy:
    """Priority scheduling with gang admission, aging, EASY backfill, quotas and preemption."""

    def __init__(
        self,
        nodes: list[Node],
        quotas: dict[str, dict[str, float]] | None = None,
        backfill: bool = True,
        preemption: bool = True,
        backfill_window: int = DEFAULT_BACKFILL_WINDOW,
    ) -> None:
        if backfill_window < 0:
            raise ValueError(f"backfill_window must be >= 0, got {backfill_window}")
        self.quotas: dict[str, dict[str, float]] = {q: dict(limits) for q, limits in (quotas or {}).items()}
        self.backfill = backfill
        self.preemption = preemption
        self.backfill_window = backfill_window
        self.set_nodes(nodes)

    def set_nodes(self, nodes: Iterable[Node]) -> None:
        """Replace the cluster's nodes (nodes come and go); later passes use these."""
        self.nodes = list(nodes)
        # shape -> why it cannot fit the empty cluster (None: it can); a pure function of nodes
        self._oversize: dict[Shape, str | None] = {}

    def rejection_reason(self, job: JobRequest) -> str | None:
        """Why the job can never start here (larger than the cluster or its queue's quota), or None.

        The service calls this at submission and refuses the job with the message.
        """
        return oversize_reason(job, self.nodes) or quota_reason(job, self.quotas)

    def oversize_note(self, job: JobRequest, shape: Shape | None = None) -> str | None:
        """Why the job cannot start on the cluster as it is now, even empty; None if it can."""
        shape = shape or _shape(job)
        if shape not in self._oversize:
            self._oversize[shape] = oversize_reason(job, self.nodes)
        reason = self._oversize[shape]
        return None if reason is None else f"cannot start on the cluster as it is now: {reason}"

    def schedule(self, now: float, pending: list[JobRequest], running: list[Allocation]) -> Decision:
        return _Pass(self, now, list(running)).run(order_pending(pending))


class _Pass:
    """The state of one scheduling pass (see the module docstring for the steps)."""

    def __init__(self, policy: Policy, now: float, running: list[Allocation]) -> None:
        self.policy = policy
        self.now = now
        self.running = running
        self.free = _View(free_capacity(policy.nodes, running))
        self.quotas = QuotaBook(policy.quotas, running)
        self.held = list(running)  # running jobs and those started in this pass, for the shadow time
        self.decision = Decision()
        self.reservation: _Reservation | None = None
        self.spare: _Spare | None = None

    def run(self, ordered: list[JobRequest]) -> Decision:
        policy, decision = self.policy, self.decision
        running_ids = {allocation.job_id for allocation in self.running}
        queue_blocked_by: dict[str, str] = {}
        examined = 0
        for position, job in enumerate(ordered):
            if self.reservation is not None:
                if not policy.backfill or examined >= policy.backfill_window:
                    break
                examined += 1
            if job.id in running_ids:
                continue  # the service still lists it as pending; never start a job twice
            shape = _shape(job)
            note = policy.oversize_note(job, shape)
            if note is not None:
                decision.notes[job.id] = note
                continue
            if job.queue in queue_blocked_by:
                decision.notes[job.id] = (
                    f"queue '{job.queue}' is at its quota; waiting behind job {queue_blocked_by[job.queue]}"
                )
                continue
            if not self.quotas.allows(job):
                decision.notes[job.id] = self.quotas.note(job)
                queue_blocked_by[job.queue] = job.id
                continue

            if self.reservation is None:
                placement = self.free.place(job, shape)
                if placement is not None:
                    self._start(job, placement)
                else:
                    self._reserve(job)
                    # its queue's quota is kept for it too, so that jobs of the same queue that
                    # go ahead cannot leave it without quota when its resources come free
                    self.quotas.reserve(job)
                continue

            why = self._backfill(job, shape)
            if why:
                head = self.reservation.job
                ahead = position - len(decision.admit)
                decision.notes[job.id] = (
                    f"queued behind {ahead} job(s), next in line {head.id} (priority {head.priority}): {why}"
                )
        return decision

    def _start(self, job: JobRequest, placement: dict[str, int], beside_head: bool = False) -> None:
        self.free.take(placement, job.per_worker)
        if self.spare is not None:
            if beside_head:  # still running when the head starts: it uses up headroom too
                self.spare.take_headroom(placement, job.per_worker)
            self.spare.refresh(placement)
        self.quotas.charge(job)
        self.decision.admit.append((job.id, placement))
        est_end = None if job.est_runtime_s is None else self.now + job.est_runtime_s
        self.held.append(
            Allocation(
                job.id, job.priority, placement, job.per_worker, self.now, job.preemptible, job.queue, est_end
            )
        )

    def _reserve(self, head: JobRequest) -> None:
        """The head's reservation; chooses victims (into the decision) when that lets it start."""
        now, decision, free = self.now, self.decision, self.free.by_node
        stopping = [allocation for allocation in self.running if allocation.stopping]
        victims: list[Allocation] = []
        if stopping:
            victims = stopping  # stopped for an earlier head, or for this one: wait, choose no more
        elif self.policy.preemption:
            chosen = choose_victims(head, self.running, self.policy.nodes, free) or []
            by_id = {allocation.job_id: allocation for allocation in self.running}
            victims = [by_id[job_id] for job_id in chosen]
        if victims:
            future = _released(free, victims)
            placement = place(head, future)
            if placement is not None:
                if not stopping:
                    decision.preempt = [victim.job_id for victim in victims]
                    verb = f"preempting {len(victims)} lower-priority job(s)"
                else:
                    verb = f"waiting for {len(victims)} stopping job(s) to release their resources"
                decision.reserved_for = decision.head = head.id
                decision.head_start = now
                decision.notes[head.id] = f"next in line: {verb}: {', '.join(v.job_id for v in victims)}"
                self.reservation = _Reservation(head, now, placement, promised=True)
                self.spare = _Spare(free, _headroom(future, placement, head))
                return

        start, avail = _shadow(now, head, free, self.held)
        placement = place(head, avail) or {}  # {}: only when nodes vanished under running jobs
        decision.head = head.id
        decision.head_start = start
        totals = self.free.totals
        short = {
            name: amount * head.workers - totals.get(name, 0.0)
            for name, amount in head.per_worker.items()
            if amount * head.workers > totals.get(name, 0.0) + EPS
        }
        waiting = (
            f"waiting for {format_resources(short)}"
            if short
            else f"free resources are spread over nodes; no room for {head.workers} worker(s)"
            f" of {format_resources(positive(head.per_worker))} each"
        )
        when = (
            f"expected to start in {_duration(start - now)} by runtime estimates"
            if start is not None
            else "start time unknown (running jobs without runtime estimates)"
        )
        decision.notes[head.id] = f"next in line: {waiting}; resources reserved, {when}"
        self.reservation = _Reservation(head, start, placement, promised=False)
        self.spare = _Spare(free, _headroom(avail, placement, head))

    def _backfill(self, job: JobRequest, shape: Shape) -> str:
        """Start `job` ahead of the head if that cannot delay it; else say why not."""
        reservation, spare = self.reservation, self.spare
        head = reservation.job
        known = job.est_runtime_s is not None
        reclaimable = self.policy.preemption and job.preemptible and job.priority < head.priority
        if not known and not reclaimable:
            return "no runtime estimate and not preemptible by it, so it may not go ahead"

        # (a) it ends before the head is expected to start: any free resources will do
        if (
            known
            and not reservation.promised
            and reservation.start is not None
            and self.now + job.est_runtime_s <= reservation.start
        ):
            placement = self.free.place(job, shape)
            if placement is not None:
                self._start(job, placement)
                return ""
        # (b) beside the head's reserved placement: free now and still free when the head starts
        placement = spare.place(job, shape)
        if placement is not None:
            self._start(job, placement, beside_head=True)
            return ""
        # (c) preemptible by the head: may use its reserved resources until the head needs them
        if reclaimable and not reservation.promised:
            placement = self.free.place(job, shape)
            if placement is not None:
                self._start(job, placement)
                return ""
        if reservation.promised:
            return "the free resources are promised to it (waiting for preempted jobs to stop)"
        if self.free.place(job, shape) is None:
            return f"waiting for {job.workers} worker(s) of {format_resources(positive(job.per_worker))}"
        return "starting it now would delay the next job in line"


class FifoPolicy:
    """Plain FIFO for comparison: submission order, no priorities, backfill or preemption.

    Jobs start in submission order until the first that cannot start; everything behind it
    waits. Same interface as `Policy` (the backfill and preemption switches are ignored).
    """

    def __init__(
        self,
        nodes: list[Node],
        quotas: dict[str, dict[str, float]] | None = None,
        backfill: bool = False,
        preemption: bool = False,
        backfill_window: int = 0,
    ) -> None:
        self.quotas = {q: dict(limits) for q, limits in (quotas or {}).items()}
        self.set_nodes(nodes)

    def set_nodes(self, nodes: Iterable[Node]) -> None:
        self.nodes = list(nodes)
        self._oversize: dict[Shape, str | None] = {}

    def rejection_reason(self, job: JobRequest) -> str | None:
        return oversize_reason(job, self.nodes) or quota_reason(job, self.quotas)

    def schedule(self, now: float, pending: list[JobRequest], running: list[Allocation]) -> Decision:
        running = list(running)
        free = _View(free_capacity(self.nodes, running))
        quotas = QuotaBook(self.quotas, running)
        running_ids = {allocation.job_id for allocation in running}
        decision = Decision()
        for job in sorted(pending, key=attrgetter("submitted_at", "id")):
            if job.id in running_ids:
                continue
            shape = _shape(job)
            if shape not in self._oversize:
                self._oversize[shape] = oversize_reason(job, self.nodes)
            if self._oversize[shape] is not None:
                # it can never start here: skipping it keeps the queue from stalling for good
                decision.notes[job.id] = f"cannot start on the cluster as it is now: {self._oversize[shape]}"
                continue
            if not quotas.allows(job):
                decision.notes[job.id] = quotas.note(job)
                break
            placement = free.place(job, shape)
            if placement is None:
                decision.notes[job.id] = "next in line (FIFO): waiting for resources"
                break
            free.take(placement, job.per_worker)
            quotas.charge(job)
            decision.admit.append((job.id, placement))
        return decision


def _minus(resources: Mapping[str, float], per_worker: Mapping[str, float], count: int) -> Resources:
    out = dict(resources)
    for name, amount in per_worker.items():
        out[name] = out.get(name, 0.0) - amount * count
    return out


def _released(free: Mapping[str, Resources], allocations: Iterable[Allocation]) -> dict[str, Resources]:
    """Free resources per node once these allocations have let go of theirs."""
    out = {node_id: dict(node_free) for node_id, node_free in free.items()}
    for allocation in allocations:
        for node_id, count in allocation.placement.items():
            if node_id in out:
                out[node_id] = _minus(out[node_id], allocation.per_worker, -count)
    return out


def _headroom(
    avail: Mapping[str, Resources], placement: Mapping[str, int], head: JobRequest
) -> dict[str, Resources]:
    """Per node: what is left at the head's start once its placement is taken out."""
    out = {node_id: dict(node_avail) for node_id, node_avail in avail.items()}
    for node_id, count in placement.items():
        out[node_id] = _minus(out[node_id], head.per_worker, count)
    return out


def _shadow(
    now: float, head: JobRequest, free: Mapping[str, Resources], held: list[Allocation]
) -> tuple[float | None, dict[str, Resources]]:
    """When the head fits if held jobs end as estimated, and the free resources at that time.

    Stopping jobs go first (they end now), then jobs by estimated end (an overdue estimate
    counts as now), then jobs without an estimate, oldest first; the time is None as soon as
    one of those is needed. Slots are counted per node as releases come in, so each release
    costs only the nodes it touches.
    """
    need = positive(head.per_worker)
    avail = {node_id: dict(node_free) for node_id, node_free in free.items()}
    room = {node_id: slots(need, node_free, UNBOUNDED) for node_id, node_free in avail.items()}
    total = sum(room.values())
    if total >= head.workers:
        return now, avail
    stopping = [a for a in held if a.stopping]
    known = sorted((a for a in held if not a.stopping and a.est_end is not None), key=attrgetter("est_end"))
    unknown = sorted((a for a in held if not a.stopping and a.est_end is None), key=attrgetter("started_at"))
    releases = [(now, a) for a in stopping] + [(max(now, a.est_end), a) for a in known]
    releases += [(None, a) for a in unknown]
    for when, allocation in releases:
        for node_id, count in allocation.placement.items():
            node_avail = avail.get(node_id)
            if node_avail is None:
                continue
            for name, amount in allocation.per_worker.items():
                node_avail[name] = node_avail.get(name, 0.0) + amount * count
            fresh = slots(need, node_avail, UNBOUNDED)
            total += fresh - room[node_id]
            room[node_id] = fresh
        if total >= head.workers:
            return when, avail
    return None, avail
