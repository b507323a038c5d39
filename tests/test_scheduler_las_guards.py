"""LAS' guards (issue 51), as properties: a waiting job is promoted no later than its
starvation guard says; a running job is never stopped by LAS before its minimum run time;
a head stops no LAS victim before it has waited `preempt_after_s`; no head is a job that the
jobs LAS' top share protects keep from fitting; and every job of a simulated cluster finishes
under the order that ships (`las-share`)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from core.queues import LasSettings, validate_queue_config
from orchestrator.policy import JobRequest, Policy
from orchestrator.policy.las import LAS_SHARE_TUNING, Las
from tests.scheduler_harness import held_up_by_share, simulate_cluster, workloads
from tests.scheduler_helpers import ACCEL

times = st.floats(0, 1e6, allow_nan=False)


@given(
    since=times,
    run_s=st.floats(0, 1e5, allow_nan=False),
    gpus=st.integers(1, 8),
    starve_after_s=st.floats(1, 1e4),
    starve_factor=st.floats(0, 32),
)
def test_no_waiting_job_starves_past_its_guard(since, run_s, gpus, starve_after_s, starve_factor):
    """From `starve_after_s` after it last became pending, and at least `starve_factor` times
    its run so far, a waiting job is at level 0."""
    settings_ = LasSettings(
        thresholds_gpu_s=[10.0, 100.0], starve_after_s=starve_after_s, starve_factor=starve_factor
    )
    las = Las(settings_, ["q"], LAS_SHARE_TUNING)
    waiting = JobRequest(
        "j", 0, 1, {"GPU": float(gpus)}, 0.0, False, "q", attained_s=run_s * gpus, queued_since=since
    )
    guard = max(starve_after_s, starve_factor * run_s) if run_s else starve_after_s
    assert las.promoted_at(waiting) <= since + guard * (1 + 1e-9) + 1e-6
    assert las.pending_level(waiting, since + guard * (1 + 1e-9) + 1e-6) == 0


def _las_config(min_run_s: float, preempt_after_s: float) -> object:
    las = {"thresholds_gpu_s": [4.0, 16.0], "starve_after_s": 6.0, "starve_factor": 1.0}
    las |= {"min_run_s": min_run_s, "preempt_after_s": preempt_after_s}
    return validate_queue_config(
        {"queues": {"default": {"order": "las"}, "research": {"order": "las"}}, "las": las}
    )


@given(
    workloads(),
    st.sampled_from([0.0, 2.0, 5.0]),
    st.sampled_from([0.0, 3.0, 8.0]),
    st.sampled_from([0.0, 0.4]),
)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_las_stops_no_job_before_its_minimum_run_nor_for_a_head_that_has_not_waited(
    workload, min_run_s, preempt_after_s, top_share
):
    """Every LAS victim (of the head's own queue and priority) has run `min_run_s` in its
    current attempt; the head has waited `preempt_after_s` since it was submitted or requeued;
    and every job finishes."""
    nodes, jobs = workload
    tuning = replace(LAS_SHARE_TUNING, top_share=top_share)
    policy = Policy(nodes, queues=_las_config(min_run_s, preempt_after_s), las_tuning=tuning)
    policy.gpus = sum(node.capacity.get(ACCEL, 0.0) for node in nodes)  # the share counts accelerators here
    checked = []

    def check(now, decision, pending, running_now):
        if not decision.preempt or decision.moving:
            return
        head = next(job for job in pending if job.id == decision.reserved_for)
        for allocation in running_now:
            same = allocation.queue == head.queue and allocation.priority == head.priority
            if allocation.job_id not in decision.preempt or not same:
                continue  # stopped for priority or by reclaim: not LAS' business
            checked.append(allocation.job_id)
            assert now - allocation.started_at >= min_run_s - 1e-9
            assert now >= head.submitted_at + preempt_after_s - 1e-9

    sims = simulate_cluster(nodes, jobs, policy, check)
    event("LAS stopped a job" if checked else "no LAS victim")
    assert all(sim.finished is not None for sim in sims.values())


@given(workloads(), st.sampled_from([0.25, 0.4, 0.5]))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_no_head_waits_on_jobs_the_top_share_protects(workload, top_share):
    """Issue 51: a job that would not fit even if every running job but those the top share
    protects were gone is never the head (it could stop none of them, and as the head it held
    GPUs idle and kept the jobs behind it from choosing victims); every job still finishes."""
    nodes, jobs = workload
    tuning = replace(LAS_SHARE_TUNING, top_share=top_share)
    policy = Policy(nodes, queues=_las_config(0.0, 0.0), las_tuning=tuning)
    policy.gpus = sum(node.capacity.get(ACCEL, 0.0) for node in nodes)  # the share counts accelerators here
    capacity = {node.id: node.capacity for node in nodes}
    passed_over: list[str] = []

    def check(now, decision, pending, running_now):
        for job in pending:
            held_up = held_up_by_share(policy, job, running_now, capacity)
            assert not (held_up and job.id == decision.head), f"{job.id} is the head but cannot fit"
            if held_up:
                passed_over.append(job.id)

    sims = simulate_cluster(nodes, jobs, policy, check)
    event("a job was passed over" if passed_over else "none passed over")
    assert all(sim.finished is not None for sim in sims.values())
