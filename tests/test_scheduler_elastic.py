"""Elastic jobs in the scheduling policy: started at the largest size that fits, shrunk before
anything is stopped, grown into free room when nothing waits.

A resize is carried out by the service as a checkpointed stop and a new admission; the tests
that follow a resize through play the service's part with the policy alone.
"""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.fifo import FifoPolicy
from orchestrator.policy import (
    Allocation,
    JobRequest,
    Node,
    Policy,
    QuotaBook,
    free_capacity,
    place,
)
from orchestrator.policy.elastic import requeued
from orchestrator.policy.preemption import choose_shrinks, shrunk_placement
from tests.test_scheduler_policy import (
    ACCEL,
    FIFO,
    SimJob,
    admitted,
    allocations_on,
    check_decision,
    clusters,
    job,
    nodes_of,
    policies,
    requests,
    simulate_cluster,
    workloads,
)


def elastic(job_id: str, sizes: tuple[int, ...], **kwargs) -> JobRequest:
    """A pending elastic job (the keywords of `job`)."""
    request = job(job_id, workers=sizes[0], **kwargs)
    return JobRequest(**{**request.__dict__, "sizes": sizes})


def holding(
    job_id: str,
    placement: dict[str, int],
    sizes: tuple[int, ...] = (),
    priority: int = 0,
    started_at: float = 0.0,
    preemptible: bool = False,
    queue: str = "default",
    stopping: bool = False,
    accel: float = 1,
) -> Allocation:
    """A running job, elastic when it has sizes."""
    return Allocation(
        job_id,
        priority,
        placement,
        {"accel": accel},
        started_at,
        preemptible,
        queue,
        None,
        stopping,
        sizes,
    )


def sizes_of(decision) -> dict[str, int]:
    return {job_id: sum(placement.values()) for job_id, placement in decision.admit}


def comes_back(allocation: Allocation) -> JobRequest:
    """A resized job back in the queue, as the service requeues it. Its place in the queue is
    its submission time; the policy cannot see that for a running job and takes its start
    time instead, so the tests requeue it with that time."""
    return requeued(allocation)


# -- the values -----------------------------------------------------------------------------------


def test_sizes_are_checked():
    assert elastic("e", (8, 4, 2)).allowed_sizes() == (8, 4, 2)
    assert job("f", workers=3).allowed_sizes() == (3,)
    with pytest.raises(ValueError, match="descending"):
        JobRequest("e", 0, 4, {"accel": 1}, 0.0, sizes=(2, 4))
    with pytest.raises(ValueError, match="descending"):
        JobRequest("e", 0, 4, {"accel": 1}, 0.0, sizes=(4, 4, 2))
    with pytest.raises(ValueError, match="first size must be workers"):
        JobRequest("e", 0, 8, {"accel": 1}, 0.0, sizes=(4, 2))
    with pytest.raises(ValueError, match=">= 1"):
        JobRequest("e", 0, 4, {"accel": 1}, 0.0, sizes=(4, 0))
    with pytest.raises(ValueError, match="descending"):
        holding("a", {"n0": 2}, sizes=(2, 4))
    assert holding("a", {"n0": 2}, sizes=(4, 2)).elastic and not holding("b", {"n0": 2}).elastic
    for bad in (-1.0, math.nan):
        with pytest.raises(ValueError, match="grow_after_s"):
            Policy(nodes_of(4), grow_after_s=bad)
    assert Policy(nodes_of(4)).grow_after_s == 120.0


def test_an_elastic_job_is_refused_only_when_its_smallest_size_cannot_fit():
    policy = Policy(nodes_of(4, 4), quotas={"q": {"accel": 6}})
    assert policy.rejection_reason(elastic("e", (16, 8))) is None
    assert "room for only 8" in policy.rejection_reason(elastic("e", (16, 9)))
    assert policy.rejection_reason(elastic("e", (8, 6), queue="q")) is None
    assert "quota of queue 'q'" in policy.rejection_reason(elastic("e", (8, 7), queue="q"))
    assert FifoPolicy(nodes_of(4, 4)).rejection_reason(elastic("e", (16, 8))) is None


# -- admission ------------------------------------------------------------------------------------


def test_an_elastic_job_starts_at_the_largest_size_that_fits():
    policy = Policy(nodes_of(4, 4))
    busy = [holding("r", {"n0": 3})]  # 1 free on n0, 4 on n1
    decision = policy.schedule(0, [elastic("e", (8, 4, 2))], busy)
    assert decision.admit == [("e", {"n1": 4})]
    # with 5 free, 6 does not fit but 5 does: sizes are exact counts, not a range
    decision = policy.schedule(0, [elastic("e", (8, 6, 5, 1))], busy)
    assert sizes_of(decision) == {"e": 5}
    # on an empty cluster it starts whole
    assert sizes_of(policy.schedule(0, [elastic("e", (8, 4, 2))], [])) == {"e": 8}


