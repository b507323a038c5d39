"""Least attained service (orchestrator/policy/las.py) through `Policy(queues=...)`: order,
demotion, promotion of starving jobs, minimum run time, and the tuned order `las-share`
(victims in reverse queue order, the top level's share), also as the queue file's
`order: las-share` and as the default order of every queue."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from core.queues import validate_queue_config
from orchestrator.policy import Allocation, JobRequest, Node, Policy
from orchestrator.policy.las import LAS_SHARE_SETTINGS, LAS_SHARE_TUNING, Las, LasTuning, attained, las_of

HOUR = 3600.0
CONFIG = validate_queue_config(
    {
        "queues": {"lq": {"order": "las"}, "fq": {"order": "fifo"}},
        "las": {"thresholds_gpu_s": [HOUR, 10 * HOUR], "starve_after_s": 4 * HOUR, "min_run_s": 600},
    }
)


def nodes(count: int = 1, gpus: float = 4.0) -> list[Node]:
    return [Node(f"n{i}", {"GPU": gpus}) for i in range(count)]


def job(name, gpus=1, submitted=0.0, attained=0.0, queue="lq", priority=0, queued_since=None, user=None):
    return JobRequest(
        name, priority, 1, {"GPU": float(gpus)}, submitted, False, queue,
        user=user, attained_s=attained, queued_since=queued_since,
    )  # fmt: skip


def running(
    name, gpus=1, started=0.0, attained=0.0, queue="lq", node="n0", priority=0, user=None, submitted=None
):
    per_worker = {"GPU": float(gpus)}
    return Allocation(
        name, priority, {node: 1}, per_worker, started, False, queue, user=user, attained_s=attained,
        submitted_at=submitted,
    )  # fmt: skip


def test_less_served_jobs_go_first_within_a_priority_level():
    las = Las(CONFIG.las, CONFIG.las_queues())
    old_heavy = job("heavy", submitted=0.0, attained=2 * HOUR)  # level 1
    new_light = job("light", submitted=100.0)  # level 0
    high = job("high", submitted=200.0, attained=20 * HOUR, priority=1)  # strict priority stays
    fifo_job = job("fifo", submitted=50.0, attained=20 * HOUR, queue="fq")  # a fifo queue: level 0
    order = [j.id for j in las.order([old_heavy, new_light, high, fifo_job], [], now=300.0)]
    assert order == ["high", "fifo", "light", "heavy"]


def test_order_is_by_level_then_submission_property():
    rng = random.Random(7)
    las = Las(CONFIG.las, CONFIG.las_queues())
    for _ in range(200):
        jobs = [
            job(f"j{i}", submitted=rng.uniform(0, 1000), attained=rng.choice([0, 2 * HOUR, 20 * HOUR]),
                priority=rng.randint(0, 2))
            for i in range(rng.randint(1, 12))
        ]  # fmt: skip
        keys = [
            (-j.priority, las.pending_level(j, 1000.0), j.submitted_at) for j in las.order(jobs, [], 1000.0)
        ]
        assert keys == sorted(keys)


def test_users_share_a_queue_by_attained_service():
    las = Las(CONFIG.las, CONFIG.las_queues())
    busy_user = running("r", attained=0.0, started=0.0, user="ann")  # ann has had 1000 GPU-s so far
    jobs = [job("ann-2", submitted=10.0, user="ann"), job("bob-1", submitted=20.0, user="bob")]
    assert [j.id for j in las.order(jobs, [busy_user], now=1000.0)] == ["bob-1", "ann-2"]


def test_attained_service_adds_the_current_attempt():
    allocation = running("r", gpus=2, started=100.0, attained=500.0)
    assert attained(allocation, 400.0) == 500.0 + 300.0 * 2


def test_a_demoted_job_is_preempted_by_a_new_one_after_its_minimum_run_time():
    policy = Policy(nodes(1, 1.0), queues=CONFIG)
    # "long" started at t=0 with no earlier service: it passes 1 GPU-hour (level 1) at t=3600
    long_job = running("long", started=0.0)
    fresh = job("fresh", submitted=3000.0)
    before = policy.schedule(3000.0, [fresh], [long_job])
    assert before.preempt == [] and before.admit == []
    assert before.wake_at == HOUR  # the pass to come when "long" drops a level
    after = policy.schedule(HOUR + 1, [fresh], [long_job])
    assert after.preempt == ["long"] and after.reserved_for == "fresh"
    assert "LAS" in after.notes["fresh"]


def test_minimum_run_time_between_preemptions():
    policy = Policy(nodes(1, 1.0), queues=CONFIG)
    # demoted by earlier attempts, restarted 300 s ago: not stopped again before 600 s of running
    restarted = running("restarted", started=1000.0, attained=2 * HOUR)
    fresh = job("fresh", submitted=1200.0)
    decision = policy.schedule(1300.0, [fresh], [restarted])
    assert decision.preempt == []
    assert decision.wake_at == 1600.0
    assert policy.schedule(1600.0, [fresh], [restarted]).preempt == ["restarted"]


def test_las_never_preempts_other_queues_priorities_or_equal_levels():
    policy = Policy(nodes(1, 3.0), queues=CONFIG)
    held = [
        running("other-queue", started=0.0, attained=20 * HOUR, queue="fq"),
        running("higher", started=0.0, attained=20 * HOUR, priority=1),
        running("same-level", started=0.0),  # 1000 GPU-s: level 0, like the head
    ]
    decision = policy.schedule(1000.0, [job("fresh", submitted=900.0)], held)
    assert decision.preempt == []


def test_las_is_work_conserving_but_a_starving_job_holds_its_place():
    policy = Policy(nodes(1, 4.0), queues=CONFIG)
    held = [running("r", gpus=2, started=0.0)]
    big = job("big", gpus=4, submitted=100.0)
    small = job("small", gpus=1, submitted=200.0)
    passing = policy.schedule(1000.0, [big, small], held)
    assert [job_id for job_id, _ in passing.admit] == ["small"]  # FIFO would block it behind "big"
    starving = job("big", gpus=4, submitted=100.0, queued_since=100.0)
    later = 100.0 + 4 * HOUR
    held_late = [running("r", gpus=2, started=later - 100)]  # ran less than min_run_s: no victim
    waits = policy.schedule(later, [starving, small], held_late)
    assert waits.admit == [] and waits.head == "big"


def test_a_starving_job_is_promoted_to_level_zero():
    las = Las(CONFIG.las, CONFIG.las_queues())
    # 2 GPU-hours on 1 GPU so far: it waits max(4 h, 4 x 2 h) = 8 h before it is promoted
    heavy = job("heavy", submitted=0.0, attained=2 * HOUR, queued_since=1000.0)
    fresh = job("fresh", submitted=5000.0)
    assert [j.id for j in las.order([heavy, fresh], [], now=1000.0 + 5 * HOUR)] == ["fresh", "heavy"]
    promoted_at = 1000.0 + 8 * HOUR
    assert [j.id for j in las.order([heavy, fresh], [], now=promoted_at)] == ["heavy", "fresh"]
    assert las.wake_at([heavy], [], now=2000.0) == promoted_at
    never_ran = job("never-ran", submitted=0.0, queued_since=0.0)
    assert las.promoted_at(never_ran) == 4 * HOUR


def test_the_default_order_is_las_share_and_fifo_ignores_las_fields():
    """With no queue file every queue is `las-share`: the job with the least service goes
    first and may preempt; a FIFO order (`order: fifo`) keeps the level's submission order."""
    held = [running("long", started=0.0, attained=50 * HOUR)]
    jobs = [job("a", submitted=0.0, attained=50 * HOUR), job("b", submitted=1.0)]
    default = Policy(nodes(1, 1.0))
    assert default.las.tuning == LAS_SHARE_TUNING
    assert default.las.thresholds == LAS_SHARE_SETTINGS.thresholds_gpu_s
    decision = default.schedule(10 * HOUR, jobs, held)
    assert decision.preempt == ["long"] and decision.reserved_for == "b"  # level 0 against level 2
    fifo = Policy(nodes(1, 1.0), queues=validate_queue_config({"order": "fifo"}))
    decision = fifo.schedule(10 * HOUR, jobs, held)
    assert decision.preempt == [] and decision.head == "a" and decision.wake_at is None


