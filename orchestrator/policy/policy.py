"""One scheduling pass: which pending jobs start now, where, and which running jobs to stop.

`Policy.schedule(now, pending, running)` is a pure function of its arguments and the
configuration: the service calls it on every event (submission, a job ending, a node coming
or going) and applies the `Decision`. One pass:

1. Free capacity per node = capacity minus every running or stopping job's placement.
2. Walk the pending jobs in queue order: priority, then within a level the queue's order
   (`las-share` by default, `las.py`; with `order: fifo`, age, then id). A job whose queue is
   at its quota is skipped, and so is the rest of a FIFO queue (a quota never holds up other
   queues, and a FIFO queue stays FIFO). Every job that fits as a gang starts, until the first
   one that does not: the head. An elastic job starts at the largest of its sizes that fits now
   (and fits its queue's quota); only when none does, it is the head, at its smallest size.
3. The head gets a reservation. If victims of an earlier pass are still stopping, and the head
   fits once they are gone, it waits for them (no new victims). Otherwise, with preemption on,
   lower-priority preemptible elastic jobs are shrunk when that lets it fit (`resize`), and
   only if shrinking cannot make room, lower-priority preemptible jobs are chosen as victims
   when stopping them lets it fit (never some shrunk and others stopped for the same head);
   failing that, the other reasons of `victims.py` (LAS within the head's level, reclaim, moves).
   Else its start is estimated EASY-backfill style: running jobs release their resources at
   their estimated ends, in order, until the head fits: that is its shadow time and placement.
4. Backfill: the next `backfill_window` jobs may start ahead of the head only if they cannot
   delay it: a job with a runtime estimate that ends before the shadow time, or that fits
   beside the head's reserved placement; a job without an estimate only if it is preemptible
   and of lower priority than the head (the head can take its resources back), or, in LAS
   queues, of the head's priority while the head is not starving (`las.may_pass`). Resources
   promised to a head waiting for victims are never given to anyone else, nor the room the
   elastic ones among them need to start again beside it. An elastic job tries its sizes
   largest first, each under these rules.
5. Grow: when no job is left waiting (every pending job started, or can never start on the
   cluster as it is, or waits only for its queue's quota) and no job is stopping, running
   elastic jobs that have run at their size for `grow_after_s` grow (`resize`) to the largest
   size that fits into their own placement plus the free resources; in queue order (priority,
   then the longest running), each taking its share of the free room before the next.

A resize is carried out as a checkpointed stop and a new admission, so the policy keeps a
resize only when its own next pass would start the job again at no less than the new size:
the head first, at the largest size that fits, then the resized jobs in queue order (the
policy sees when they started, not when they were submitted, and orders them by that). It
does not hold room for a restarting job against jobs ahead of it in the queue, or against
new jobs while a grown job stops. Jobs that are waiting for a queue's quota do not block
growing, but jobs of that queue do not grow: the quota goes to the waiting job first.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from core.queues import DEFAULT_QUEUES, QueueConfig
from orchestrator.policy.admission import (
    EPS,
    format_resources,
    free_capacity,
    oversize_reason,
    oversize_why,
    place,
    positive,
)
from orchestrator.policy.cohorts import CohortBook, CohortLayout, Verdict
from orchestrator.policy.defrag import DEFAULT_MIN_RUN_S
from orchestrator.policy.elastic import Resizes
from orchestrator.policy.las import Las, LasTuning, las_of
from orchestrator.policy.preemption import choose_shrinks
from orchestrator.policy.queue import QuotaBook, order_pending, quota_reason
from orchestrator.policy.room import Shape, Spare, View, at_sizes, headroom, released, shadow, shape_of
from orchestrator.policy.types import Allocation, Decision, JobRequest, Node
from orchestrator.policy.victims import MOVE, Victims

DEFAULT_BACKFILL_WINDOW = 100
DEFAULT_GROW_AFTER_S = 120.0


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


class Policy:
    """Priority scheduling with gang admission, aging, EASY backfill, quotas, preemption and
    elastic jobs (started at the largest size that fits, shrunk before anything is stopped,
    grown into free room when nothing waits).

    `grow_after_s`: how long an elastic job runs at one size before it may grow (each resize
    costs a checkpoint and a restart); `math.inf` turns growing off.

    `move_after_s`: how long a preemptible job runs before it may be moved to another node to
    make room for a head that free room spread too thin keeps waiting (`defrag.py`);
    `math.inf` turns moving off.

    `queues`: the validated queue configuration (`core.queues.QueueConfig`): each queue's
    order (`las-share`, `las`: least attained service, `las.py`; or `fifo`) and cohorts with
    borrowing and reclaim (`cohorts.py`); a queue in no cohort with a nominal quota is a hard
    cap, like `quotas`. None: every queue has the default order, `las-share`
    (`core.queues.DEFAULT_QUEUES`), and no cohort.

    `las_tuning`: LAS knobs the queue file does not carry (`las.LasTuning`); None: those of
    the file's LAS order (`las.LAS_SHARE_TUNING` for `las-share`, else plain LAS).
    """

    def __init__(
        self,
        nodes: list[Node],
        quotas: dict[str, dict[str, float]] | None = None,
        backfill: bool = True,
        preemption: bool = True,
        backfill_window: int = DEFAULT_BACKFILL_WINDOW,
        grow_after_s: float = DEFAULT_GROW_AFTER_S,
        queues: QueueConfig | None = None,
        move_after_s: float = DEFAULT_MIN_RUN_S,
        las_tuning: LasTuning | None = None,
    ) -> None:
        if backfill_window < 0:
            raise ValueError(f"backfill_window must be >= 0, got {backfill_window}")
        if not grow_after_s >= 0:  # NaN too
            raise ValueError(f"grow_after_s must be >= 0, got {grow_after_s}")
        self.quotas: dict[str, dict[str, float]] = {q: dict(limits) for q, limits in (quotas or {}).items()}
        self.queue_config = queues
        self.cohorts = False  # whether any queue is in a cohort
        if queues is not None:
            both = sorted(self.quotas.keys() & queues.queues.keys())
            if both:
                raise ValueError(f"queue(s) {', '.join(both)} have both a quota and a queue config entry")
            self.quotas.update(queues.hard_caps())
            self.cohorts = any(queue.cohort is not None for queue in queues.queues.values())
            self.cohort_layout = CohortLayout(queues)
        self.las: Las | None = las_of(DEFAULT_QUEUES if queues is None else queues, las_tuning)
        self.backfill = backfill
        self.preemption = preemption
        self.backfill_window = backfill_window
        self.grow_after_s = grow_after_s
        if not move_after_s >= 0:
            raise ValueError(f"move_after_s must be >= 0, got {move_after_s}")
        self.move_after_s = move_after_s
        self.set_nodes(nodes)

    def set_nodes(self, nodes: Iterable[Node], possible: Iterable[Node] | None = None) -> None:
        """Replace the cluster's nodes (nodes come and go); later passes use these. `possible`:
        the nodes it may grow to (an autoscaler's maximum); a job that fits those is not
        refused, and waits at the head of the queue while the autoscaler adds nodes."""
        self.nodes = list(nodes)
        self.possible = self.nodes if possible is None else list(possible)
        self.gpus = sum(node.capacity.get("GPU", 0.0) for node in self.nodes)  # for LAS' top share
        # shape -> why it cannot fit the largest cluster (None: it can); a pure function of nodes
        self._oversize: dict[Shape, str | None] = {}

    def rejection_reason(self, job: JobRequest) -> str | None:
        """Why the job can never start here (larger than the cluster or its queue's quota), or None.

        The service calls this at submission and refuses the job with the message. An elastic
        job is judged by its smallest size: it can start whenever that fits.
        """
        smallest = job.at_size(job.allowed_sizes()[-1])
        reason = oversize_reason(smallest, self.possible)
        if reason and len(self.possible) > len(self.nodes):
            reason += f", counting the {len(self.possible) - len(self.nodes)} the autoscaler may still add"
        if reason is None and self.cohorts:
            reason = CohortBook(self.queue_config).never_reason(smallest)
        return reason or quota_reason(smallest, self.quotas)

    def oversize_note(self, job: JobRequest, shape: Shape | None = None) -> str | None:
        """Why the job cannot start on the cluster as it is now, even empty; None if it can."""
        shape = shape or shape_of(job)
        if shape not in self._oversize:
            self._oversize[shape] = oversize_why(job, self.possible)
        reason = self._oversize[shape]
        return None if reason is None else f"cannot start on the cluster as it is now: it {reason}"

    def schedule(self, now: float, pending: list[JobRequest], running: list[Allocation]) -> Decision:
        running = list(running)
        cohorts = CohortBook(self.cohort_layout, running) if self.cohorts else None
        # jobs of cohort queues below their nominal quota go first within their priority
        # (Kueue: no borrowing ahead of a lender), so the backfill window reaches them
        first = cohorts.lenders() if cohorts is not None else set()
        served: dict[str, tuple[float, float]] = {}
        levels: dict[str, int] = {}
        if self.las is not None:
            served = self.las.served(running, now)
            self.las.begin_pass(pending, running, self.gpus, served)  # before levels: it lifts some
            levels = self.las.pending_levels(pending, now)
            ordered = self.las.order(pending, running, now, first, served, levels)
        else:
            ordered = order_pending(pending)
            if first:
                ordered.sort(key=lambda job: (-job.priority, job.queue not in first))
        return _Pass(self, now, running, cohorts, served, levels).run(ordered)


class _Pass(Victims, Resizes):
    """The state of one scheduling pass (see the module docstring for the steps)."""

    def __init__(
        self,
        policy: Policy,
        now: float,
        running: list[Allocation],
        cohorts: CohortBook | None = None,
        served: dict[str, tuple[float, float]] | None = None,
        levels: dict[str, int] | None = None,
    ) -> None:
        self.policy = policy
        self.now = now
        self.running = running
        self.free = View(free_capacity(policy.nodes, running))
        self.quotas = QuotaBook(policy.quotas, running)
        self.cohorts = cohorts
        self.served = served or {}  # LAS: each running job's attained service, once per pass
        self.levels = levels or {}  # LAS: each pending job's level, once per pass
        self.held = list(running)  # running jobs and those started in this pass, for the shadow time
        self.decision = Decision()
        self.reservation: _Reservation | None = None
        self.spare: Spare | None = None
        self.quota_tried: set[str] = set()  # queues whose jobs looked for victims to free quota

    def run(self, ordered: list[JobRequest]) -> Decision:
        policy, decision = self.policy, self.decision
        running_ids = {allocation.job_id for allocation in self.running}
        queue_blocked_by: dict[str, str] = {}
        quota_waits: set[str] = set()  # queues with a job waiting for quota: none of theirs grows
        examined = 0
        cohorts = self.cohorts
        if cohorts is not None:
            cohorts.note_waiting(j.at_size(j.allowed_sizes()[-1]) for j in ordered if j.id not in running_ids)
        for position, job in enumerate(ordered):
            if self.reservation is not None:
                if not policy.backfill or examined >= policy.backfill_window:
                    break
                examined += 1
            if job.id in running_ids:
                continue  # the service still lists it as pending; never start a job twice
            sized = at_sizes(job)  # an elastic job: each size, largest first; judged by its smallest
            smallest, shape = sized[-1]
            note = policy.oversize_note(smallest, shape)
            if note is not None:
                decision.notes[job.id] = note
                if cohorts is not None:
                    cohorts.skip(job)
                continue
            if job.queue in queue_blocked_by:
                decision.notes[job.id] = (
                    f"queue '{job.queue}' is at its quota; waiting behind job {queue_blocked_by[job.queue]}"
                )
                continue
            blocked = None if self.quotas.allows(smallest) else self.quotas.note(smallest)
            verdict = cohorts.verdict(smallest) if cohorts is not None and not blocked else Verdict.OK
            if blocked or verdict is not Verdict.OK:
                plan = self._quota_preemption(smallest, verdict)
                if plan is not None:  # it is the head, waiting for victims that give its quota back
                    self._reserve(job, smallest, *plan)
                    self._hold_quota(smallest)
                else:
                    decision.notes[job.id] = blocked or cohorts.note(smallest, verdict)
                    self._block_queue(queue_blocked_by, job)
                    quota_waits.add(job.queue)  # (a LAS queue is not blocked, but it waits too)
                continue
            if len(sized) > 1:
                sized = [item for item in sized if self._quota_allows(item[0])]

            if self.reservation is None:
                for request, request_shape in sized:
                    placement = self.free.place(request, request_shape)
                    if placement is not None:
                        self._start(job, request, placement)
                        break
                else:
                    self._reserve(job, smallest)
                    # its queue's quota is kept for it too, so that jobs of the same queue that
                    # go ahead cannot leave it without quota when its resources come free
                    self._hold_quota(smallest)
                continue

            why = self._backfill(job, sized)
            if why:
                head = self.reservation.job
                ahead = position - len(decision.admit)
                decision.notes[job.id] = (
                    f"queued behind {ahead} job(s), next in line {head.id} (priority {head.priority}): {why}"
                )
        if self.reservation is None:
            self._grow(quota_waits)
        if policy.las is not None:
            started = {job_id for job_id, _ in decision.admit}
            waiting = [job for job in ordered if job.id not in started and job.id not in running_ids]
            decision.wake_at = policy.las.wake_at(waiting, self.held, self.now, self.served, self.levels)
        return decision

    def _block_queue(self, queue_blocked_by: dict[str, str], job: JobRequest) -> None:
        """The rest of the job's queue waits behind it (a queue stays FIFO), except in a `las`
        queue, where later jobs may pass it unless it is starving (see `las.may_pass`)."""
        las = self.policy.las
        if las is None or not las.may_pass(job, job, self.now):
            queue_blocked_by[job.queue] = job.id

    def _quota_allows(self, request: JobRequest) -> bool:
        """The hard quota allows it, and its cohort lets it start now (an elastic job's size)."""
        if not self.quotas.allows(request):
            return False
        return self.cohorts is None or self.cohorts.verdict(request) is Verdict.OK

    def _hold_quota(self, head: JobRequest) -> None:
        """Keep the head's share of its queue's quota (and cohort pool) for it; not for a head
        of a `las` queue that later jobs may pass (they may take its quota too)."""
        las = self.policy.las
        if las is not None and las.may_pass(head, head, self.now):
            return
        self.quotas.reserve(head)
        if self.cohorts is not None:
            self.cohorts.charge(head)

    def _start(
        self, job: JobRequest, request: JobRequest, placement: dict[str, int], beside_head: bool = False
    ) -> None:
        """Start `job` as `request` (the job at the size it starts at) with this placement."""
        self.free.take(placement, job.per_worker)
        if self.spare is not None:
            if beside_head:  # still running when the head starts: it uses up headroom too
                self.spare.take_headroom(placement, job.per_worker)
            self.spare.refresh(placement)
        self.quotas.charge(request)
        if self.cohorts is not None:
            self.cohorts.charge(request)
        self.decision.admit.append((job.id, placement))
        est_end = None if job.est_runtime_s is None else self.now + job.est_runtime_s
        self.held.append(
            Allocation(
                job.id,
                job.priority,
                placement,
                job.per_worker,
                self.now,
                job.preemptible,
                job.queue,
                est_end,
                sizes=job.sizes,
                user=job.user,
                attained_s=job.attained_s,
                submitted_at=job.submitted_at,
            )
        )

    def _reserve(
        self, job: JobRequest, head: JobRequest, chosen: list[str] | None = None, why: str = "lower-priority"
    ) -> None:
        """The head's reservation (`head`: the job at its smallest size); chooses jobs to shrink
        or victims (into the decision) when that lets it start. `chosen`: victims chosen
        already (`_quota_preemption`), preempted for the reason `why`."""
        stopping = [allocation for allocation in self.running if allocation.stopping]
        victims, shrinks, why = self._stops_for(job, head, stopping, chosen, why)
        if victims and self._reserve_behind(job, head, victims, shrinks, bool(stopping), why):
            return
        self._reserve_at_shadow(head)

    def _stops_for(
        self,
        job: JobRequest,
        head: JobRequest,
        stopping: list[Allocation],
        chosen: list[str] | None,
        why: str,
    ) -> tuple[list[Allocation], dict[str, int] | None, str]:
        """(the running jobs whose stop would make room for the head, the sizes to shrink them
        to when they are shrunk rather than stopped, the reason they are stopped for)."""
        if stopping:
            return stopping, None, why  # stopped for an earlier head, or for this one: wait, choose no more
        if not self.policy.preemption:
            return [], None, why
        by_id = {allocation.job_id: allocation for allocation in self.running}
        shrinks: dict[str, int] | None = None
        if chosen is None:
            # shrink before stop: whole jobs are stopped only when shrinking cannot make room
            shrinks = choose_shrinks(
                head,
                self.running,
                self.policy.nodes,
                self.free.by_node,
                lambda plan: self._come_back(job, plan, by_id),
            )
            if shrinks:
                chosen = list(shrinks)
            else:
                chosen, why = self._victims(head)
        return [by_id[job_id] for job_id in chosen], shrinks, why

    def _reserve_behind(
        self,
        job: JobRequest,
        head: JobRequest,
        victims: list[Allocation],
        shrinks: dict[str, int] | None,
        stopping: bool,
        why: str,
    ) -> bool:
        """Reserve for the head the room that the victims release, when it fits there (the
        decision stops or shrinks them unless they are `stopping` already); whether it did."""
        now, decision, free = self.now, self.decision, self.free.by_node
        # a shrunk job, like a victim, stops whole (checkpointed) and starts again smaller
        future = released(free, victims)
        placement = place(head, future)
        if placement is None:
            return False
        names = [victim.job_id for victim in victims]
        if shrinks:
            decision.resize = dict(shrinks)
            verb = f"shrinking {len(victims)} elastic job(s)"
            names = [f"{v.job_id} {v.workers}->{shrinks[v.job_id]} workers" for v in victims]
        elif not stopping:
            decision.preempt, decision.moving = names, why == MOVE
            verb = (
                f"moving {len(victims)} job(s) to other nodes (free room is spread too thin)"
                if why == MOVE
                else f"preempting {len(victims)} {why} job(s)"
            )
        else:
            verb = f"waiting for {len(victims)} stopping job(s) to release their resources"
        decision.reserved_for = decision.head = head.id
        decision.head_start = now
        decision.notes[head.id] = f"next in line: {verb}: {', '.join(names)}"
        # promised: the head's placement when it starts, and the room that the elastic
        # jobs among those stopping need to start again beside it
        returning = [victim for victim in victims if victim.elastic]
        reserved = None
        if job.sizes or returning:
            reserved, room, _ = self._next_pass(job, future, returning)
        if reserved is None:  # a fixed-size head and no elastic job to come back
            reserved, room = placement, headroom(future, placement, head)
        self.reservation = _Reservation(head, now, reserved, promised=True)
        self.spare = Spare(free, room)
        return True

    def _reserve_at_shadow(self, head: JobRequest) -> None:
        """Reserve for the head the room the running jobs release by their runtime estimates
        (its shadow time); the decision's note says what it waits for."""
        now, decision, free = self.now, self.decision, self.free.by_node
        start, avail = shadow(now, head, free, self.held)
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
        self.spare = Spare(free, headroom(avail, placement, head))

    def _backfill(self, job: JobRequest, sized: list[tuple[JobRequest, Shape]]) -> str:
        """Start `job` ahead of the head if that cannot delay it; else say why not.

        An elastic job tries its sizes largest first, each under the same rules.
        """
        reservation = self.reservation
        head = reservation.job
        known = job.est_runtime_s is not None
        reclaimable = self.policy.preemption and job.preemptible and job.priority < head.priority
        las = self.policy.las
        if not reclaimable and las is not None and las.may_pass(job, head, self.now):
            reclaimable = True  # LAS is work-conserving: only a starving head holds its place
        if not known and not reclaimable:
            return "no runtime estimate and not preemptible by it, so it may not go ahead"
        for request, shape in sized:
            if self._backfill_at(job, request, shape, known, reclaimable):
                return ""
        if reservation.promised:
            return "the free resources are promised to it (waiting for preempted jobs to stop)"
        smallest, shape = sized[-1]
        if self.free.place(smallest, shape) is None:
            need = format_resources(positive(job.per_worker))
            return f"waiting for {smallest.workers} worker(s) of {need}"
        return "starting it now would delay the next job in line"

    def _backfill_at(
        self, job: JobRequest, request: JobRequest, shape: Shape, known: bool, reclaimable: bool
    ) -> bool:
        """Start `job` at the size of `request` by one of the backfill rules; True if it started."""
        reservation, spare = self.reservation, self.spare
        # (a) it ends before the head is expected to start: any free resources will do
        if (
            known
            and not reservation.promised
            and reservation.start is not None
            and self.now + job.est_runtime_s <= reservation.start
        ):
            placement = self.free.place(request, shape)
            if placement is not None:
                self._start(job, request, placement)
                return True
        # (b) beside the head's reserved placement: free now and still free when the head starts
        placement = spare.place(request, shape)
        if placement is not None:
            self._start(job, request, placement, beside_head=True)
            return True
        # (c) preemptible by the head: may use its reserved resources until the head needs them
        if reclaimable and not reservation.promised:
            placement = self.free.place(request, shape)
            if placement is not None:
                self._start(job, request, placement)
                return True
        return False

    # -- elastic jobs: what a resize leads to, and growing ----------------------------------------