def test_an_elastic_job_starts_within_its_queue_quota():
    policy = Policy(nodes_of(8), quotas={"q": {"accel": 3}})
    assert sizes_of(policy.schedule(0, [elastic("e", (8, 4, 2), queue="q")], [])) == {"e": 2}


def test_an_elastic_head_reserves_its_smallest_size():
    policy = Policy(nodes_of(4))
    busy = [holding("r", {"n0": 3}, started_at=0)]
    busy[0].est_end = 100
    head = elastic("head", (4, 2), priority=1)
    beside = job("beside", workers=1, est=10_000, submitted_at=1)  # runs long, fits beside 2 workers
    decision = policy.schedule(0, [head, beside], busy)
    assert decision.head == "head" and decision.head_start == 100
    assert "waiting for 1 accel" in decision.notes["head"]  # 2 workers needed, 1 free
    # reserved at its largest size (4), the head would leave no room beside it at t=100
    assert admitted(decision) == ["beside"]


def test_an_elastic_job_backfills_at_the_largest_size_the_rules_allow():
    policy = Policy(nodes_of(4, 4))
    busy = [holding("r", {"n0": 4}, started_at=0)]
    busy[0].est_end = 100
    head = job("head", workers=6, priority=1)  # at t=100: n0 and 2 of n1
    short = elastic("short", (4, 3, 1), est=50, submitted_at=1)  # ends before t=100: any free room
    decision = policy.schedule(0, [head, short], busy)
    assert sizes_of(decision) == {"short": 4}
    long = elastic("long", (4, 3), est=10_000, submitted_at=1)  # only beside the head: 2 of n1
    decision = policy.schedule(0, [head, long], busy)
    assert sizes_of(decision) == {}  # 3 and 4 would delay the head; 2 is not one of its sizes
    long = elastic("long", (4, 3, 2, 1), est=10_000, submitted_at=1)
    assert sizes_of(policy.schedule(0, [head, long], busy)) == {"long": 2}


def test_fifo_policy_starts_an_elastic_job_at_its_largest_fitting_size_and_never_resizes():
    fifo = FifoPolicy(nodes_of(4))
    busy = [holding("r", {"n0": 1}, sizes=(4, 1), started_at=0)]
    decision = fifo.schedule(1000, [elastic("e", (4, 2, 1))], busy)
    assert sizes_of(decision) == {"e": 2} and decision.resize == {}
    decision = fifo.schedule(1000, [], busy)  # free room and nothing waits: FIFO never grows
    assert decision.resize == {}


# -- shrink before stop ---------------------------------------------------------------------------


def test_shrinking_is_chosen_before_stopping_and_shrinks_as_little_as_needed():
    policy = Policy(nodes_of(8))
    busy = [holding("v", {"n0": 8}, sizes=(8, 6, 4, 2), preemptible=True)]
    decision = policy.schedule(10, [job("head", workers=2, priority=1)], busy)
    assert decision.resize == {"v": 6}  # 6, not 4 or 2: two workers are all the head needs
    assert decision.preempt == [] and decision.admit == []
    assert decision.reserved_for == decision.head == "head" and decision.head_start == 10
    assert decision.notes["head"] == "next in line: shrinking 1 elastic job(s): v 8->6 workers"


def test_a_shrunk_job_gives_up_the_nodes_where_it_has_fewest_workers():
    assert shrunk_placement({"n0": 3, "n1": 1, "n2": 2}, 3) == ({"n0": 3}, {"n1": 1, "n2": 2})
    assert shrunk_placement({"n1": 2, "n0": 2}, 2) == ({"n1": 2}, {"n0": 2})  # a tie: by node id
    assert shrunk_placement({"n0": 2}, 2) == ({"n0": 2}, {})
    # the head needs one whole node: dropping two workers from n1 (where v has 2) frees it,
    # dropping them from n0 (where it has 4) would not
    nodes = nodes_of(4, 4, 4)
    busy = [
        holding("v", {"n0": 4, "n1": 2}, sizes=(6, 4, 2), preemptible=True),
        holding("x", {"n2": 4}),
    ]
    decision = Policy(nodes).schedule(10, [job("head", accel=4, priority=1)], busy)
    assert decision.resize == {"v": 4} and decision.preempt == []


