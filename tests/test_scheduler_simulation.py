"""The scheduling policy on a simulated cluster (tests/scheduler_harness.py): hypothesis
workloads run until every job finishes, with the invariants checked after every decision
(capacity, gangs, no job twice, quotas, victims only for a reason, promises kept).
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from bench.fifo import FifoPolicy
from core.queues import validate_queue_config
from orchestrator.policy import JobRequest, Node, Policy
from orchestrator.policy.las import LasTuning
from tests.scheduler_harness import SimJob, mostly, policies, simulate_cluster, workloads
from tests.scheduler_helpers import ACCEL, EPS, FIFO, job, nodes_of

# equal nodes with room for several jobs each: where free room ends up spread over nodes
even_clusters = st.integers(2, 4).map(lambda n: [Node(f"n{i}", {ACCEL: 4.0, "cpu": 6.0}) for i in range(n)])


@st.composite
def crowded(draw):
    """Equal nodes and a burst of preemptible jobs of a few workers each: free room ends up
    spread over the nodes, where moves happen."""
    nodes = draw(even_clusters)
    jobs = []
    for index in range(draw(st.integers(4, 12))):
        per_worker = {ACCEL: draw(st.sampled_from([1.0, 2.0, 3.0])), "cpu": 0.5}
        request = JobRequest(
            f"j{index}", 0, draw(st.integers(1, 2)), per_worker, float(draw(st.integers(0, 4))), True,
            draw(st.sampled_from(["default", "research"])),
        )  # fmt: skip
        estimate = draw(st.sampled_from(["none", "exact"]))
        jobs.append(SimJob(request, float(draw(st.integers(4, 15))), estimate))
    return nodes, jobs


@given(workloads() | crowded(), policies)
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_simulated_cluster_invariants(workload, config):
    nodes, jobs = workload
    moved = []
    simulate_cluster(nodes, jobs, Policy(nodes, **config), lambda *args: moved.append(args[1].moving))
    event("a run with moves" if any(moved) else "no moves")


@st.composite
def queue_configs(draw):
    """Both queues of the workloads `las` or `fifo`, in one cohort or none, with LAS levels,
    promotion and minimum run times short enough to act within the workloads' seconds."""
    orders = [draw(st.sampled_from(["las", "las", "fifo"])) for _ in range(2)]
    cohort = draw(st.booleans())
    queues = {}
    for name, order in zip(("default", "research"), orders):
        queues[name] = {"order": order}
        if cohort:
            queues[name] |= {"cohort": "lab", "nominal": {ACCEL: float(draw(st.integers(0, 3)))}}
    las = {"thresholds_gpu_s": [4.0, 16.0], "starve_after_s": 6.0, "starve_factor": 1.0}
    las["min_run_s"] = float(draw(st.sampled_from([0, 2, 5])))
    return validate_queue_config({"cohorts": ["lab"] if cohort else [], "queues": queues, "las": las})


@given(
    workloads() | crowded(),
    queue_configs(),
    st.sampled_from([0.0, 3.0, math.inf]),
    mostly,
)
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_simulated_cluster_invariants_with_las_cohorts_and_moves(workload, queues, move_after_s, preemption):
    """Capacity, gangs, no job twice, quotas, victims only for a reason the policy has, the
    head's promised room kept, and every job finishes (a promoted job is not starved: the run
    ends and never livelocks, with promotion after 6 s of waiting)."""
    nodes, jobs = workload
    policy = Policy(nodes, queues=queues, move_after_s=move_after_s, preemption=preemption)
    seen = set()

    def note(now, decision, pending, running_now):
        if decision.preempt:
            seen.add("moves" if decision.moving else "preemptions")

    sims = simulate_cluster(nodes, jobs, policy, note)
    for what in seen:
        event(f"a run with {what}")
    assert all(sim.finished is not None for sim in sims.values())


