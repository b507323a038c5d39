"""Moving running jobs so that a head blocked by free room spread over nodes can start
(`orchestrator/policy/defrag.py`), alone and through `Policy.schedule`."""

from __future__ import annotations

import dataclasses
import math

from hypothesis import event, given, settings
from hypothesis import strategies as st

from core.queues import validate_queue_config
from orchestrator.policy import Allocation, JobRequest, Node, Policy, free_capacity, place
from orchestrator.policy.defrag import fragmented, plan_moves
from orchestrator.policy.room import released, take

HOUR = 3600.0
# moves act only where no other reason to preempt does: under LAS (the default order) the head
# of these passes, with no service yet, would preempt the jobs that have run an hour instead
FIFO = validate_queue_config({"order": "fifo"})


def gpus(
    job_id: str, count: float, workers: int = 1, priority: int = 0, preemptible: bool = True
) -> JobRequest:
    return JobRequest(job_id, priority, workers, {"GPU": float(count)}, 0.0, preemptible)


def on(job_id: str, node: str, count: float, started_at: float = 0.0, **kw) -> Allocation:
    return Allocation(
        job_id,
        kw.get("priority", 0),
        {node: 1},
        {"GPU": float(count)},
        started_at,
        kw.get("preemptible", True),
    )


def nodes(n: int, per_node: float = 8.0) -> list[Node]:
    return [Node(f"n{i}", {"GPU": per_node}) for i in range(n)]


def test_a_head_blocked_only_by_spread_room_moves_the_cheapest_node_s_jobs():
    cluster = nodes(2)
    running = [on("a", "n0", 4), on("b", "n1", 5)]  # 4 + 3 free: an 8-GPU job waits
    free = free_capacity(cluster, running)
    assert not fragmented(gpus("big", 8), free)  # 7 free: short, not spread
    running = [on("a", "n0", 4), on("b", "n1", 4)]
    free = free_capacity(cluster, running)
    assert fragmented(gpus("big", 8), free)
    assert plan_moves(gpus("big", 8), running, free, now=HOUR) == ["a"]  # ties: the first node

    decision = Policy(cluster, queues=FIFO).schedule(HOUR, [gpus("big", 8)], running)
    assert decision.preempt == ["a"] and decision.reserved_for == "big" and decision.admit == []
    assert decision.moving  # the service's history says the job moves, not that it lost its place
    assert "moving 1 job(s) to other nodes" in decision.notes["big"]
    # once `a` has stopped, the next pass starts the head on n0 and `a` again on n1
    after = Policy(cluster, queues=FIFO).schedule(HOUR + 60, [gpus("big", 8), gpus("a", 4)], [running[1]])
    assert sorted(after.admit) == [("a", {"n1": 1}), ("big", {"n0": 1})]


def test_jobs_move_only_when_they_consent_and_have_run_long_enough():
    cluster = nodes(2)
    head = gpus("big", 8, priority=1)
    young = [on("a", "n0", 4, started_at=HOUR - 60), on("b", "n1", 4)]
    assert plan_moves(head, young, free_capacity(cluster, young), now=HOUR) == ["b"]  # not the young one
    both_young = [on("a", "n0", 4, started_at=HOUR - 60), on("b", "n1", 4, started_at=HOUR - 1)]
    assert plan_moves(head, both_young, free_capacity(cluster, both_young), now=HOUR) is None
    starting = [dataclasses.replace(on("a", "n0", 4), starting=True), on("b", "n1", 4, started_at=HOUR - 1)]
    assert plan_moves(head, starting, free_capacity(cluster, starting), now=HOUR) is None
    pinned = [on("a", "n0", 4, preemptible=False), on("b", "n1", 4, priority=2)]
    assert plan_moves(head, pinned, free_capacity(cluster, pinned), now=HOUR) is None
    policy = Policy(cluster, move_after_s=math.inf, queues=FIFO)  # off (a head of priority 1 would preempt)
    assert policy.schedule(HOUR, [gpus("big", 8)], [on("a", "n0", 4), on("b", "n1", 4)]).preempt == []


def test_no_move_when_a_moved_job_would_not_fit_again():
    cluster = nodes(2)
    # n0: 4 + 3, n1: 7; a 2-GPU head fits once n0 drains, but then the 3 does not fit anywhere,
    # and draining both leaves 16 for 2 + 4 + 3 + 7 split 9 / 7: still no room
    running = [on("a", "n0", 4), on("a2", "n0", 3), on("b", "n1", 7)]
    free = free_capacity(cluster, running)
    assert fragmented(gpus("h", 2), free)
    assert plan_moves(gpus("h", 2), running, free, now=HOUR) is None
    decision = Policy(cluster, queues=FIFO).schedule(HOUR, [gpus("h", 2)], running)
    assert decision.preempt == [] and "spread over nodes" in decision.notes["h"]
    lower = Policy(cluster, queues=FIFO).schedule(HOUR, [gpus("h", 8, priority=1)], running)
    assert lower.preempt and not lower.moving  # preempted for a higher priority: not a move


def test_a_multi_node_head_drains_several_nodes():
    cluster = nodes(4)
    running = [on("a", "n0", 2), on("b", "n1", 2), on("c", "n2", 6), on("d", "n3", 6)]  # 6+6+2+2 free
    head = gpus("wide", 8, workers=2)
    moves = plan_moves(head, running, free_capacity(cluster, running), now=HOUR)
    assert sorted(moves) == ["a", "b"]


@st.composite
def crowded_clusters(draw):
    """Nodes mostly full of small jobs, some young, and a head of one or two whole nodes or less."""
    cluster = nodes(draw(st.integers(2, 5)))
    running = []
    for node in cluster:
        used = 0
        for size in draw(st.lists(st.sampled_from([1, 2, 4]), min_size=1, max_size=5)):
            if used + size <= 7:  # no node wholly free: an 8-GPU head needs others to move
                used += size
                started = draw(st.sampled_from([0.0, 0.0, HOUR]))
                running.append(on(f"j{len(running)}", node.id, size, started_at=started))
    head = gpus("head", draw(st.sampled_from([4, 8, 8, 8])), workers=draw(st.integers(1, 2)))
    return cluster, running, head


@settings(max_examples=300, deadline=None)
@given(crowded_clusters())
def test_a_plan_always_leaves_room_for_the_head_and_every_moved_job(case):
    cluster, running, head = case
    free = free_capacity(cluster, running)
    moves = plan_moves(head, running, free, now=HOUR)
    event("a plan" if moves else "fragmented, no plan" if fragmented(head, free) else "not fragmented")
    if moves is None:
        return
    assert fragmented(head, free) and len(set(moves)) == len(moves)
    moved = [a for a in running if a.job_id in moves]
    assert all(HOUR - a.started_at >= 600 for a in moved)
    room = released(free, moved)
    spot = place(head, room)
    assert spot is not None
    take(room, spot, head.per_worker)
    for allocation in sorted(moved, key=lambda a: -a.per_worker["GPU"]):
        again = place(gpus(allocation.job_id, allocation.per_worker["GPU"]), room)
        assert again is not None, f"{allocation.job_id} would have nowhere to go"
        take(room, again, allocation.per_worker)
