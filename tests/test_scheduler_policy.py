"""The orchestrator's scheduling policy: unit tests per module, then properties on a simulated cluster.

Resource names are arbitrary: "accel" stands in for GPUs, as a custom Ray resource would.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import heapq
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from bench.fifo import FifoPolicy
from core.queues import validate_queue_config
from orchestrator.policy import (
    Allocation,
    Decision,
    JobRequest,
    Node,
    Policy,
    QuotaBook,
    add,
    choose_victims,
    fits,
    fits_cluster,
    format_resources,
    free_capacity,
    order_pending,
    oversize_reason,
    place,
    queue_key,
    quota_reason,
    scale,
    subtract,
)
from orchestrator.policy.las import LasTuning, service_rate
from orchestrator.policy.room import View, shape_of

ROOT = Path(__file__).resolve().parents[1]
EPS = 1e-6
# strict FIFO within a priority level, for the tests about it (every queue's default is las-share)
FIFO = validate_queue_config({"order": "fifo"})


def job(
    job_id: str,
    workers: int = 1,
    accel: float = 1,
    priority: int = 0,
    submitted_at: float = 0.0,
    preemptible: bool = False,
    queue: str = "default",
    est: float | None = None,
    cpu: float = 0,
) -> JobRequest:
    per_worker = {"accel": accel, **({"cpu": cpu} if cpu else {})}
    return JobRequest(job_id, priority, workers, per_worker, submitted_at, preemptible, queue, est)


def running(
    job_id: str,
    placement: dict[str, int],
    accel: float = 1,
    priority: int = 0,
    started_at: float = 0.0,
    preemptible: bool = False,
    queue: str = "default",
    est_end: float | None = None,
    stopping: bool = False,
) -> Allocation:
    return Allocation(
        job_id, priority, placement, {"accel": accel}, started_at, preemptible, queue, est_end, stopping
    )


def nodes_of(*accels: float, cpu: float = 64) -> list[Node]:
    return [Node(f"n{i}", {"accel": a, "cpu": cpu}) for i, a in enumerate(accels)]


def admitted(decision: Decision) -> list[str]:
    return [job_id for job_id, _ in decision.admit]


# -- resources and admission ----------------------------------------------------------------------


def test_resource_helpers():
    assert add({"a": 1}, {"a": 2, "b": 1}) == {"a": 3, "b": 1}
    assert subtract({"a": 3}, {"a": 1, "b": 1}) == {"a": 2, "b": -1}
    assert scale({"a": 2, "b": 0.5}, 4) == {"a": 8, "b": 2}
    assert fits({"a": 0.1 + 0.2}, {"a": 0.3})  # float sums do not fail by a rounding error
    assert not fits({"a": 1}, {"b": 5})  # a missing resource counts as none
    assert fits({"a": 0}, {})  # asking for zero never blocks
    assert format_resources({"GPU": 4.0, "CPU": 0.5}) == "4 GPU, 0.5 CPU"


def test_place_is_all_or_nothing_with_each_worker_on_one_node():
    free = {"n0": {"accel": 4}, "n1": {"accel": 4}}
    assert place(job("a", workers=3, accel=3), free) is None  # 2 workers fit, the third does not
    assert place(job("a", workers=2, accel=3), free) == {"n0": 1, "n1": 1}
    assert place(job("a", workers=1, accel=5), free) is None  # 8 free in total, but not on one node


def test_place_checks_every_resource():
    free = {"n0": {"accel": 8, "cpu": 2}}
    assert place(job("a", workers=3, accel=1, cpu=1), free) is None
    assert place(job("a", workers=2, accel=1, cpu=1), free) == {"n0": 2}


def test_place_best_fit_keeps_the_big_hole_free():
    free = {"n0": {"accel": 8}, "n1": {"accel": 2}, "n2": {"accel": 3}}
    assert place(job("a", workers=2), free) == {"n1": 2}
    assert place(job("a", workers=3), free) == {"n2": 3}


def test_place_spans_as_few_nodes_as_possible():
    free = {"n0": {"accel": 4}, "n1": {"accel": 8}, "n2": {"accel": 8}, "n3": {"accel": 3}}
    # one whole 8, then the remainder of 2 on the tightest node that holds it
    assert place(job("a", workers=10), free) == {"n1": 8, "n3": 2}


def avoiding(request: JobRequest, *node_ids: str) -> JobRequest:
    return dataclasses.replace(request, avoid_nodes=frozenset(node_ids))


def test_place_skips_the_nodes_a_job_avoids():
    free = {"n0": {"accel": 8}, "n1": {"accel": 2}, "n2": {"accel": 3}}
    assert place(job("a", workers=2), free) == {"n1": 2}
    assert place(avoiding(job("a", workers=2), "n1"), free) == {"n2": 2}
    assert place(avoiding(job("a", workers=8), "n0"), free) is None  # 5 left off n0
    assert oversize_reason(avoiding(job("a", workers=8), "n0"), nodes_of(8, 2, 3)) == (
        "job a needs 8 worker(s) x (1 accel) away from 1 node(s) it avoids but the whole cluster"
        " has room for only 5 such worker(s) (2 node(s))"
    )


def test_a_pass_places_a_job_off_the_nodes_it_avoids_and_preempts_only_where_it_may_go():
    policy = Policy(nodes_of(1, 1, 1))
    decision = policy.schedule(0.0, [avoiding(job("a", workers=2), "n0")], [])
    assert decision.admit == [("a", {"n1": 1, "n2": 1})]
    # n2 is free; of the victims, only the one off n0 makes room (the other is preferred: newer)
    held = [
        running("low-n0", {"n0": 1}, started_at=5.0, preemptible=True),
        running("low-n1", {"n1": 1}, started_at=1.0, preemptible=True),
    ]
    head = avoiding(job("a", workers=2, priority=5), "n0")
    assert policy.schedule(10.0, [head], held).preempt == ["low-n1"]
    assert Policy(nodes_of(1, 1, 1)).schedule(10.0, [job("a", workers=2, priority=5)], held).preempt == [
        "low-n0"
    ]


def test_placement_verdicts_are_never_shared_between_a_job_and_one_that_avoids_nodes():
    """Two jobs of the same shape, one avoiding a node: the caches of a pass (a shape that did
    not fit) and of the policy (a shape larger than the cluster) keep them apart."""
    nodes = nodes_of(1, 1)
    plain, shy = job("plain", workers=2, submitted_at=1.0), avoiding(job("shy", workers=2), "n0")
    policy = Policy(nodes)
    decision = policy.schedule(0.0, [shy, plain], [])  # shy is older: judged (and cached) first
    assert decision.admit == [("plain", {"n0": 1, "n1": 1})]
    assert decision.notes["shy"].startswith("cannot start on the cluster as it is now: it needs")
    decision = policy.schedule(0.0, [plain, dataclasses.replace(shy, submitted_at=2.0)], [])
    assert decision.admit == [("plain", {"n0": 1, "n1": 1})] and "shy" in decision.notes
    assert policy.oversize_note(plain) is None and policy.oversize_note(shy) is not None
    # within a pass: a shape that failed while avoiding n1 still fits without avoiding it
    view = View({"n0": {"accel": 2}, "n1": {"accel": 1}})
    one_node = avoiding(job("x", workers=2), "n0")
    assert view.place(one_node, shape_of(one_node)) is None
    again = job("y", workers=2)
    assert view.place(again, shape_of(again)) == {"n0": 2}
    bigger = avoiding(job("z", workers=3), "n0")  # more workers, same avoided node: known not to fit
    assert view.place(bigger, shape_of(bigger)) is None


def test_free_capacity_counts_running_and_stopping_jobs_and_ignores_gone_nodes():
    nodes = nodes_of(8, 8)
    allocations = [
        running("r", {"n0": 3}),
        running("s", {"n0": 1, "n1": 2}, stopping=True),
        running("gone", {"n9": 4}),
    ]
    free = free_capacity(nodes, allocations)
    assert free["n0"]["accel"] == 4 and free["n1"]["accel"] == 6
    assert set(free) == {"n0", "n1"}
    assert nodes[0].capacity["accel"] == 8  # capacity itself is not touched


def test_a_job_larger_than_the_cluster_is_refused_up_front():
    nodes = nodes_of(8, 8)
    assert fits_cluster(job("ok", workers=16), nodes)
    assert not fits_cluster(job("big", workers=17), nodes)
    assert "room for only 16" in oversize_reason(job("big", workers=17), nodes)
    assert "more than any single node" in oversize_reason(job("wide", accel=9), nodes)
    assert "no node has any tpu" in oversize_reason(JobRequest("t", 0, 1, {"tpu": 1}, 0.0), nodes)
    assert oversize_reason(job("ok", workers=16), nodes) is None
    policy = Policy(nodes)
    assert "room for only 16" in policy.rejection_reason(job("big", workers=17))
    assert policy.rejection_reason(job("big", workers=17)).startswith("job big needs")
    # nodes leave: two waiting jobs of one shape, each told about itself (the verdict is cached)
    policy.set_nodes(nodes_of(8))
    notes = policy.schedule(0.0, [job("x", workers=9), job("y", workers=9, submitted_at=1.0)], []).notes
    assert notes["x"] == notes["y"] and "room for only 8" in notes["y"] and "job x" not in notes["y"]


def test_job_and_node_check_their_values():
    with pytest.raises(ValueError, match="workers"):
        job("a", workers=0)
    with pytest.raises(ValueError, match="accel"):
        job("a", accel=-1)
    with pytest.raises(ValueError, match="finite"):
        Node("n", {"accel": math.inf})


# -- queue order and quotas -----------------------------------------------------------------------


def test_queue_order_priority_then_age_then_id():
    jobs = [
        job("late-high", priority=2, submitted_at=9),
        job("b-low", priority=0, submitted_at=1),
        job("a-low", priority=0, submitted_at=1),
        job("early-low", priority=0, submitted_at=0),
        job("early-high", priority=2, submitted_at=5),
    ]
    assert [j.id for j in order_pending(jobs)] == ["early-high", "late-high", "early-low", "a-low", "b-low"]


@given(
    st.lists(
        st.tuples(st.integers(-3, 3), st.sampled_from([0.0, 1.0, 2.5, 7.0]), st.text("abc", min_size=1)),
        max_size=30,
    )
)
def test_order_pending_is_the_queue_key_order(rows):
    jobs = [job(f"{name}-{i}", priority=p, submitted_at=t) for i, (p, t, name) in enumerate(rows)]
    assert order_pending(jobs) == sorted(jobs, key=queue_key)


def test_aging_a_requeued_job_keeps_its_place():
    policy = Policy(nodes_of(1))
    # preempted at t=50 and requeued with its original submission time: ahead of later jobs
    requeued = job("requeued", priority=1, submitted_at=10)
    later = job("later", priority=1, submitted_at=20)
    assert admitted(policy.schedule(60, [later, requeued], [])) == ["requeued"]
    # but age never lifts it over a higher priority level
    high = job("high", priority=2, submitted_at=55)
    assert admitted(policy.schedule(60, [later, requeued, high], [])) == ["high"]


def test_quota_book_counts_running_and_stopping_jobs():
    book = QuotaBook(
        {"research": {"accel": 4}},
        [running("r", {"n0": 2}, queue="research"), running("s", {"n0": 1}, queue="research", stopping=True)],
    )
    assert book.allows(job("one", queue="research"))
    assert not book.allows(job("two", workers=2, queue="research"))
    assert book.allows(job("elsewhere", workers=100))  # queues without a quota are unlimited
    assert "quota of queue 'research' reached" in book.note(job("two", workers=2, queue="research"))
    book.charge(job("one", queue="research"))
    assert not book.allows(job("another", queue="research"))


def test_a_job_above_its_queue_quota_is_refused_up_front():
    quotas = {"research": {"accel": 2}}
    assert "quota of queue 'research'" in quota_reason(job("a", workers=3, queue="research"), quotas)
    assert quota_reason(job("a", workers=2, queue="research"), quotas) is None
    assert Policy(nodes_of(8), quotas=quotas).rejection_reason(job("a", workers=3, queue="research"))


# -- the policy -----------------------------------------------------------------------------------


def test_two_jobs_each_over_half_the_cluster_run_one_after_the_other():
    policy = Policy(nodes_of(4, 4))
    first, second = job("first", workers=5, submitted_at=0), job("second", workers=5, submitted_at=1)
    decision = policy.schedule(0, [first, second], [])
    assert decision.admit == [("first", {"n0": 4, "n1": 1})]
    assert decision.head == "second" and "second" in decision.notes
    # while the first runs nothing of the second starts; once it ends, the second starts whole
    busy = [running("first", {"n0": 4, "n1": 1})]
    assert policy.schedule(5, [second], busy).admit == []
    assert policy.schedule(9, [second], []).admit == [("second", {"n0": 4, "n1": 1})]


def test_higher_priority_starts_first():
    policy = Policy(nodes_of(2))
    decision = policy.schedule(0, [job("low", workers=2, priority=0), job("high", workers=2, priority=1)], [])
    assert admitted(decision) == ["high"]


def test_fifo_within_a_priority_level():
    policy = Policy(nodes_of(2), queues=FIFO)
    jobs = [job("second", workers=2, submitted_at=2), job("first", workers=2, submitted_at=1)]
    assert admitted(policy.schedule(5, jobs, [])) == ["first"]


def test_backfill_that_ends_before_the_head_starts():
    policy = Policy(nodes_of(4))
    busy = [running("r", {"n0": 2}, est_end=100)]
    head = job("head", workers=4, priority=1)  # waits for "r", expected at t=100
    long = job("long", workers=2, est=500, submitted_at=1)  # would still hold 2 at t=100
    short = job("short", workers=2, est=50, submitted_at=2)
    decision = policy.schedule(0, [head, long, short], busy)
    assert decision.head == "head" and decision.head_start == 100
    assert admitted(decision) == ["short"]
    assert "delay" in decision.notes["long"]


def test_backfill_beside_the_head_reservation_may_run_long():
    policy = Policy(nodes_of(4, 4))
    busy = [running("r", {"n0": 4}, est_end=100)]
    head = job("head", workers=6, priority=1)  # at t=100: all of n0 and 2 of n1
    beside = job("beside", workers=2, est=10_000, submitted_at=1)  # the other 2 of n1
    greedy = job("greedy", workers=3, est=10_000, submitted_at=2)
    decision = policy.schedule(0, [head, greedy, beside], busy)
    assert decision.admit == [("beside", {"n1": 2})]
    # that start leaves the head's reservation intact: at t=100 it starts as promised
    after = policy.schedule(100, [head, greedy], [running("beside", {"n1": 2}, est_end=10_000)])
    assert admitted(after) == ["head"]


def test_unknown_runtime_jobs_backfill_only_when_preemptible_by_the_head():
    policy = Policy(nodes_of(4), queues=FIFO)  # (LAS lets a job of the head's level pass it)
    busy = [running("r", {"n0": 2}, est_end=100)]
    head = job("head", workers=4, priority=1)
    blind = job("blind", workers=1, submitted_at=1)  # no estimate, not preemptible
    assert admitted(policy.schedule(0, [head, blind], busy)) == []
    spot = job("spot", workers=1, submitted_at=2, preemptible=True)
    decision = policy.schedule(0, [head, blind, spot], busy)
    assert admitted(decision) == ["spot"]
    assert "no runtime estimate" in decision.notes["blind"]
    # a preemptible job of the head's own priority cannot be taken back by it: no backfill
    same_level = job("same", workers=1, priority=1, submitted_at=3, preemptible=True)
    assert admitted(policy.schedule(0, [head, same_level], busy)) == []


def test_backfill_off_means_nothing_passes_the_head():
    policy = Policy(nodes_of(4), backfill=False)
    busy = [running("r", {"n0": 2}, est_end=100)]
    jobs = [job("head", workers=4, priority=1), job("short", est=1, submitted_at=1)]
    assert admitted(policy.schedule(0, jobs, busy)) == []


def test_backfill_window_bounds_how_far_the_pass_looks():
    policy = Policy(nodes_of(4), backfill_window=2)
    busy = [running("r", {"n0": 2}, est_end=100)]
    jobs = [job("head", workers=4, priority=1)] + [
        job(f"w{i}", workers=3, est=1, submitted_at=i) for i in range(3)
    ]
    jobs.append(job("fits", workers=1, est=1, submitted_at=10))
    decision = policy.schedule(0, jobs, busy)
    assert admitted(decision) == []
    assert "fits" not in decision.notes and "w1" in decision.notes


def test_quota_limits_a_queue_and_does_not_hold_up_others():
    policy = Policy(nodes_of(8), quotas={"research": {"accel": 3}}, queues=FIFO)  # a FIFO queue waits
    busy = [running("r", {"n0": 2}, queue="research")]
    jobs = [
        job("r-big", workers=2, queue="research", submitted_at=1),
        job("r-small", workers=1, queue="research", submitted_at=2),  # fits the quota, waits its turn
        job("other", workers=4, submitted_at=3),
    ]
    decision = policy.schedule(0, jobs, busy)
    assert admitted(decision) == ["other"]
    assert "quota of queue 'research' reached" in decision.notes["r-big"]
    assert "behind job r-big" in decision.notes["r-small"]


def test_the_head_keeps_its_share_of_its_queue_quota():
    policy = Policy(nodes_of(4), quotas={"q": {"accel": 3}}, queues=FIFO)  # (a LAS head keeps none)
    busy = [running("r", {"n0": 2}, queue="other", est_end=100)]
    head = job("head", workers=3, queue="q", priority=1)  # fits its quota, waits for resources
    same_queue = job("mine", workers=1, queue="q", est=10_000, submitted_at=1)
    other_queue = job("theirs", workers=1, queue="other", est=10_000, submitted_at=2)
    decision = policy.schedule(0, [head, same_queue, other_queue], busy)
    # both fit beside the head's placement, but "mine" would leave the head without quota
    assert admitted(decision) == ["theirs"]
    assert "share kept for job head" in decision.notes["mine"]


def test_preemption_stops_lower_priority_preemptible_jobs_for_the_head():
    policy = Policy(nodes_of(4))
    busy = [
        running("old", {"n0": 2}, started_at=1, preemptible=True),
        running("new", {"n0": 2}, started_at=2, preemptible=True),
    ]
    decision = policy.schedule(10, [job("urgent", workers=2, priority=1)], busy)
    assert decision.preempt == ["new"] and decision.reserved_for == "urgent"
    assert decision.admit == []
    assert "preempting 1" in decision.notes["urgent"]


def test_no_preemption_when_switched_off():
    policy = Policy(nodes_of(4), preemption=False)
    busy = [running("p", {"n0": 4}, preemptible=True)]
    decision = policy.schedule(10, [job("urgent", workers=2, priority=1)], busy)
    assert decision.preempt == [] and decision.reserved_for is None


def test_stopping_victims_are_not_chosen_twice_and_their_resources_stay_promised():
    policy = Policy(nodes_of(4))
    busy = [
        running("victim", {"n0": 2}, preemptible=True, stopping=True),
        running("spare", {"n0": 2}, preemptible=True),
    ]
    urgent = job("urgent", workers=2, priority=2)
    filler = job("filler", workers=2, priority=1, est=1, submitted_at=1)
    decision = policy.schedule(10, [urgent, filler], busy)
    assert decision.preempt == []  # no second victim while the first is stopping
    assert decision.reserved_for == "urgent"
    assert "waiting for 1 stopping job" in decision.notes["urgent"]
    assert decision.admit == []  # the filler may not take what is promised to "urgent"
    assert "promised" in decision.notes["filler"]


def test_fifo_policy_stops_at_the_first_job_that_does_not_fit():
    fifo = FifoPolicy(nodes_of(4))
    jobs = [
        job("a", workers=2, submitted_at=0, priority=0),
        job("b", workers=4, submitted_at=1, priority=9),
        job("c", workers=1, submitted_at=2, est=1),
    ]
    decision = fifo.schedule(0, jobs, [])
    assert admitted(decision) == ["a"] and "b" in decision.notes


def test_schedule_is_pure():
    policy = Policy(nodes_of(4, 4), quotas={"q": {"accel": 5}})
    pending = [
        job(
            f"j{i}",
            workers=1 + i % 3,
            priority=i % 2,
            queue="q" if i % 2 else "default",
            est=i or None,
            submitted_at=i,
            preemptible=bool(i % 3),
        )
        for i in range(8)
    ]
    busy = [running("r", {"n0": 3}, est_end=50, preemptible=True), running("s", {"n1": 2}, priority=1)]
    before = copy.deepcopy((pending, busy))
    first = policy.schedule(7, pending, busy)
    assert (pending, busy) == before  # inputs untouched
    assert policy.schedule(7, list(reversed(pending)), list(reversed(busy))) == first


# -- victim choice --------------------------------------------------------------------------------


def test_victims_fewest_jobs_first():
    nodes = nodes_of(4, 4)
    busy = [running(f"small{i}", {"n0": 1}, preemptible=True, started_at=10 + i) for i in range(4)]
    busy.append(running("big", {"n1": 1}, accel=4, preemptible=True, started_at=0))
    head = job("head", accel=4, priority=1)
    assert choose_victims(head, busy, nodes, free_capacity(nodes, busy)) == ["big"]


def test_victims_lowest_priority_first():
    nodes = nodes_of(2, 2)
    busy = [
        running("mid", {"n0": 1}, accel=2, priority=1, preemptible=True, started_at=5),
        running("low", {"n1": 1}, accel=2, priority=0, preemptible=True, started_at=1),
    ]
    assert choose_victims(job("head", accel=2, priority=2), busy, nodes, free_capacity(nodes, busy)) == [
        "low"
    ]


def test_victims_most_recently_started_first():
    nodes = nodes_of(2, 2)
    busy = [
        running("older", {"n0": 1}, accel=2, preemptible=True, started_at=1),
        running("newer", {"n1": 1}, accel=2, preemptible=True, started_at=9),
    ]
    assert choose_victims(job("head", accel=2, priority=1), busy, nodes, free_capacity(nodes, busy)) == [
        "newer"
    ]


def test_victims_are_never_equal_or_higher_priority_nor_non_preemptible():
    nodes = nodes_of(2)
    head = job("head", workers=2, priority=1)
    for blocker in (
        running("same", {"n0": 2}, priority=1, preemptible=True),
        running("higher", {"n0": 2}, priority=2, preemptible=True),
        running("pinned", {"n0": 2}, priority=0, preemptible=False),
    ):
        assert choose_victims(head, [blocker], nodes, free_capacity(nodes, [blocker])) is None
    # a mix: only the preemptible lower one may go, and alone it is not enough
    mix = [running("low", {"n0": 1}, preemptible=True), running("pinned", {"n0": 1})]
    assert choose_victims(head, mix, nodes, free_capacity(nodes, mix)) is None


def test_victims_gang_across_nodes():
    nodes = nodes_of(2, 2, 2)
    busy = [running(f"v{i}", {f"n{i}": 1}, accel=2, preemptible=True, started_at=i) for i in range(3)]
    victims = choose_victims(
        job("head", workers=2, accel=2, priority=1), busy, nodes, free_capacity(nodes, busy)
    )
    assert victims == ["v2", "v1"]  # two whole nodes, the most recently started


def test_victims_only_what_is_needed():
    nodes = nodes_of(4)
    busy = [
        running("a", {"n0": 1}, preemptible=True, started_at=3),
        running("b", {"n0": 1}, preemptible=True, started_at=2),
        running("c", {"n0": 2}, accel=1, preemptible=True, started_at=1),
    ]
    free = free_capacity(nodes, busy)
    assert choose_victims(job("head", workers=2, priority=1), busy, nodes, free) == ["c"]


def test_stopping_jobs_count_as_released_for_victim_choice():
    nodes = nodes_of(4)
    busy = [
        running("stopping", {"n0": 2}, preemptible=True, stopping=True),
        running("p", {"n0": 2}, preemptible=True),
    ]
    free = free_capacity(nodes, busy)
    assert choose_victims(job("head", workers=2, priority=1), busy, nodes, free) == []
    assert choose_victims(job("head", workers=4, priority=1), busy, nodes, free) == ["p"]


# -- properties -----------------------------------------------------------------------------------

ACCEL = "accel"


@st.composite
def clusters(draw):
    count = draw(st.integers(1, 3))
    return [
        Node(f"n{i}", {ACCEL: float(draw(st.integers(1, 4))), "cpu": float(draw(st.integers(2, 6)))})
        for i in range(count)
    ]


@st.composite
def allocations_on(draw, nodes, max_jobs=6, elastic=False):
    """Running jobs that fit the nodes together (with `elastic`, some at one of their sizes)."""
    free = {node.id: dict(node.capacity) for node in nodes}
    out = []
    for index in range(draw(st.integers(0, max_jobs))):
        request = draw(requests(f"r{index}", elastic=elastic))
        placement = place(request.at_size(draw(st.sampled_from(request.allowed_sizes()))), free)
        if placement is None:
            continue
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
                request.preemptible,
                request.queue,
                draw(st.none() | st.floats(0, 50)),
                draw(st.booleans()) and draw(st.booleans()),  # a quarter are stopping
                sizes=request.sizes,
            )
        )
    return out


@st.composite
def requests(draw, job_id, submitted_at=0.0, elastic=False):
    """A pending job; with `elastic`, half of them elastic (2 to 4 sizes out of 1..6 workers)."""
    per_worker = {
        ACCEL: draw(st.sampled_from([0.0, 1.0, 1.0, 2.0])),
        "cpu": draw(st.sampled_from([0.5, 1.0, 2.0])),
    }
    sizes: tuple[int, ...] = ()
    if elastic and draw(st.booleans()):
        sizes = tuple(sorted(draw(st.sets(st.integers(1, 6), min_size=2, max_size=4)), reverse=True))
    return JobRequest(
        job_id,
        draw(st.integers(0, 2)),
        sizes[0] if sizes else draw(st.integers(1, 3)),
        per_worker,
        submitted_at,
        draw(st.booleans()),
        draw(st.sampled_from(["default", "research"])),
        None,
        sizes=sizes,
    )


@given(st.data())
@settings(max_examples=150, deadline=None)
def test_place_property(data):
    nodes = data.draw(clusters())
    busy = data.draw(allocations_on(nodes))
    free = free_capacity(nodes, busy)
    request = data.draw(requests("x"))
    placement = place(request, free)
    from orchestrator.policy.admission import positive, slots

    room = sum(slots(positive(request.per_worker), node_free, 1 << 30) for node_free in free.values())
    if placement is None:
        assert room < request.workers
    else:
        assert sum(placement.values()) == request.workers and all(c > 0 for c in placement.values())
        for node_id, count in placement.items():
            assert fits(scale(request.per_worker, count), free[node_id])


@given(st.data())
@settings(max_examples=200, deadline=None)
def test_choose_victims_property(data):
    nodes = data.draw(clusters())
    busy = data.draw(allocations_on(nodes))
    free = free_capacity(nodes, busy)
    head = data.draw(requests("head"))
    head.priority = 3 if data.draw(st.booleans()) else head.priority
    victims = choose_victims(head, busy, nodes, free)
    by_id = {a.job_id: a for a in busy}
    stopping = [a for a in busy if a.stopping]

    def fits_after(released: list[Allocation]) -> bool:
        avail = {n: dict(f) for n, f in free.items()}
        for allocation in released:
            for node_id, count in allocation.placement.items():
                for name, amount in allocation.per_worker.items():
                    avail[node_id][name] += amount * count
        return place(head, avail) is not None

    eligible = [a for a in busy if a.preemptible and not a.stopping and a.priority < head.priority]
    if victims is None:
        assert not fits_after(stopping + eligible)
        return
    assert len(set(victims)) == len(victims)
    chosen = [by_id[v] for v in victims]
    assert all(a in eligible for a in chosen)  # never stopping, higher, equal or non-preemptible
    assert fits_after(stopping + chosen)
    for index in range(len(chosen)):  # minimal: none of them could be spared
        assert not fits_after(stopping + chosen[:index] + chosen[index + 1 :])
    if len(chosen) > 1:  # fewest: when a single victim would do, it is chosen
        assert not any(fits_after(stopping + [a]) for a in eligible)


def test_victim_count_matches_brute_force_on_seeded_instances():
    """The greedy search is a heuristic; on small random clusters it finds the smallest set."""
    import itertools

    rng = random.Random(1)
    compared = 0
    for _ in range(3000):
        nodes = [
            Node(f"n{i}", {"a": float(rng.randint(2, 8)), "c": float(rng.randint(4, 8))}) for i in range(3)
        ]
        free = {n.id: dict(n.capacity) for n in nodes}
        busy = []
        for k in range(rng.randint(1, 8)):
            r = JobRequest(
                f"r{k}", rng.randint(0, 2), rng.randint(1, 3), {"a": float(rng.randint(1, 2)), "c": 1.0}, 0
            )
            placement = place(r, free)
            if placement is not None:
                for node_id, count in placement.items():
                    free[node_id] = subtract(free[node_id], scale(r.per_worker, count))
                busy.append(
                    Allocation(
                        r.id, r.priority, placement, r.per_worker, rng.randint(0, 9), rng.random() < 0.8
                    )
                )
        head = JobRequest("h", 3, rng.randint(1, 4), {"a": float(rng.randint(1, 3)), "c": 1.0}, 0)
        victims = choose_victims(head, busy, nodes, free)
        if not victims:
            continue
        eligible = [a for a in busy if a.preemptible]

        def fits_without(chosen, free=free, head=head) -> bool:
            avail = {n: dict(f) for n, f in free.items()}
            for a in chosen:
                for node_id, count in a.placement.items():
                    avail[node_id] = add(avail[node_id], scale(a.per_worker, count))
            return place(head, avail) is not None

        smallest = next(
            k
            for k in range(1, len(eligible) + 1)
            if any(map(fits_without, itertools.combinations(eligible, k)))
        )
        assert len(victims) == smallest, f"{victims} where {smallest} would do"
        compared += 1
    assert compared > 1000


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


# -- no Ray in the policy -------------------------------------------------------------------------

PURE_MODULES = [
    ROOT / "orchestrator" / "policy" / name
    for name in ("__init__.py", "types.py", "queue.py", "admission.py", "preemption.py", "policy.py")
] + [ROOT / "bench" / "scheduler_sim.py"]


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
            "__import__",
            "import_module",
        ):
            names.update(
                arg.value for arg in node.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
            )
    return names


@pytest.mark.parametrize("path", PURE_MODULES, ids=lambda p: p.name)
def test_the_policy_never_imports_ray(path):
    imported = imported_modules(path)
    assert imported, f"{path} parsed to no imports at all"
    assert not [name for name in imported if name == "ray" or name.startswith("ray.")]


def test_the_import_check_sees_ray(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    import ray.train\n    return __import__('ray')\n")
    assert {"ray.train", "ray"} <= imported_modules(sample)
