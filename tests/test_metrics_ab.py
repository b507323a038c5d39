"""The same-run on/off blocks bench/metrics_overhead.py measures with."""

from workers.metrics_ab import MetricsAB


def test_blocks_alternate_and_each_step_is_filed_under_its_block(monkeypatch):
    ab = MetricsAB(block=10)
    assert [ab.logging_on(s) for s in (1, 9, 10, 19, 20)] == [True, True, False, False, True]
    # "on" steps take 3 ticks, "off" steps 1: the medians must say so
    now = 0.0

    def tick():
        return now

    monkeypatch.setattr("workers.metrics_ab.time.perf_counter", tick)
    for step in range(1, 41):
        now += 3.0 if ab.logging_on(step) else 1.0
        ab.step_done(step)
    summary = ab.summary()
    assert summary["on_step_s"] == 3.0 and summary["off_step_s"] == 1.0
    # the first two steps of every block (the switch) are left out: 8 per block, 2 blocks a side
    assert summary["steps"] == {"on": 16, "off": 16}