# -- the tuned order (`LasTuning`): levels of 1 and 10 GPU-hours here, top level = 2
BY_SUBMISSION = LasTuning(victims="latest-submitted")
TOP_HALF = LasTuning(victims="latest-submitted", top_share=0.5)


def test_tuned_victims_are_the_latest_submitted_of_the_highest_level():
    policy = Policy(nodes(1, 2.0), queues=CONFIG, las_tuning=BY_SUBMISSION)
    held = [
        running("old", started=5 * HOUR, attained=20 * HOUR, submitted=0.0),  # restarted last
        running("young", started=HOUR, attained=20 * HOUR, submitted=100.0),
    ]
    decision = policy.schedule(6 * HOUR, [job("fresh", submitted=6 * HOUR)], held)
    assert decision.preempt == ["young"]  # plain LAS takes "old", the most recently started
    plain = Policy(nodes(1, 2.0), queues=CONFIG).schedule(6 * HOUR, [job("fresh", submitted=6 * HOUR)], held)
    assert plain.preempt == ["old"]


def test_top_share_protects_the_oldest_long_jobs_and_not_more():
    policy = Policy(nodes(1, 4.0), queues=CONFIG, las_tuning=TOP_HALF)  # 2 of 4 GPUs for the top level
    held = [
        running(f"long{i}", started=0.0, attained=20 * HOUR, submitted=float(i), node="n0") for i in range(4)
    ]
    first = policy.schedule(HOUR, [job("a", submitted=HOUR)], held)
    assert first.preempt == ["long3"]  # the latest submitted; long0 and long1 hold the share
    third = policy.schedule(HOUR, [job("c", gpus=3, submitted=HOUR)], held)
    assert third.preempt == [] and third.head is None  # only 2 GPUs may be taken from the top level
    assert "top share" in third.notes["c"]  # and it cannot fit beside them: not the head (issue 51)


