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
   (and fits its queue's quota); only when none does, it is the head, at its smallest size. A
   LAS job that would not fit even beside the running jobs LAS' top share protects alone is
   passed over, not the head (`reservation._held_up_by_share`, issue 51).
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

Steps 1, 2 and the starts are here (`_Pass.run`); steps 3 and 4 in `reservation.py`, the
victims of step 3 in `victims.py`, resizes and step 5 in `elastic.py`.
"""

from __future__ import annotations

from collections.abc import Iterable

from core.queues import DEFAULT_QUEUES, QueueConfig
from orchestrator.policy.admission import free_capacity, oversize_reason, oversize_why
from orchestrator.policy.cohorts import CohortBook, CohortLayout, Verdict
from orchestrator.policy.defrag import DEFAULT_MIN_RUN_S
from orchestrator.policy.elastic import Resizes
from orchestrator.policy.las import Las, LasTuning, las_of
from orchestrator.policy.queue import QuotaBook, order_pending, quota_reason
from orchestrator.policy.reservation import Reservation, Reservations
from orchestrator.policy.room import Shape, Spare, View, at_sizes, shape_of
from orchestrator.policy.types import Allocation, Decision, JobRequest, Node
from orchestrator.policy.victims import Victims

DEFAULT_BACKFILL_WINDOW = 100
DEFAULT_GROW_AFTER_S = 120.0


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
        ordered, served, levels = self._order(now, pending, running, cohorts)
        return _Pass(self, now, running, cohorts, served, levels).run(ordered)

    def order(self, now: float, pending: list[JobRequest], running: list[Allocation]) -> list[JobRequest]:
        """The pending jobs in the order a pass at `now` walks them, which is the order it admits
        them in (step 2); `orchestrator queue` lists the waiting jobs so."""
        running = list(running)
        cohorts = CohortBook(self.cohort_layout, running) if self.cohorts else None
        return self._order(now, pending, running, cohorts)[0]

    def _order(
        self, now: float, pending: list[JobRequest], running: list[Allocation], cohorts: CohortBook | None
    ) -> tuple[list[JobRequest], dict[str, tuple[float, float]], dict[str, int]]:
        """Step 2's order, with the running jobs' LAS service and the pending jobs' LAS levels
        that the rest of the pass reuses."""
        # jobs of cohort queues below their nominal quota go first within their priority
        # (Kueue: no borrowing ahead of a lender), so the backfill window reaches them
        first = cohorts.lenders() if cohorts is not None else set()
        if self.las is None:
            ordered = order_pending(pending)
            if first:
                ordered.sort(key=lambda job: (-job.priority, job.queue not in first))
            return ordered, {}, {}
        served = self.las.served(running, now)
        self.las.begin_pass(pending, running, self.gpus, served)  # before levels: it lifts some
        levels = self.las.pending_levels(pending, now)
        return self.las.order(pending, running, now, first, served, levels), served, levels


class _Pass(Reservations, Victims, Resizes):
    """The state of one scheduling pass (see the module docstring for the steps); the head's
    reservation and backfill, its victims, resizes and growing are the mixins' (`reservation.py`,
    `victims.py`, `elastic.py`)."""

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
        self.reservation: Reservation | None = None
        self.spare: Spare | None = None
        self.beside_protected: View | None = None  # free beside LAS' protected jobs alone, once needed
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
                    if self._held_up_by_share(job, smallest, shape):
                        continue  # it cannot be the head: the next job in line is
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