@given(
    workloads() | crowded(),
    queue_configs(),
    st.sampled_from([0.25, 0.5, 1.0]),
    st.sampled_from(["latest-submitted", "recently-started"]),
)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_simulated_cluster_invariants_with_tuned_las(workload, queues, top_share, victims):
    """The same invariants with the tuned LAS (`las.LasTuning`: victims in reverse queue order,
    the top level's share of the cluster, protected and lifted oldest first): every job
    finishes, and no pass livelocks."""
    nodes, jobs = workload
    policy = Policy(nodes, queues=queues, las_tuning=LasTuning(victims=victims, top_share=top_share))
    policy.gpus = sum(node.capacity.get(ACCEL, 0.0) for node in nodes)  # the share counts accelerators here
    lifted = []

    def note(now, decision, pending, running_now):
        if policy.las is not None and (policy.las.lifted or policy.las.protected):
            lifted.append(True)

    sims = simulate_cluster(nodes, jobs, policy, note)
    event("the top share acted" if lifted else "the top share idle")
    assert all(sim.finished is not None for sim in sims.values())


@given(workloads(), st.builds(dict, quotas=st.none() | st.just({"research": {ACCEL: 3.0}})))
@settings(max_examples=100, deadline=None)
def test_fifo_policy_invariants(workload, config):
    nodes, jobs = workload
    simulate_cluster(nodes, jobs, FifoPolicy(nodes, **config))


@given(workloads(batch=True, estimates=("exact",)), st.integers(0, 6))
@settings(max_examples=200, deadline=None)
def test_backfill_never_delays_the_head(workload, window):
    """With exact estimates, every job that was once the head starts no later than promised then."""
    nodes, jobs = workload
    promised: dict[str, float] = {}

    def remember(now, decision, pending, running_now):
        if decision.head is not None and decision.head_start is not None:
            promised.setdefault(decision.head, decision.head_start)

    policy = Policy(nodes, preemption=False, backfill_window=window, queues=FIFO)  # LAS passes heads
    sims = simulate_cluster(nodes, jobs, policy, remember)
    for job_id, start in promised.items():
        assert sims[job_id].first_start <= start + EPS, f"{job_id} was promised t={start}"


def test_property_simulation_catches_a_broken_policy():
    """The invariant checks are live: a policy that starts jobs half-placed is caught."""

    class Partial(Policy):
        def schedule(self, now, pending, running_now):
            decision = super().schedule(now, pending, running_now)
            decision.admit = [(j, {n: c + 1 for n, c in p.items()}) for j, p in decision.admit]
            return decision

    nodes = nodes_of(4)
    with pytest.raises(AssertionError):
        simulate_cluster(nodes, [SimJob(job("a", workers=2), 3, "exact")], Partial(nodes))


def test_simulated_cluster_with_many_random_jobs():
    """A larger seeded run than hypothesis draws: many jobs, every feature on."""
    rng = random.Random(7)
    nodes = [Node(f"n{i}", {ACCEL: 8.0, "cpu": 32.0}) for i in range(6)]
    jobs = []
    for index in range(120):
        request = JobRequest(
            f"j{index:03d}",
            rng.choice([0, 0, 1, 2]),
            rng.choice([1, 1, 2, 4, 8]),
            {ACCEL: rng.choice([1.0, 2.0]), "cpu": rng.choice([1.0, 4.0])},
            float(rng.randint(0, 200)),
            rng.random() < 0.5,
            rng.choice(["default", "research"]),
        )
        jobs.append(SimJob(request, float(rng.randint(1, 60)), rng.choice(["exact", "none", "noisy"])))
    sims = simulate_cluster(
        nodes, jobs, Policy(nodes, quotas={"research": {ACCEL: 16.0}}, backfill_window=10)
    )
    assert len(sims) == 120
    assert sum(len(sim.starts) > 1 for sim in sims.values()) > 0  # some were preempted and restarted
