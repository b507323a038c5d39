"""Victim choice (orchestrator/policy/preemption.py): which lower-priority preemptible jobs a
head stops, unit tests and properties (minimal, fewest, against brute force).

Resource names are arbitrary: "accel" stands in for GPUs, as a custom Ray resource would.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.policy import (
    Allocation,
    JobRequest,
    Node,
    add,
    choose_victims,
    free_capacity,
    place,
    scale,
    subtract,
)
from tests.scheduler_helpers import allocations_on, clusters, job, nodes_of, requests, running

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
