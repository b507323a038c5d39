"""The time ledger (core/ledger.py): every second of a job in one bucket, from the events and
records the service sees. Pure: no Ray, no torch; a job's life is replayed with made-up times."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.jobs import TRANSITIONS, JobState
from core.ledger import BUCKETS, Goodput, Ledger, cluster_goodput

Q, A, R, S = JobState.QUEUED, JobState.ADMITTED, JobState.RUNNING, JobState.STOPPING


def train(step, time, **fields) -> dict:
    """A train record as rank 0 logs it (core/records.py)."""
    return {"step": step, "loss": 1.0, "time": time, "rank": 0, **fields}


def evaluation(step, time) -> dict:
    return {"step": step, "eval_loss": 0.5, "time": time}


def started(ledger: Ledger, admitted: float, running: float, step: int = 0) -> None:
    ledger.state(A, admitted)
    ledger.state(R, running)
    ledger.rewound(step, running)  # the attempt's start, as the driver reports it


def close_to(got: dict, want: dict) -> bool:
    return all(abs(got[b] - want.get(b, 0.0)) < 1e-9 for b in BUCKETS)


def test_a_normal_run_splits_its_time_and_sums_to_the_wall_time():
    ledger = Ledger(submitted_at=0.0)
    started(ledger, admitted=10.0, running=12.0)
    ledger.record(train(10, 20.0, data_s=0.1, compute_s=0.3, optimizer_s=0.1))  # 10 steps of 0.5 s
    ledger.record(train(20, 25.0))
    ledger.record(evaluation(20, 28.0))  # logged at step 20, then evaluated until 28
    ledger.record(train(30, 40.0, checkpoint_save_s=4.0))  # a save after step 20 blocked 4 s
    ledger.checkpointed(20)
    ledger.record(train(40, 45.0, total_steps=40))  # the last step
    ledger.record(evaluation(40, 47.0))  # the final evaluation
    ledger.state(JobState.SUCCEEDED, 50.0)
    want = {
        "queued": 10.0,
        "starting": 5.0,  # admitted at 10; its first 10 steps took the last 5 s up to 20
        "training": 5.0 + 5.0 + 8.0 + 5.0,
        "evaluating": 3.0 + 2.0,
        "checkpointing": 4.0,
        "stopping": 3.0,  # after the final evaluation: the final checkpoint, the driver's exit
    }
    assert close_to(ledger.buckets(99.0), want), ledger.buckets(99.0)
    assert sum(ledger.buckets(99.0).values()) == pytest.approx(ledger.wall_s(99.0)) == 50.0
    goodput = ledger.goodput(99.0, mfu=0.4)
    assert goodput.scheduling == pytest.approx(40 / 50)
    assert goodput.runtime == pytest.approx(23 / 40)
    assert goodput.time == pytest.approx(23 / 50)
    assert goodput.overall == pytest.approx(23 / 50 * 0.4)


def test_a_short_run_whose_records_arrive_after_it_is_marked_running_still_trained():
    """A job that trains in less than a driver's report interval: the report that marks it
    running comes before the one with its records, whose times are earlier. Its training
    counts all the same (it was once charged to `starting`)."""
    ledger = Ledger(submitted_at=0.0)
    ledger.state(A, 10.0)
    ledger.state(R, 30.0)  # workers started; the driver had seen no record yet
    ledger.rewound(0, 27.0)  # the run began before that report
    ledger.record(train(10, 28.0, data_s=0.01, compute_s=0.08, optimizer_s=0.01), now=31.0)
    ledger.record(train(30, 29.0, total_steps=30), now=31.0)
    ledger.state(JobState.SUCCEEDED, 32.0)
    spent = ledger.buckets(99.0)
    assert spent["starting"] == pytest.approx(27.0 - 10.0) and spent["training"] == pytest.approx(2.0)
    assert sum(spent.values()) == pytest.approx(32.0)


def test_a_report_of_the_start_before_any_record_dates_the_start_by_the_workers_clock():
    """The driver's report that carries the run's start may come before the one with its
    records (a 30-step job trains within one report interval): the start is dated when the
    workers loaded it (`start_time`), not when the report arrived, so the records still train."""
    from types import SimpleNamespace

    from orchestrator.service.progress import account

    job = SimpleNamespace(ledger=Ledger(submitted_at=0.0), attempt=1, last_checkpoint=None)
    job.ledger.state(A, 10.0)
    job.ledger.state(R, 30.0)
    account(job, {"start_step": 0, "start_time": 27.0, "restarts": 0, "records": []})
    batch = [train(10, 28.0, data_s=0.01, compute_s=0.08, optimizer_s=0.01), train(30, 29.0, total_steps=30)]
    account(job, {"start_step": 0, "start_time": 27.0, "restarts": 0, "records": batch})
    job.ledger.state(JobState.SUCCEEDED, 32.0)
    spent = job.ledger.buckets(99.0)
    assert spent["training"] == pytest.approx(2.0) and spent["starting"] == pytest.approx(17.0)


def test_a_live_job_counts_up_to_now_without_changing_its_ledger():
    ledger = Ledger(submitted_at=100.0)
    assert ledger.buckets(130.0)["queued"] == 30.0 and ledger.wall_s(130.0) == 30.0
    started(ledger, 130.0, 131.0)
    ledger.record(train(1, 140.0))
    assert ledger.buckets(150.0) == {**ledger.buckets(140.0), "training": 10.0}
    assert ledger.seconds["training"] == 0.0  # reading did not charge anything


def test_gpu_seconds_are_buckets_times_workers_times_gpus():
    ledger = Ledger(submitted_at=0.0, workers=4, gpus_per_worker=2)
    started(ledger, 10.0, 11.0)
    ledger.record(train(1, 20.0))
    assert ledger.gpu_seconds(30.0) == {
        **dict.fromkeys(BUCKETS, 0.0),
        "queued": 80.0,
        "starting": 80.0,
        "training": 80.0,
    }


def test_a_preemption_stops_requeues_and_resumes_where_it_stopped_losing_nothing():
    ledger = Ledger(submitted_at=0.0)
    started(ledger, 0.0, 1.0)
    ledger.record(train(10, 11.0))
    ledger.state(S, 20.0)  # stop-requested: the workers checkpoint at their next sum
    ledger.record(train(12, 22.0))  # steps of the handshake are kept
    ledger.checkpointed(12)
    ledger.state(JobState.PREEMPTED, 25.0)  # back in the queue
    ledger.state(A, 40.0)
    ledger.state(R, 42.0)
    ledger.rewound(12, 43.0)  # resumes at the step it stopped at
    ledger.record(train(20, 50.0))
    b = ledger.buckets(50.0)
    assert b["stopping"] == pytest.approx(5.0) and b["queued"] == pytest.approx(15.0)
    assert b["lost"] == 0.0
    assert b["starting"] == pytest.approx(11.0 + 10.0)  # both starts, each up to its first step
    assert b["training"] == pytest.approx(9.0 + 0.0)
    assert sum(b.values()) == pytest.approx(50.0)


def test_a_failure_rolls_back_to_its_checkpoint_and_the_lost_work_is_counted():
    ledger = Ledger(submitted_at=0.0)
    started(ledger, 0.0, 0.0)
    ledger.record(train(10, 10.0))  # training from here
    ledger.record(train(20, 20.0))
    ledger.checkpointed(20)
    ledger.record(train(30, 30.0))
    ledger.record(train(40, 40.0))
    ledger.state(Q, 45.0)  # driver-exited: requeued with backoff
    ledger.state(A, 50.0)
    ledger.state(R, 55.0)
    ledger.rewound(20, 60.0)  # resumed from the checkpoint at step 20: steps 21..40 redone
    ledger.record(train(30, 70.0))
    b = ledger.buckets(70.0)
    assert b["training"] == pytest.approx(10.0)  # steps 11..20, kept
    # steps 21..40 (20 s + 5 s until the failure was seen), the restart from its admission
    # (50..60), and the time to the first step again (60..70)
    assert b["lost"] == pytest.approx(25.0 + 10.0 + 10.0)
    assert b["queued"] == pytest.approx(5.0) and b["starting"] == pytest.approx(10.0)
    assert sum(b.values()) == pytest.approx(70.0)
    ledger.record(train(40, 80.0))  # training again
    assert ledger.buckets(80.0)["training"] == pytest.approx(20.0)


def test_a_restart_within_the_attempt_rolls_back_too():
    """Ray Train restarts the worker group: the job stays running, the driver reports a rewind."""
    ledger = Ledger(submitted_at=0.0)
    started(ledger, 0.0, 0.0)
    ledger.record(train(5, 5.0))
    ledger.checkpointed(5)
    ledger.record(train(15, 15.0))
    ledger.rewound(5, 20.0)
    ledger.record(train(15, 30.0))  # the same step numbers again, this time kept
    b = ledger.buckets(30.0)
    assert b["lost"] == pytest.approx(15.0 + 10.0) and b["training"] == pytest.approx(0.0)
    ledger.record(train(20, 35.0))
    assert ledger.buckets(35.0)["training"] == pytest.approx(5.0)


def test_a_checkpoint_reported_before_its_records_is_placed_when_they_arrive():
    ledger = Ledger(submitted_at=0.0)
    started(ledger, 0.0, 0.0)
    ledger.record(train(10, 10.0))
    ledger.checkpointed(20)  # the driver saw the save before the records up to it
    ledger.record(train(20, 20.0))
    ledger.record(train(30, 30.0))
    ledger.rewound(20, 30.0)
    assert ledger.buckets(30.0)["training"] == pytest.approx(10.0)
    assert ledger.buckets(30.0)["lost"] == pytest.approx(10.0)


def test_replayed_history_after_a_rewind_charges_nothing():
    ledger = Ledger(submitted_at=0.0)
    started(ledger, 0.0, 0.0, step=100)  # a run continued from its checkpoint at step 100
    for step in range(90, 101):  # the checkpoint's history, resent with the rewind
        ledger.record(train(step, float(step - 90)))
    assert ledger.buckets(5.0)["training"] == 0.0 and ledger.step == 100


def test_a_stall_is_time_without_a_step_beyond_the_threshold():
    ledger = Ledger(submitted_at=0.0, stall_after_s=10.0)
    started(ledger, 0.0, 0.0)
    ledger.record(train(1, 1.0))
    assert ledger.buckets(31.0)["stalled"] == pytest.approx(20.0)  # live: no step since 1
    ledger.record(train(2, 41.0))
    b = ledger.buckets(41.0)
    assert b["stalled"] == pytest.approx(30.0) and b["training"] == pytest.approx(10.0)


def test_long_saves_and_evaluations_are_not_stalls():
    ledger = Ledger(submitted_at=0.0, stall_after_s=10.0)
    started(ledger, 0.0, 0.0)
    ledger.record(train(1, 1.0))
    ledger.record(evaluation(1, 31.0))  # a 30 s evaluation
    ledger.record(train(2, 65.0, checkpoint_save_s=30.0))  # a 30 s save, then a 4 s step
    b = ledger.buckets(65.0)
    assert b["stalled"] == 0.0
    assert b["evaluating"] == pytest.approx(30.0) and b["checkpointing"] == pytest.approx(30.0)
    assert b["training"] == pytest.approx(4.0)


def test_records_later_than_the_services_clock_are_capped_at_it():
    ledger = Ledger(submitted_at=0.0)
    started(ledger, 0.0, 0.0)
    ledger.record(train(1, 12.0), now=10.0)  # a worker's clock 2 s ahead
    ledger.state(JobState.SUCCEEDED, 10.0)
    assert sum(ledger.buckets(10.0).values()) == pytest.approx(10.0) == ledger.wall_s(10.0)


def test_the_ledger_survives_a_restart_of_the_service_through_json():
    ledger = Ledger(submitted_at=0.0, stall_after_s=60.0, workers=2, gpus_per_worker=1)
    started(ledger, 5.0, 6.0)
    ledger.record(train(10, 10.0))
    ledger.checkpointed(10)
    ledger.record(train(20, 20.0))
    restored = Ledger.from_dict(json.loads(json.dumps(ledger.to_dict())))
    assert restored == ledger
    for each in (ledger, restored):
        each.rewound(10, 30.0)
        each.record(train(15, 35.0))
        each.state(JobState.STOPPED, 40.0)
    assert restored.buckets(50.0) == ledger.buckets(50.0)
    assert Ledger.from_dict({**ledger.to_dict(), "a_field_from_a_newer_version": 1}) == ledger


def test_goodput_is_undefined_before_any_time_passed():
    assert Ledger(submitted_at=5.0).goodput(5.0) == Goodput(None, None, None)
    assert Ledger(submitted_at=5.0).goodput(9.0) == Goodput(0.0, None, None)


def test_the_clusters_goodput_weighs_jobs_by_the_accelerators_they_ask_for():
    big, small = Ledger(submitted_at=0.0, workers=4, gpus_per_worker=2), Ledger(submitted_at=0.0)
    started(big, 0.0, 0.0)
    big.record(train(1, 0.0))  # training all along
    # the small CPU job waits the whole time
    goodput = cluster_goodput([(big, 0.5), (small, None)], now=10.0)
    assert goodput.scheduling == pytest.approx(80 / 90)  # weights 8 and 1
    assert goodput.runtime == pytest.approx(1.0)
    assert goodput.program == pytest.approx(0.5)


# -- properties ------------------------------------------------------------------------------

events = st.lists(
    st.tuples(
        st.sampled_from(["state", "train", "eval", "checkpoint", "rewind", "restore", "read"]),
        st.floats(0.0, 50.0),  # time since the previous event
        st.floats(-20.0, 20.0),  # a record's time against the service's clock
        st.integers(0, 60),  # a step
        st.floats(0.0, 30.0),  # a duration: save, step time
        st.integers(0, 7),  # which allowed transition
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(events, st.sampled_from([None, 5.0, 30.0]))
def test_any_sequence_of_events_sums_to_the_wall_time(sequence, stall_after_s):
    ledger = Ledger(submitted_at=1000.0, stall_after_s=stall_after_s, workers=2, gpus_per_worker=1)
    now, state, step = 1000.0, JobState.QUEUED, 0
    for kind, gap, skew, at_step, duration, choice in sequence:
        now += gap
        if kind == "state" and TRANSITIONS[state]:
            allowed = sorted(TRANSITIONS[state], key=lambda s: s.value)
            state = allowed[choice % len(allowed)]
            ledger.state(state, now)
        elif kind == "train":
            step += at_step % 7
            ledger.record(
                train(
                    step,
                    now + skew,
                    compute_s=duration / 10,
                    data_s=0.0,
                    optimizer_s=0.0,
                    checkpoint_save_s=duration if choice % 3 == 0 else None,
                    total_steps=200,
                ),
                now=now,
            )
        elif kind == "eval":
            ledger.record(evaluation(step, now + skew), now=now)
        elif kind == "checkpoint":
            ledger.checkpointed(at_step)
        elif kind == "rewind":
            ledger.rewound(at_step, now)
            step = at_step
        elif kind == "restore":
            ledger = Ledger.from_dict(json.loads(json.dumps(ledger.to_dict())))
        buckets = ledger.buckets(now)
        assert all(value >= -1e-9 for value in buckets.values()), buckets
        assert abs(sum(buckets.values()) - ledger.wall_s(now)) < 1e-6
    ledger.close(now + 1.0)  # no change to a job that had ended
    final = ledger.buckets(now + 99.0)
    assert abs(sum(final.values()) - (ledger.ended_at - 1000.0)) < 1e-6
    goodput = ledger.goodput(now + 99.0)
    for factor in (goodput.scheduling, goodput.runtime, goodput.time):
        assert factor is None or -1e-9 <= factor <= 1 + 1e-9


def test_a_job_that_fails_for_good_loses_what_it_trained_since_its_checkpoint():
    ledger = Ledger(submitted_at=0.0)
    started(ledger, 0.0, 0.0)
    ledger.record(train(10, 10.0))
    ledger.checkpointed(10)
    ledger.record(train(20, 20.0))
    ledger.state(JobState.FAILED, 25.0)
    b = ledger.buckets(30.0)
    assert b["training"] == pytest.approx(0.0) and b["lost"] == pytest.approx(15.0)
    assert b["starting"] == pytest.approx(10.0) and ledger.wall_s(30.0) == 25.0


def test_a_run_s_start_is_a_rollback_once_however_many_reports_repeat_it():
    ledger = Ledger(0.0)
    ledger.state(JobState.ADMITTED, 10.0)
    ledger.began([1, 0], 0, 11.0)
    for step in range(10, 101, 10):  # a step every second from t=20
        ledger.train(step, 10.0 + step / 10, step_s=1.0)
    ledger.checkpointed(50)
    ledger.state(JobState.QUEUED, 21.0)  # its driver died at step 100
    ledger.state(JobState.ADMITTED, 25.0)
    for _ in range(3):  # the new attempt's reports all say where it began
        ledger.began([2, 0], 50, 30.0)
    # the 6 s trained past step 50 (t=15 to 21) and the 5 s of the restart (t=25 to 30)
    assert ledger.seconds["lost"] == pytest.approx(11.0)
    assert ledger.seconds["training"] == pytest.approx(4.0)
    ledger.train(60, 31.0, step_s=1.0)  # the step after the checkpoint: training again
    assert ledger.seconds["lost"] == pytest.approx(11.0) and ledger.seconds["training"] == pytest.approx(5.0)
    assert sum(ledger.seconds.values()) == pytest.approx(31.0)


def test_a_start_after_a_failure_is_lost_time_and_a_start_after_a_preemption_is_not():
    ledger = Ledger(0.0)
    ledger.state(JobState.ADMITTED, 1.0)
    ledger.began([1, 0], 0, 1.0)
    ledger.train(10, 5.0, step_s=0.1)  # starting 1..4: the record covers steps 1-10
    ledger.failed()  # its driver died: back to the queue
    ledger.state(JobState.QUEUED, 6.0)
    ledger.state(JobState.ADMITTED, 8.0)
    ledger.train(20, 12.0, step_s=0.1)  # the restart, 8..11 (10 steps of 0.1 s trained), is lost
    assert ledger.seconds["lost"] == pytest.approx(3.0)
    ledger.state(JobState.STOPPING, 13.0)
    ledger.state(JobState.PREEMPTED, 14.0)
    ledger.state(JobState.ADMITTED, 15.0)
    ledger.train(30, 18.0, step_s=0.1)  # a start after a preemption is starting again
    assert ledger.seconds["lost"] == pytest.approx(3.0)
    assert ledger.seconds["starting"] == pytest.approx(3.0 + 2.0)  # 10 steps of 0.1 s trained each time
    assert sum(ledger.seconds.values()) == pytest.approx(18.0)


def test_a_worker_group_restarted_within_an_attempt_is_lost_until_its_first_step():
    ledger = Ledger(0.0)
    ledger.state(JobState.ADMITTED, 0.0)
    ledger.began([1, 0], 0, 0.0)
    ledger.train(10, 2.0, step_s=0.1)
    ledger.train(20, 3.0)
    for _ in range(2):  # reported again and again while the new group starts
        ledger.regrouped([1, 1], 5.0)  # a rank died after step 20; Ray Train restarts the group
    ledger.began([1, 1], 20, 9.0)  # it resumed at the newest step: nothing to roll back
    ledger.train(30, 10.0, step_s=0.1)
    # from the old group's newest record (3 s: it died after it) to the new group's run (9 s)
    assert ledger.seconds["lost"] == pytest.approx(6.0)
    assert ledger.seconds["training"] == pytest.approx(2.0 + 1.0)  # to step 20; the new first step
    assert sum(ledger.seconds.values()) == pytest.approx(10.0)