def test_top_share_lifts_the_oldest_waiting_long_job():
    policy = Policy(nodes(1, 2.0), queues=CONFIG, las_tuning=TOP_HALF)  # 1 of 2 GPUs
    held = [running("short", started=1.5 * HOUR), running("mid", started=0.0, attained=2 * HOUR)]
    long_job = job("long", submitted=0.0, attained=20 * HOUR, queued_since=HOUR)  # not starving yet
    fresh = job("fresh", submitted=2 * HOUR)
    decision = policy.schedule(2 * HOUR, [fresh, long_job], held)
    assert decision.reserved_for == "long" and decision.preempt == ["mid"]  # level 1, not level 0
    plain = Policy(nodes(1, 2.0), queues=CONFIG, las_tuning=BY_SUBMISSION)
    assert plain.schedule(2 * HOUR, [fresh, long_job], held).reserved_for == "fresh"


def test_running_jobs_without_a_submission_time_count_from_their_start():
    las = Las(CONFIG.las, CONFIG.las_queues(), BY_SUBMISSION)
    rank = las.rank(now=2 * HOUR)
    early, late = running("early", started=0.0, attained=20 * HOUR), running("late", started=HOUR)
    assert sorted([early, late], key=rank)[0].job_id == "early"  # higher level first
    same = [running("s1", started=10.0, attained=20 * HOUR), running("s2", started=20.0, attained=20 * HOUR)]
    assert [a.job_id for a in sorted(same, key=rank)] == ["s2", "s1"]


def test_tuning_is_validated_and_named_settings_are_consistent():
    with pytest.raises(ValueError, match="top_share"):
        LasTuning(top_share=1.5)
    assert LAS_SHARE_TUNING.top_share == 0.4 and LAS_SHARE_TUNING.victims == "latest-submitted"
    assert LAS_SHARE_SETTINGS.thresholds_gpu_s == [HOUR, 10 * HOUR, 100 * HOUR]
    assert LAS_SHARE_SETTINGS.starve_factor == 16
    assert LAS_SHARE_SETTINGS.preempt_after_s == HOUR and CONFIG.las.preempt_after_s == 0


