"""Elastic jobs in the scheduling policy: started at the largest size that fits, shrunk before
anything is stopped, grown into free room when nothing waits.

This file: the values, admission and shrinking; growing is in test_scheduler_elastic_grow.py,
the properties in test_scheduler_elastic_properties.py.

A resize is carried out by the service as a checkpointed stop and a new admission; the tests
that follow a resize through play the service's part with the policy alone.
"""

from __future__ import annotations

import math

import pytest

from bench.fifo import FifoPolicy
from orchestrator.policy import JobRequest, Policy, free_capacity
from orchestrator.policy.preemption import choose_shrinks, shrunk_placement
from tests.scheduler_helpers import admitted, comes_back, elastic, holding, job, nodes_of, sizes_of

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
