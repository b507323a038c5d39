"""Elastic jobs grow into free room when nothing waits (`Policy(grow_after_s=...)`): when, by
how much, in which order, within their queue's quota, and pass by pass.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from orchestrator.policy import Policy
from tests.scheduler_helpers import FIFO, admitted, comes_back, holding, job, nodes_of, sizes_of

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
