"""The scheduling policy's building blocks: resource arithmetic, gang placement, the
"larger than the cluster" check, queue order and quotas.

Resource names are arbitrary: "accel" stands in for GPUs, as a custom Ray resource would.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.policy import (
    JobRequest,
    Node,
    Policy,
    QuotaBook,
    add,
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
from orchestrator.policy.room import View, shape_of
from tests.scheduler_helpers import admitted, allocations_on, clusters, job, nodes_of, requests, running

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


# -- properties -----------------------------------------------------------------------------------


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
