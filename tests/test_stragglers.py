"""Straggler detection's rule (orchestrator/policy/stragglers.py), without Ray."""

import statistics

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.policy.stragglers import THRESHOLD, WINDOW_STEPS, StragglerWindow


def feed(window: StragglerWindow, compute: dict[int, float], steps: int, every: int = 5) -> None:
    for step in range(0, steps + 1, every):
        for rank, seconds in compute.items():
            window.add(rank, step, seconds)


def test_nothing_is_judged_before_every_rank_has_a_full_window():
    window = StragglerWindow()
    feed(window, {0: 0.01, 1: 0.05}, steps=WINDOW_STEPS - 5)
    assert window.ratios() == {} and window.stragglers() == {}
    feed(window, {0: 0.01, 1: 0.05}, steps=WINDOW_STEPS + 5)
    assert set(window.stragglers()) == {1}


def test_the_slow_rank_of_four_is_flagged_with_its_ratio():
    window = StragglerWindow()
    feed(window, {0: 0.010, 1: 0.010, 2: 0.013, 3: 0.010}, steps=100)
    assert window.stragglers() == {2: 1.3 / 1.0}


def test_within_twenty_percent_is_no_straggler():
    window = StragglerWindow()
    feed(window, {0: 0.010, 1: 0.0119, 2: 0.010}, steps=100)
    assert window.stragglers() == {}


def test_the_first_record_of_a_rank_is_not_counted():
    window = StragglerWindow()
    window.add(1, 400, 9.0)  # its mean since the start: warm-up, compilation
    window.add(0, 400, 0.01)
    feed(window, {0: 0.01, 1: 0.01}, steps=600, every=100)
    assert window.ratios() == {0: 1.0, 1: 1.0}


def test_the_window_follows_the_newest_steps():
    window = StragglerWindow()
    feed(window, {0: 0.01, 1: 0.05}, steps=500)
    assert set(window.stragglers()) == {1}
    for step in range(505, 700, 5):  # rank 1 recovered
        window.add(0, step, 0.01)
        window.add(1, step, 0.01)
    assert window.stragglers() == {}


@settings(deadline=None)  # a busy 2-core machine
@given(st.lists(st.floats(0.001, 10.0), min_size=2, max_size=16), st.integers(1, 100))
def test_ratios_are_over_the_median_and_only_those_over_the_threshold_are_flagged(compute, every):
    window = StragglerWindow()
    ranks = dict(enumerate(compute))
    feed(window, ranks, steps=every * (WINDOW_STEPS // every + 2), every=every)
    ratios = window.ratios()
    median = statistics.median(compute)
    for rank, seconds in ranks.items():
        assert abs(ratios[rank] - seconds / median) < 1e-6 * max(1.0, seconds / median)
    assert set(window.stragglers()) == {r for r, ratio in ratios.items() if ratio > THRESHOLD}
