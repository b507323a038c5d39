"""Hang detection's rule (orchestrator/policy/hangs.py), without Ray."""

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.policy import hangs
from orchestrator.policy.hangs import StepClock


def train(step: int, t: float) -> dict:
    return {"step": step, "loss": 1.0, "time": t}


def running_clock(step=100, now=0.0) -> StepClock:
    clock = StepClock()
    clock.observe(90, group=0, now=now - 10, start=0)
    clock.observe(step, group=0, now=now, start=0)
    return clock


def test_the_automatic_timeout_is_ten_p95_intervals_with_a_floor():
    assert hangs.timeout_s(None, None) == hangs.FLOOR_S
    assert hangs.timeout_s(None, 1.0) == hangs.FLOOR_S
    assert hangs.timeout_s(None, 30.0) == 300.0
    assert hangs.timeout_s(15.0, 30.0) == 15.0  # the spec's setting wins


@settings(deadline=None)  # a busy 2-core machine
@given(st.lists(st.floats(0.0, 1e6), min_size=1, max_size=200))
def test_p95_is_a_value_with_95_percent_at_or_below_it(values):
    p = hangs.p95(values)
    assert p in values
    assert sum(v <= p for v in values) >= 0.95 * len(values)


def test_intervals_come_from_the_records_of_logged_steps():
    clock = StepClock()
    clock.add_records([train(10, 100.0), {"step": 10, "eval_loss": 1.0}, train(20, 102.0), train(30, 105.0)])
    assert list(clock.intervals) == [2.0, 3.0]
    assert clock.p95_interval_s() == 3.0


def test_no_progress_beyond_the_timeout_is_a_hang_and_progress_resets_it():
    clock = running_clock(now=0.0)
    assert not clock.hung(9.0, timeout=10.0, log_every=5)
    assert clock.hung(11.0, timeout=10.0, log_every=5)
    clock.observe(105, group=0, now=11.0)
    assert not clock.hung(20.0, timeout=10.0, log_every=5)


def test_a_stall_is_reported_once():
    clock = running_clock(now=0.0)
    assert clock.hung(11.0, timeout=10.0, log_every=5)
    clock.fired = True
    assert not clock.hung(50.0, timeout=10.0, log_every=5)


def test_a_new_worker_group_is_not_judged_until_it_steps_past_its_start():
    clock = running_clock(now=0.0)
    clock.observe(100, group=1, now=5.0, start=None)  # restarting: the old group's step
    assert not clock.hung(500.0, timeout=10.0, log_every=5)
    clock.observe(50, group=1, now=500.0, start=50)  # resumed from the checkpoint at step 50
    assert not clock.hung(1000.0, timeout=10.0, log_every=5)  # loading, compiling
    clock.observe(55, group=1, now=1000.0, start=50)
    assert clock.hung(1011.0, timeout=10.0, log_every=5)


def test_the_start_timeout_is_the_setting_or_ten_minutes_at_least():
    assert hangs.start_timeout_s(None, None) == hangs.START_FLOOR_S == 600.0
    assert hangs.start_timeout_s(None, 90.0) == 900.0  # the automatic hang timeout when longer
    assert hangs.start_timeout_s(15.0, 90.0) == 15.0  # the spec's setting wins


def test_a_group_without_a_first_step_is_judged_by_the_start_timeout_from_its_start():
    clock = StepClock()
    clock.observe(0, group=0, now=0.0, start=None)  # starting: no workers yet
    assert not clock.hung(1000.0, timeout=10.0, log_every=5, start_timeout=60.0)
    clock.observe(0, group=0, now=1000.0, start=None, workers_up=True)
    clock.observe(0, group=0, now=1030.0, start=0, workers_up=True)  # loaded: the run began
    assert not clock.hung(1089.0, timeout=10.0, log_every=5, start_timeout=60.0)
    assert clock.hung(1091.0, timeout=10.0, log_every=5, start_timeout=60.0)
    clock.observe(5, group=0, now=1092.0, start=0, workers_up=True)  # its first logged step
    assert clock.armed and not clock.hung(1101.0, timeout=10.0, log_every=5, start_timeout=60.0)


def test_the_first_step_seen_may_already_be_past_the_start():
    clock = StepClock()
    clock.observe(20, group=0, now=0.0, start=0)  # the reports missed the steps before
    assert clock.hung(11.0, timeout=10.0, log_every=5)


def test_a_checkpoint_or_evaluation_before_the_next_logged_step_doubles_the_allowance():
    clock = running_clock(step=100, now=0.0)
    assert clock.hung(15.0, timeout=10.0, log_every=5, every=(200, None))
    assert not clock.hung(15.0, timeout=10.0, log_every=5, every=(105, None))  # saves at 105
    assert not clock.hung(15.0, timeout=10.0, log_every=5, every=(None, 104))  # evaluates at 104
    assert clock.hung(21.0, timeout=10.0, log_every=5, every=(105, None))


def test_the_last_step_is_never_a_hang():
    clock = running_clock(step=100, now=0.0)
    assert not clock.hung(1e6, timeout=10.0, log_every=5, total_steps=100)


@settings(deadline=None)  # a busy 2-core machine
@given(st.integers(0, 10**6), st.integers(1, 1000), st.integers(1, 10**4))
def test_may_be_busy_exactly_when_a_multiple_lies_in_the_next_interval(step, log_every, every):
    expected = any((step + k) % every == 0 for k in range(1, log_every + 1))
    assert hangs.may_be_busy(step, log_every, (every,), None) == expected


def test_a_start_is_stuck_only_after_the_deadline_passes_with_no_other_start_completing():
    deadline = 300.0
    assert not hangs.start_stuck(admitted_at=0.0, last_start=0.0, now=300.0, deadline_s=deadline)
    assert hangs.start_stuck(admitted_at=0.0, last_start=0.0, now=301.0, deadline_s=deadline)
    # others' starts got through meanwhile (a head starting many jobs at once): slow, not stuck
    assert not hangs.start_stuck(admitted_at=0.0, last_start=290.0, now=400.0, deadline_s=deadline)
    assert hangs.start_stuck(admitted_at=0.0, last_start=290.0, now=591.0, deadline_s=deadline)
    # a start that ended before this admission says nothing about it
    assert hangs.start_stuck(admitted_at=100.0, last_start=50.0, now=401.0, deadline_s=deadline)
