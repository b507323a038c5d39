"""Properties of elastic jobs: one pass over random jobs, a resize carried out the way the
service does (stop, requeue with all sizes), and the simulated cluster with elastic jobs.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.policy import Allocation, JobRequest, Node, Policy, QuotaBook, place
from tests.scheduler_harness import SimJob, check_decision, policies, simulate_cluster, workloads
from tests.scheduler_helpers import (
    ACCEL,
    admitted,
    allocations_on,
    clusters,
    comes_back,
    holding,
    job,
    nodes_of,
    requests,
    sizes_of,
)

# -- properties -----------------------------------------------------------------------------------

grow_delays = st.sampled_from([0.0, 3.0, 120.0])


@given(st.data())
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_elastic_pass_invariants(data):
    """One pass over random elastic and fixed jobs: placements within capacity, every start and
    every resize at an allowed size, no job both started and resized (`check_decision`)."""
    nodes = data.draw(clusters())
    busy = data.draw(allocations_on(nodes, elastic=True))
    pending = [
        data.draw(requests(f"p{i}", float(data.draw(st.integers(0, 20))), elastic=True))
        for i in range(data.draw(st.integers(0, 5)))
    ]
    config = data.draw(policies)
    if (
        config["quotas"]
        and QuotaBook(config["quotas"], busy).used["research"].get(ACCEL, 0)
        > config["quotas"]["research"][ACCEL]
    ):
        config["quotas"] = None  # the drawn jobs already hold more than the quota
    policy = Policy(nodes, grow_after_s=data.draw(grow_delays), **config)
    # as the service does: a job that can never start here is refused at submission
    pending = [request for request in pending if policy.rejection_reason(request) is None]
    now = float(data.draw(st.integers(0, 200)))
    decision = policy.schedule(now, pending, busy)
    capacity = {node.id: node.capacity for node in nodes}
    check_decision(policy, capacity, policy.quotas, now, pending, busy, decision)
    for job_id, size in decision.resize.items():
        assert size in next(a for a in busy if a.job_id == job_id).sizes


@st.composite
def busy_cluster(draw, nodes):
    """Running jobs, mostly elastic and preemptible, each at one of its sizes that fits, on a
    cluster about full: the state in which a waiting job shrinks others, or others grow."""
    free = {node.id: dict(node.capacity) for node in nodes}
    out = []
    for index in range(draw(st.integers(1, 6))):
        sizes = ()
        if draw(st.integers(0, 4)):
            sizes = tuple(sorted(draw(st.sets(st.integers(1, 6), min_size=2, max_size=4)), reverse=True))
        request = JobRequest(
            f"r{index}",
            draw(st.integers(0, 2)),
            sizes[0] if sizes else draw(st.integers(1, 3)),
            {ACCEL: draw(st.sampled_from([1.0, 1.0, 2.0])), "cpu": draw(st.sampled_from([0.5, 1.0]))},
            0.0,
            sizes=sizes,
        )
        fitting = [size for size in request.allowed_sizes() if place(request.at_size(size), free)]
        if not fitting:
            continue
        placement = place(request.at_size(draw(st.sampled_from(fitting))), free)
        for node_id, count in placement.items():
            for name, amount in request.per_worker.items():
                free[node_id][name] -= amount * count
        out.append(
            Allocation(
                request.id,
                request.priority,
                placement,
                request.per_worker,
                float(draw(st.integers(0, 20))),
                draw(st.integers(0, 4)) > 0,
                sizes=sizes,
            )
        )
    return out


@given(st.data())
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_resized_job_starts_again_at_no_less_than_its_new_size(data):
    """Carry out a resize the way the service does (stop, requeue with all sizes), then run
    the next passes: every resized job starts again at no less than the size it was given,
    next to the head it was shrunk for, and nothing is ever over capacity."""
    nodes = data.draw(clusters())
    busy = data.draw(busy_cluster(nodes))
    head = data.draw(requests("head", 100.0, elastic=True))
    head.priority = 3
    policy = Policy(nodes, grow_after_s=0.0)
    with_head = data.draw(st.booleans()) and policy.rejection_reason(head) is None
    pending = [head] if with_head else []  # without a head: grows
    capacity = {node.id: node.capacity for node in nodes}
    first = policy.schedule(50, pending, busy)
    check_decision(policy, capacity, policy.quotas, 50, pending, busy, first)
    if not first.resize:
        return
    started = [a for a in busy if a.job_id not in first.resize]
    for job_id, placement in first.admit:  # only the head can start (and then grows follow)
        started.append(
            Allocation(
                job_id, head.priority, placement, head.per_worker, 50, head.preemptible, sizes=head.sizes
            )
        )
    pending = [request for request in pending if request.id not in admitted(first)]
    stopping = [Allocation(**{**a.__dict__, "stopping": True}) for a in busy if a.job_id in first.resize]
    second = policy.schedule(51, pending, started + stopping)
    check_decision(policy, capacity, policy.quotas, 51, pending, started + stopping, second)
    assert second.admit == [] and second.resize == {} and second.preempt == []
    assert second.reserved_for == first.reserved_for

    back = [comes_back(a) for a in busy if a.job_id in first.resize]
    third = policy.schedule(52, pending + back, started)
    check_decision(policy, capacity, policy.quotas, 52, pending + back, started, third)
    got = sizes_of(third)
    if pending:  # the head waited for the shrink
        assert "head" in got
    for job_id, size in first.resize.items():
        assert got.get(job_id, 0) >= size, f"{job_id} was resized to {size} but starts at {got.get(job_id)}"


@given(workloads(elastic=True), policies, grow_delays)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_simulated_cluster_with_elastic_jobs(workload, config, grow_after_s):
    """Jobs arrive, run, are shrunk, grown or preempted and requeued, until every one finishes;
    `check_decision` runs after every pass (capacity, allowed sizes, resizes, promises)."""
    nodes, jobs = workload
    sims = simulate_cluster(nodes, jobs, Policy(nodes, grow_after_s=grow_after_s, **config))
    assert all(sim.finished is not None for sim in sims.values())


def test_simulated_cluster_with_elastic_jobs_resizes_them():
    """The simulation above is not vacuous: on a seeded workload jobs are shrunk and grown."""
    rng = random.Random(3)
    nodes = [Node(f"n{i}", {ACCEL: 8.0, "cpu": 32.0}) for i in range(4)]
    jobs = []
    for index in range(60):
        sizes = rng.choice([(), (8, 4, 2), (4, 2, 1), (16, 8, 4)])
        workers = sizes[0] if sizes else rng.choice([1, 2, 4])
        request = JobRequest(
            f"j{index:02d}",
            rng.choice([0, 0, 1, 2]),
            workers,
            {ACCEL: 1.0, "cpu": 2.0},
            float(rng.randint(0, 100)),
            rng.random() < 0.7,
            sizes=sizes,
        )
        jobs.append(SimJob(request, float(rng.randint(5, 60)), rng.choice(["exact", "none"])))
    shrinks, grows = [], []

    def count(now, decision, pending, running_now):
        by_id = {a.job_id: a for a in running_now}
        for job_id, size in decision.resize.items():
            (shrinks if size < by_id[job_id].workers else grows).append(job_id)

    sims = simulate_cluster(nodes, jobs, Policy(nodes, grow_after_s=10.0), count)
    assert len(sims) == 60
    assert shrinks and grows


def test_the_resize_checks_are_live():
    """`check_decision` catches a policy that resizes a job of one size, or grows while a job waits."""

    class ResizesFixed(Policy):
        def schedule(self, now, pending, running_now):
            decision = super().schedule(now, pending, running_now)
            for allocation in running_now:
                if not allocation.stopping and allocation.job_id not in decision.preempt:
                    decision.resize[allocation.job_id] = allocation.workers + 1
            return decision

    nodes = nodes_of(4)
    jobs = [SimJob(job("a", workers=2), 3, "exact"), SimJob(job("b", workers=1, submitted_at=1), 3, "exact")]
    with pytest.raises(AssertionError):
        simulate_cluster(nodes, jobs, ResizesFixed(nodes))

    policy = Policy(nodes, grow_after_s=0)
    waiting = [job("waiting", workers=3)]
    busy = [holding("v", {"n0": 2}, sizes=(4, 2), priority=1)]
    decision = policy.schedule(10, waiting, busy)
    check_decision(policy, {"n0": nodes[0].capacity}, {}, 10, waiting, busy, decision)
    decision.resize = {"v": 4}  # a grow while "waiting" waits
    with pytest.raises(AssertionError):
        check_decision(policy, {"n0": nodes[0].capacity}, {}, 10, waiting, busy, decision)
