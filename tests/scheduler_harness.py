"""The simulated cluster of the policy's property tests (tests/test_scheduler_*.py): jobs
arrive, run, are preempted or resized and requeued until every one finishes, and every
decision is checked against the invariants (`check_decision`).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from hypothesis import strategies as st

from bench.fifo import FifoPolicy
from orchestrator.policy import Allocation, JobRequest, Node, QuotaBook, free_capacity, place, queue_key
from orchestrator.policy.las import service_rate
from tests.scheduler_helpers import ACCEL, EPS, FIFO, admitted, clusters, requests

# A small event-driven cluster: jobs arrive, run for their duration, are preempted (they stop
# `ACK` later and are requeued with their remaining work and original submission time).
ACK = 1.0


@dataclass
class SimJob:
    request: JobRequest
    duration: float
    estimate: str  # "exact", "none" or "noisy"
    remaining: float = 0.0
    started: float | None = None
    first_start: float | None = None
    finished: float | None = None
    generation: int = 0
    starts: list[float] = field(default_factory=list)
    served: float = 0.0  # LAS service of its finished attempts (`las.service_rate` x seconds)

    def pending_request(self) -> JobRequest:
        r = self.request
        est = {"exact": self.remaining, "none": None, "noisy": self.remaining * 1.7}[self.estimate]
        return JobRequest(
            r.id, r.priority, r.workers, r.per_worker, r.submitted_at, r.preemptible, r.queue, est, r.sizes,
            attained_s=self.served,
        )  # fmt: skip


@st.composite
def workloads(draw, batch=False, estimates=("exact", "none", "noisy"), elastic=False):
    nodes = draw(clusters())
    jobs = []
    for index in range(draw(st.integers(2, 12))):
        submitted = 0.0 if batch else float(draw(st.integers(0, 10)))
        request = draw(requests(f"j{index}", submitted, elastic))
        jobs.append(SimJob(request, float(draw(st.integers(1, 15))), draw(st.sampled_from(estimates))))
    return nodes, jobs


def simulate_cluster(nodes, jobs, policy, on_decision=None):
    """Run every job to the end; check the invariants after every decision; return the jobs."""
    capacity = {node.id: node.capacity for node in nodes}
    quotas = policy.quotas
    sims = {j.request.id: j for j in jobs if policy.rejection_reason(j.request) is None}
    for sim in sims.values():
        sim.remaining = sim.duration
    events = [(sim.request.submitted_at, 0, "arrive", sim.request.id, 0) for sim in sims.values()]
    heapq.heapify(events)
    pending: dict[str, JobRequest] = {}
    run: dict[str, Allocation] = {}
    seq, passes = 1, 0
    while events:
        now = events[0][0]
        while events and events[0][0] == now:
            _, _, kind, job_id, generation = heapq.heappop(events)
            sim = sims[job_id]
            if kind == "arrive":
                pending[job_id] = sim.pending_request()
            elif generation == sim.generation and kind == "finish":
                del run[job_id]
                sim.finished, sim.generation = now, sim.generation + 1
            elif generation == sim.generation and kind == "stopped":
                stopped = run.pop(job_id)
                sim.served += (now - sim.started) * service_rate(stopped.per_worker, stopped.workers)
                sim.remaining -= now - sim.started
                sim.generation += 1
                pending[job_id] = sim.pending_request()
        passes += 1
        assert passes < 40 * len(sims) + 50, "the cluster never settles (scheduling livelock)"
        before_pending, before_running = list(pending.values()), list(run.values())
        decision = policy.schedule(now, before_pending, before_running)
        check_decision(policy, capacity, quotas, now, before_pending, before_running, decision)
        if on_decision:
            on_decision(now, decision, before_pending, before_running)
        for victim in [*decision.preempt, *decision.resize]:  # a resize: stopped, then admitted again
            run[victim].stopping = True
            heapq.heappush(events, (now + ACK, seq, "stopped", victim, sims[victim].generation))
            seq += 1
        for job_id, placement in decision.admit:
            request = pending.pop(job_id)
            sim = sims[job_id]
            est_end = None if request.est_runtime_s is None else now + request.est_runtime_s
            run[job_id] = Allocation(
                job_id,
                request.priority,
                placement,
                request.per_worker,
                now,
                request.preemptible,
                request.queue,
                est_end,
                sizes=request.sizes,
                attained_s=request.attained_s,
                submitted_at=request.submitted_at,
            )
            sim.started, sim.generation = now, sim.generation + 1
            sim.first_start = now if sim.first_start is None else sim.first_start
            sim.starts.append(now)
            heapq.heappush(events, (now + sim.remaining, seq, "finish", job_id, sim.generation))
            seq += 1
    assert not pending and not run
    assert all(sim.finished is not None for sim in sims.values()), "every job finishes"
    return sims


def _may_stop(policy, now, head, allocation, moving) -> bool:
    """Each reason a pass has to stop a running job for `head` (`victims.py`)."""
    if allocation.preemptible and allocation.priority < head.priority:
        return True  # priority
    if moving:  # to move it elsewhere: consent as to preemption, and it has run long enough
        return (
            allocation.preemptible
            and allocation.priority <= head.priority
            and now - allocation.started_at >= policy.move_after_s
        )
    las = policy.las is not None and policy.las.eligible(head, now)
    if las and las(allocation):
        return True  # LAS: its own queue and priority, more served, past its minimum run time
    config = policy.queue_config
    if config is None:
        return False
    queue = config.queues.get(head.queue)
    # reclaim: a borrower of the head's cohort, from another queue
    mine, theirs = queue and queue.cohort, config.queues.get(allocation.queue)
    return bool(mine) and theirs is not None and theirs.cohort == mine and allocation.queue != head.queue


def check_decision(policy, capacity, quotas, now, pending, running_now, decision):
    by_id = {r.id: r for r in pending}
    running_by_id = {a.job_id: a for a in running_now}
    ids = admitted(decision)
    # no job starts twice, and only pending jobs start
    assert len(set(ids)) == len(ids)
    assert all(i in by_id and i not in running_by_id for i in ids)
    # all of a job's workers, each whole on one node, and no node over capacity
    used = {n: {r: 0.0 for r in cap} for n, cap in capacity.items()}
    new = []
    for job_id, placement in decision.admit:
        request = by_id[job_id]
        assert sum(placement.values()) in request.allowed_sizes() and all(c > 0 for c in placement.values())
        new.append(
            Allocation(
                job_id,
                request.priority,
                placement,
                request.per_worker,
                now,
                request.preemptible,
                request.queue,
            )
        )
    for allocation in running_now + new:
        for node_id, count in allocation.placement.items():
            for name, amount in allocation.per_worker.items():
                used[node_id][name] += amount * count
    for node_id, node_used in used.items():
        for name, amount in node_used.items():
            assert amount <= capacity[node_id][name] + EPS, f"{node_id} over capacity in {name}"
    # no queue over its quota
    book = QuotaBook(quotas, running_now + new)
    for queue, limits in quotas.items():
        for name, limit in limits.items():
            assert book.used[queue].get(name, 0.0) <= limit + EPS, f"queue {queue} over its quota"
    # victims: running, not stopping, preemptible, lower priority than the job they make room for;
    # none while earlier victims are still stopping
    if decision.preempt:
        assert decision.reserved_for in by_id
        head = by_id[decision.reserved_for]
        assert not any(a.stopping for a in running_now)
        for victim in decision.preempt:
            allocation = running_by_id[victim]
            assert not allocation.stopping
            assert _may_stop(policy, now, head, allocation, decision.moving), f"{victim} may not be stopped"
    check_resizes(policy, now, by_id, running_now, decision)
    # the job waiting for victims fits once they (and all stopping jobs) are gone, after this
    # decision's starts: nothing was placed into what is promised to it
    if decision.reserved_for is not None:
        head = by_id[decision.reserved_for]
        head = head.at_size(head.allowed_sizes()[-1])  # an elastic head waits for its smallest size
        released = (
            {a.job_id for a in running_now if a.stopping} | set(decision.preempt) | set(decision.resize)
        )
        free = free_capacity(
            [Node(n, c) for n, c in capacity.items()],
            [a for a in running_now if a.job_id not in released] + new,
        )
        assert place(head, free) is not None, "resources promised to the waiting job were given away"
    if isinstance(policy, FifoPolicy):
        # FIFO: nothing starts while a job submitted before it waits
        fifo_key = lambda r: (r.submitted_at, r.id)
        for job_id in ids:
            waiting = [r for r in pending if r.id not in ids and fifo_key(r) < fifo_key(by_id[job_id])]
            assert not waiting, f"{job_id} started before {waiting[0].id} under FIFO"
        return
    if policy.cohorts:
        return  # lenders-first reorders a priority level, cohort quotas hold jobs (test_scheduler_cohorts)
    # a job starts ahead of a waiting job earlier in the pass's order (priority, then FIFO or the
    # LAS order within a level) only by backfill, or by LAS' passing within a level
    las = policy.las
    order = las.order(pending, running_now, now) if las is not None else sorted(pending, key=queue_key)
    rank = {request.id: position for position, request in enumerate(order)}
    head = by_id.get(decision.head) if decision.head else None
    for job_id in ids:
        started = by_id[job_id]
        for waiting in pending:
            if waiting.id in ids or rank[waiting.id] >= rank[started.id]:
                continue
            if not book.allows(smallest(waiting)) or _queue_blocked(waiting, pending, ids, book, rank):
                continue  # held by its queue's quota, which never holds up other queues
            if held_up_by_share(policy, waiting, running_now, capacity):
                continue  # jobs LAS' top share protects keep it from fitting: it is not the head
            assert policy.backfill, f"{job_id} passed {waiting.id} without backfill"
            assert head is not None and rank[head.id] <= rank[waiting.id]
            may_backfill = (
                started.est_runtime_s is not None
                or (started.preemptible and policy.preemption and started.priority < head.priority)
                or (las is not None and las.may_pass(started, head, now))
            )
            assert may_backfill, f"{job_id} (no estimate, not preemptible by {head.id}) passed {waiting.id}"


def _queue_blocked(waiting, pending, ids, book, rank) -> bool:
    """An earlier job of the same queue is over the quota, so the queue waits behind it."""
    return any(
        other.queue == waiting.queue
        and other.id not in ids
        and rank[other.id] < rank[waiting.id]
        and not book.allows(smallest(other))
        for other in pending
    )


def held_up_by_share(policy, waiting: JobRequest, running_now, capacity) -> bool:
    """It would not fit even beside the running jobs LAS' top share protects alone (issue 51)."""
    las = policy.las
    if las is None or not las.protected or waiting.queue not in las.queues:
        return False
    kept = [allocation for allocation in running_now if allocation.job_id in las.protected]
    return place(smallest(waiting), free_capacity([Node(n, c) for n, c in capacity.items()], kept)) is None


