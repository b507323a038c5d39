"""The same-run on/off blocks bench/metrics_overhead.py measures with."""

from workers.metrics_ab import MetricsAB


def test_blocks_alternate_and_each_step_is_filed_under_its_block(monkeypatch):
    ab = MetricsAB(block=10)
    # a warm-up block that logs, then on, off, off, on, on, off, off, on
    sides = [ab.side(10 * block + 5) for block in range(10)]
    assert sides == [None, "on", "off", "off", "on", "on", "off", "off", "on", "on"]
    assert [ab.logging_on(s) for s in (1, 9, 10, 19, 20, 39, 40)] == [
        True,
        True,
        True,
        True,
        False,
        False,
        True,
    ]
    # "on" steps take 3 ticks, "off" steps 1; one "on" step pays a batch cost of 16 more
    now = 0.0

    def tick():
        return now

    monkeypatch.setattr("workers.metrics_ab.time.perf_counter", tick)
    for step in range(1, 51):
        now += (3.0 + (16.0 if step == 45 else 0.0)) if ab.logging_on(step) else 1.0
        ab.step_done(step)
    summary = ab.summary()
    # the mean counts the batch cost in full (16 ticks over 16 steps); the median hides it
    assert summary["on_step_s"] == 4.0 and summary["off_step_s"] == 1.0
    assert summary["on_median_s"] == 3.0 and summary["off_median_s"] == 1.0
    # the warm-up and the first two steps of every block (the switch) are left out: 8 per
    # block, 2 blocks a side
    assert summary["steps"] == {"on": 16, "off": 16}


def test_a_steady_drift_weighs_on_both_sides_alike(monkeypatch):
    # steps slow down steadily and logging costs nothing: over on, off, off, on the sides agree
    # (on, off, on, off would put the "on" blocks earlier, and show a cost that is not there)
    ab = MetricsAB(block=10)
    now = 0.0
    monkeypatch.setattr("workers.metrics_ab.time.perf_counter", lambda: now)
    for step in range(1, 50):
        now += 1.0 + 0.01 * step
        ab.step_done(step)
    summary = ab.summary()
    assert abs(summary["on_step_s"] - summary["off_step_s"]) < 1e-9