def test_a_las_share_head_waits_an_hour_before_it_stops_anyone():
    """Issue 51: running jobs often make room within the hour, and each stop costs a restart."""
    policy = Policy(nodes(1, 1.0), queues=SHARE)
    held = [running("long", started=0.0, attained=20 * HOUR)]
    early = policy.schedule(HOUR, [job("a", submitted=HOUR - 60)], held)
    assert early.preempt == [] and early.wake_at == 2 * HOUR - 60  # the pass when it may
    assert policy.schedule(2 * HOUR - 60, [job("a", submitted=HOUR - 60)], held).preempt == ["long"]
    requeued = job("a", submitted=0.0, queued_since=HOUR - 60)  # the wait counts from the requeue
    assert policy.schedule(HOUR, [requeued], held).preempt == []


# -- `order: las-share` in the queue file: the same tuning and `las:` values, nothing passed in
SHARE = validate_queue_config({"queues": {"lq": {"order": "las-share"}, "fq": {"order": "fifo"}}})


def test_a_las_share_queue_gets_the_tuning_and_its_settings_and_las_queues_do_not():
    las = las_of(SHARE)
    assert las.tuning == LAS_SHARE_TUNING and "lq" in las.queues and "fq" not in las.queues
    assert "unlisted" in las.queues  # the file's order, las-share by default
    assert las.thresholds == LAS_SHARE_SETTINGS.thresholds_gpu_s and las.starve_factor == 16
    assert las_of(CONFIG).tuning == LasTuning()  # `las` stays plain
    assert las_of(SHARE, BY_SUBMISSION).tuning == BY_SUBMISSION  # an explicit tuning wins
    assert las_of(validate_queue_config({"order": "fifo", "queues": {"fq": {}}})) is None


def test_a_las_share_queue_takes_the_latest_submitted_and_keeps_the_oldest_long_job():
    policy = Policy(nodes(1, 4.0), queues=SHARE)  # top share: 1.6 of 4 GPUs, one 1-GPU job
    held = [running(f"long{i}", started=0.0, attained=200 * HOUR, submitted=float(i)) for i in range(4)]
    assert policy.schedule(2 * HOUR, [job("a", submitted=HOUR)], held).preempt == ["long3"]
    whole = policy.schedule(2 * HOUR, [job("b", gpus=4, submitted=HOUR)], held)
    assert whole.preempt == [] and whole.head is None  # long0 holds the share: b cannot be the head
    assert "top share" in whole.notes["b"]
    plain = Policy(nodes(1, 4.0), queues=CONFIG).schedule(HOUR, [job("b", gpus=4, submitted=HOUR)], held)
    assert sorted(plain.preempt) == ["long0", "long1", "long2", "long3"]


def test_a_job_the_top_share_keeps_from_fitting_is_not_the_head():
    """Issue 51 (11cb48 at 35 GPUs): a starving job that needs every node, where the top share
    protects a long job on one of them, can stop nothing and hold nothing useful: as the head
    it kept GPUs idle and the jobs behind it from choosing victims, for hundreds of hours."""
    policy = Policy(nodes(2, 4.0), queues=CONFIG, las_tuning=TOP_HALF)  # 4 of 8 GPUs for the top level
    held = [
        running("old", started=0.0, attained=20 * HOUR, submitted=0.0, node="n0"),  # protected
        running("long", gpus=4, started=0.0, submitted=1.0, node="n1"),  # 120 GPU-h at 30 h: top level
    ]
    wide = JobRequest("wide", 0, 2, {"GPU": 4.0}, 0.0, False, "lq", queued_since=0.0)  # starving
    fresh, big = job("fresh", submitted=30 * HOUR), job("big", gpus=4, submitted=30 * HOUR)
    decision = policy.schedule(30 * HOUR, [wide, fresh, big], held)
    assert decision.admit == [("fresh", {"n0": 1})]  # the GPUs beside "old" do not sit idle
    assert decision.reserved_for == "big" and decision.preempt == ["long"]  # the next head stops one
    assert "top share" in decision.notes["wide"] and decision.head == "big"
    narrow = Policy(nodes(2, 4.0), queues=CONFIG, las_tuning=replace(TOP_HALF, top_share=0.25))
    alone = narrow.schedule(30 * HOUR, [wide], held[1:])  # "long" is not protected: "wide" is the head
    assert alone.head == "wide" and alone.preempt == ["long"]