def test_shrink_prefers_the_lowest_priority_then_the_most_recently_started():
    policy = Policy(nodes_of(4, 4))
    head = job("head", workers=2, priority=2)
    busy = [
        holding("mid", {"n0": 4}, sizes=(4, 2), priority=1, preemptible=True, started_at=9),
        holding("low", {"n1": 4}, sizes=(4, 2), priority=0, preemptible=True, started_at=1),
    ]
    assert policy.schedule(10, [head], busy).resize == {"low": 2}
    busy = [
        holding("older", {"n0": 4}, sizes=(4, 2), preemptible=True, started_at=1),
        holding("newer", {"n1": 4}, sizes=(4, 2), preemptible=True, started_at=5),
    ]
    assert policy.schedule(10, [head], busy).resize == {"newer": 2}


def test_shrink_spares_a_job_it_turns_out_not_to_need():
    # "a" is preferred (most recently started), but its one spare worker is not enough; "b"
    # alone frees two, so "a" keeps all its workers
    policy = Policy(nodes_of(6))
    busy = [
        holding("a", {"n0": 2}, sizes=(2, 1), preemptible=True, started_at=5),
        holding("b", {"n0": 4}, sizes=(4, 2), preemptible=True, started_at=1),
    ]
    decision = policy.schedule(10, [job("head", workers=2, priority=1)], busy)
    assert decision.resize == {"b": 2}
    # three workers need both, each as far as it goes
    decision = policy.schedule(10, [job("head", workers=3, priority=1)], busy)
    assert decision.resize == {"a": 1, "b": 2}
    assert (
        decision.notes["head"] == "next in line: shrinking 2 elastic job(s): a 2->1 workers, b 4->2 workers"
    )


def test_jobs_are_stopped_when_shrinking_cannot_free_enough():
    policy = Policy(nodes_of(4))
    busy = [holding("v", {"n0": 4}, sizes=(4, 2), preemptible=True)]
    decision = policy.schedule(10, [job("head", workers=3, priority=1)], busy)
    assert decision.resize == {} and decision.preempt == ["v"] and decision.reserved_for == "head"
    # shrinking one and stopping the other is not done: both stop when shrinking is not enough
    policy = Policy(nodes_of(4, 4))
    busy = [
        holding("e", {"n0": 4}, sizes=(4, 2), preemptible=True, started_at=2),
        holding("f", {"n1": 4}, preemptible=True, started_at=1),
    ]
    decision = policy.schedule(10, [job("head", workers=6, priority=1)], busy)
    assert decision.resize == {} and sorted(decision.preempt) == ["e", "f"]


def test_only_preemptible_lower_priority_elastic_jobs_are_shrunk():
    head = job("head", workers=2, priority=1)
    for blocker in (
        holding("same", {"n0": 4}, sizes=(4, 2), priority=1, preemptible=True),
        holding("pinned", {"n0": 4}, sizes=(4, 2), priority=0, preemptible=False),
    ):
        decision = Policy(nodes_of(4)).schedule(10, [head], [blocker])
        assert decision.resize == {} and decision.preempt == [] and decision.reserved_for is None
    # with preemption off nothing is shrunk either
    decision = Policy(nodes_of(4), preemption=False).schedule(
        10, [head], [holding("v", {"n0": 4}, sizes=(4, 2), preemptible=True)]
    )
    assert decision.resize == {} and decision.reserved_for is None


def test_a_job_of_one_size_is_never_resized():
    policy = Policy(nodes_of(4), grow_after_s=0)
    busy = [holding("fixed", {"n0": 4}, preemptible=True)]
    decision = policy.schedule(10, [job("head", workers=2, priority=1)], busy)
    assert decision.resize == {} and decision.preempt == ["fixed"]
    decision = policy.schedule(1000, [], [holding("fixed", {"n0": 2}, preemptible=True)])  # room to grow
    assert decision.resize == {}
    # sizes of one element are a job of one size too
    decision = policy.schedule(1000, [], [holding("one", {"n0": 1}, sizes=(2,), preemptible=True)])
    assert decision.resize == {}
    decision = policy.schedule(
        10, [job("head", workers=4, priority=1)], [holding("one", {"n0": 2}, sizes=(2,), preemptible=True)]
    )
    assert decision.resize == {} and decision.preempt == ["one"]


def test_a_shrink_is_made_only_if_the_shrunk_job_starts_again_beside_the_head():
    # the head is elastic: once "v" has stopped, the head starts at the largest size that fits,
    # all 8, and "v" would not start again at all; so "v" is stopped, not "shrunk"
    policy = Policy(nodes_of(8))
    busy = [holding("v", {"n0": 8}, sizes=(8, 4, 2), preemptible=True)]
    decision = policy.schedule(10, [elastic("head", (8, 2), priority=1)], busy)
    assert decision.resize == {} and decision.preempt == ["v"]
    # with room for both, it is shrunk
    decision = policy.schedule(10, [elastic("head", (4, 2), priority=1)], busy)
    assert decision.resize == {"v": 4} and decision.preempt == []


