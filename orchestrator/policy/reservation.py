"""The head of the queue in a pass: its reservation (step 3) and backfill around it (step 4).

`Reservations` is the part of `policy._Pass` that reserves room for the head, the first
pending job that does not start (the steps are in `policy.py`'s docstring): behind the jobs it
shrinks or stops, or the victims of an earlier pass still stopping (`victims.py`,
`preemption.py`), or else at its shadow time by the running jobs' runtime estimates
(`room.shadow`); and that lets later jobs start ahead of it only when they cannot delay it
(EASY backfill). It reads the pass's state and starts jobs through `_Pass._start`.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.policy.admission import EPS, format_resources, free_capacity, place, positive
from orchestrator.policy.preemption import choose_shrinks
from orchestrator.policy.room import Shape, Spare, View, headroom, released, shadow
from orchestrator.policy.types import Allocation, JobRequest
from orchestrator.policy.victims import MOVE


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


@dataclass
class Reservation:
    """Where and when the head job is expected to start, and whether it waits for victims."""

    job: JobRequest
    start: float | None  # None: depends on jobs without a runtime estimate
    placement: dict[str, int]
    promised: bool  # the head waits for victims: nothing may use its resources, even briefly


class Reservations:
    """The head's reservation and backfill around it (mixed into `policy._Pass`)."""

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

    def _held_up_by_share(self, job: JobRequest, head: JobRequest, shape: Shape) -> bool:
        """Whether `head` (the job at its smallest size) would not fit even if every running job
        but those LAS' top share protects were gone. It could stop none of them and cannot know
        when they end, so as the head it would only hold GPUs idle and keep the jobs behind it
        from choosing victims: the next job in line is the head instead (the note says why)."""
        las = self.policy.las
        if las is None or not las.protected or job.queue not in las.queues:
            return False
        if self.beside_protected is None:  # the same for every job of the pass
            kept = [allocation for allocation in self.running if allocation.job_id in las.protected]
            self.beside_protected = View(free_capacity(self.policy.nodes, kept))
        if self.beside_protected.place(head, shape) is not None:
            return False
        self.decision.notes[job.id] = (
            "waiting for jobs that LAS' top share protects to end: it does not fit beside them"
        )
        return True

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
        self.reservation = Reservation(head, now, reserved, promised=True)
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
        self.reservation = Reservation(head, start, placement, promised=False)
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