def smallest(request: JobRequest) -> JobRequest:
    """An elastic job at its smallest size (what quotas and reservations judge it by)."""
    return request.at_size(request.allowed_sizes()[-1])


def check_resizes(policy, now, pending_by_id, running_now, decision):
    """Resizes: running elastic jobs, to another allowed size; shrinks only for the job they make
    room for (never alongside preemption or while jobs stop), grows only when nothing waits."""
    running_by_id = {a.job_id: a for a in running_now}
    assert not set(decision.resize) & set(admitted(decision)), "a job both started and resized"
    assert not set(decision.resize) & set(decision.preempt), "a job both preempted and resized"
    if isinstance(policy, FifoPolicy):
        assert not decision.resize
    for job_id, size in decision.resize.items():
        allocation = running_by_id[job_id]
        assert allocation.elastic and not allocation.stopping
        assert size in allocation.sizes and size != allocation.workers
        assert not any(a.stopping for a in running_now)
        if size < allocation.workers:  # a shrink, for the head
            assert policy.preemption and not decision.preempt
            assert decision.reserved_for is not None and decision.head == decision.reserved_for
            assert (
                allocation.preemptible and allocation.priority < pending_by_id[decision.reserved_for].priority
            )
        else:  # a grow: nothing waits
            assert decision.head is None and decision.reserved_for is None
            assert now - allocation.started_at >= policy.grow_after_s


mostly = st.sampled_from([True, True, True, False])
policies = st.builds(
    dict,
    backfill=mostly,
    preemption=mostly,
    backfill_window=st.sampled_from([0, 1, 3, 6, 100]),
    quotas=st.none() | st.builds(lambda a: {"research": {ACCEL: float(a)}}, st.integers(1, 6)),
    move_after_s=st.sampled_from([0.0, 3.0, math.inf]),
    queues=st.sampled_from([None, FIFO]),  # the default order (las-share), or strict FIFO
)