def test_choose_shrinks_asks_its_caller_before_it_settles():
    nodes = nodes_of(8)
    busy = [holding("v", {"n0": 8}, sizes=(8, 6, 4, 2), preemptible=True)]
    head = job("head", workers=2, priority=1)
    free = free_capacity(nodes, busy)
    assert choose_shrinks(head, busy, nodes, free) == {"v": 6}
    asked = []
    plan = choose_shrinks(head, busy, nodes, free, lambda p: asked.append(dict(p)) or p["v"] <= 4)
    assert plan == {"v": 4} and asked == [{"v": 6}, {"v": 4}]
    assert choose_shrinks(head, busy, nodes, free, lambda p: False) is None


def test_shrink_pass_by_pass_until_both_run():
    """Pass 1 shrinks; pass 2, while the job stops, keeps the room; pass 3 starts both."""
    policy = Policy(nodes_of(4, 4))
    victim = holding("v", {"n0": 4, "n1": 4}, sizes=(8, 4, 2), preemptible=True, started_at=1)
    head = job("head", workers=4, priority=1, submitted_at=5)
    filler = job("filler", workers=1, est=10_000, submitted_at=6)  # would take the room if it could

    first = policy.schedule(10, [head, filler], [victim])
    assert first.resize == {"v": 4} and first.preempt == [] and first.admit == []
    assert first.reserved_for == "head" and "v 8->4 workers" in first.notes["head"]

    victim.stopping = True  # the service asks it to checkpoint and stop
    second = policy.schedule(11, [head, filler], [victim])
    assert second.admit == [] and second.resize == {} and second.preempt == []
    assert second.reserved_for == "head" and "waiting for 1 stopping job" in second.notes["head"]
    assert "promised" in second.notes["filler"]

    # stopped, and back in the queue with all its sizes: the head first, then the victim
    third = policy.schedule(12, [head, filler, comes_back(victim)], [])
    assert sizes_of(third) == {"head": 4, "v": 4}
    assert admitted(third)[:2] == ["head", "v"]


def test_the_room_a_shrunk_job_comes_back_to_is_kept_from_backfill():
    # "short" (estimate, fits the free node) could backfill beside the head's placement; it would
    # take the node the shrunk job needs to start again, so it waits
    policy = Policy(nodes_of(4, 4, 4))
    victim = holding("v", {"n0": 4, "n1": 4}, sizes=(8, 4), priority=1, preemptible=True, started_at=1)
    head = job("head", workers=8, priority=2, submitted_at=5)
    short = job("short", workers=4, est=10_000, submitted_at=6)  # n2 is free now
    first = policy.schedule(10, [head, short], [victim])
    assert first.resize == {"v": 4} and first.admit == []
    victim.stopping = True
    assert policy.schedule(11, [head, short], [victim]).admit == []
    third = policy.schedule(12, [head, short, comes_back(victim)], [])
    assert sizes_of(third) == {"head": 8, "v": 4}


# -- growing --------------------------------------------------------------------------------------


def test_an_elastic_job_grows_after_grow_after_s_when_nothing_waits():
    policy = Policy(nodes_of(4), grow_after_s=120)
    busy = [holding("v", {"n0": 2}, sizes=(4, 2), started_at=0)]
    assert policy.schedule(119, [], busy).resize == {}
    assert policy.schedule(120, [], busy).resize == {"v": 4}
    # still starting (its workers not training yet): it has not run at its size
    starting = [dataclasses.replace(busy[0], starting=True)]
    assert policy.schedule(1000, [], starting).resize == {}
    # at the largest size already: nothing to do
    assert policy.schedule(1000, [], [holding("v", {"n0": 4}, sizes=(4, 2))]).resize == {}
    # a grow is to a larger allowed size that fits: 3 fits, 4 does not, 3 is not allowed
    busy = [holding("v", {"n0": 2}, sizes=(4, 2)), holding("x", {"n0": 1})]
    assert policy.schedule(1000, [], busy).resize == {}
    busy = [holding("v", {"n0": 2}, sizes=(4, 3, 2)), holding("x", {"n0": 1})]
    assert policy.schedule(1000, [], busy).resize == {"v": 3}
    assert Policy(nodes_of(4), grow_after_s=math.inf).schedule(1e9, [], busy).resize == {}


def test_no_grow_while_a_job_waits_or_stops():
    policy = Policy(nodes_of(4), grow_after_s=0)
    v = holding("v", {"n0": 2}, sizes=(4, 2), priority=1)
    waiting = job("waiting", workers=3)  # lower priority than v: it waits, v is not shrunk for it
    decision = policy.schedule(1000, [waiting], [v])
    assert decision.head == "waiting" and decision.resize == {}
    assert policy.schedule(1000, [], [v]).resize == {"v": 4}  # once it is gone, v grows
    wide = Policy(nodes_of(8), grow_after_s=0)
    stopping = holding("s", {"n0": 1}, stopping=True)  # a job that stops comes back to the queue
    assert wide.schedule(1000, [], [v, stopping]).resize == {}
    assert wide.schedule(1000, [], [v]).resize == {"v": 4}
    # a job that started in this pass takes its room first; v grows into what is left
    decision = policy.schedule(1000, [job("small", workers=1)], [v])
    assert admitted(decision) == ["small"] and decision.resize == {}
    decision = policy.schedule(1000, [job("small", workers=1)], [holding("v", {"n0": 1}, sizes=(3, 1))])
    assert decision.resize == {"v": 3}


@pytest.mark.parametrize("queues", [None, FIFO], ids=["las-share", "fifo"])
def test_jobs_that_can_never_start_or_wait_for_their_quota_do_not_stop_a_grow(queues):
    policy = Policy(nodes_of(4, 4), quotas={"q": {"accel": 2}}, grow_after_s=0, queues=queues)
    busy = [holding("v", {"n0": 2}, sizes=(4, 2)), holding("inq", {"n1": 2}, queue="q")]
    too_big = job("too-big", accel=5)  # larger than any node
    over_quota = job("over", workers=1, queue="q")  # its queue holds 2 of 2
    decision = policy.schedule(1000, [too_big, over_quota], busy)
    assert "cannot start" in decision.notes["too-big"] and "quota" in decision.notes["over"]
    assert decision.resize == {"v": 4}
    # but a job of the waiting job's queue does not grow: the quota goes to the waiting job first
    # (in a LAS queue too, where later jobs may pass it)
    policy = Policy(nodes_of(4, 4), quotas={"q": {"accel": 3}}, grow_after_s=0, queues=queues)
    busy = [holding("vq", {"n0": 1}, sizes=(2, 1), queue="q"), holding("r", {"n1": 1}, queue="q")]
    assert policy.schedule(1000, [], busy).resize == {"vq": 2}  # 3 of 3 once grown
    decision = policy.schedule(1000, [job("over", workers=2, queue="q")], busy)
    assert "quota" in decision.notes["over"] and decision.resize == {}


def test_a_grow_stays_within_its_queue_quota():
    policy = Policy(nodes_of(8), quotas={"q": {"accel": 5}}, grow_after_s=0)
    busy = [holding("v", {"n0": 2}, sizes=(8, 4, 2), queue="q")]
    assert policy.schedule(1000, [], busy).resize == {"v": 4}


def test_two_elastic_jobs_never_grow_into_the_same_free_room():
    policy = Policy(nodes_of(6), grow_after_s=0)
    busy = [
        holding("a", {"n0": 2}, sizes=(4, 2), started_at=0),
        holding("b", {"n0": 2}, sizes=(4, 2), started_at=10),
    ]
    decision = policy.schedule(1000, [], busy)
    assert decision.resize == {"a": 4}  # 2 free: the job running longest takes it, not both
    # with room for both, both grow
    decision = Policy(nodes_of(8), grow_after_s=0).schedule(1000, [], busy)
    assert decision.resize == {"a": 4, "b": 4}
    # higher priority first
    busy[1].priority = 1
    assert policy.schedule(1000, [], busy).resize == {"b": 4}


def test_grow_pass_by_pass():
    policy = Policy(nodes_of(4, 4), grow_after_s=60)
    v = holding("v", {"n0": 2}, sizes=(8, 6, 2), started_at=0)
    x = holding("x", {"n1": 2})
    first = policy.schedule(100, [], [v, x])
    assert first.resize == {"v": 6}  # 2 of its own + 2 free on n0 + 2 free on n1
    v.stopping = True
    second = policy.schedule(101, [], [v, x])
    assert second.resize == {} and second.admit == []
    third = policy.schedule(102, [comes_back(v)], [x])
    assert sizes_of(third) == {"v": 6}
    # back at its new size, it has not run grow_after_s there: no grow at once
    running_again = holding("v", dict(third.admit[0][1]), sizes=(8, 6, 2), started_at=102)
    assert policy.schedule(103, [], [running_again, x]).resize == {}


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
