"""The service's watch over running jobs (watchdog.py) and the reading of py-spy's stacks
(stacks.where), without Ray."""

from core.jobs import JobState
from core.spec import validate
from orchestrator.scheduler import stacks
from orchestrator.scheduler.store import JobRecord
from orchestrator.scheduler.watchdog import Watchdog

WORKERS = {
    0: {"pid": 101, "node": "10.0.0.1", "node_id": "aaaa"},
    1: {"pid": 202, "node": "10.0.0.2", "node_id": "bbbb"},
}

DUMP = """Process 202: ray::RayTrainWorker.train_fn
Python v3.11.7 (/usr/bin/python3.11)

Thread 202 (idle): "MainThread"
    main_loop (ray/_private/worker.py:946)
    <module> (ray/_private/workers/default_worker.py:330)
Thread 260 (idle): "TrainingThread"
    _wait_for_data_that_never_comes (/tmp/r/runtime_resources/wd/pkg/workers/faults.py:47)
    blocking_data_source (/tmp/r/runtime_resources/wd/pkg/workers/faults.py:40)
    run (/tmp/r/runtime_resources/wd/pkg/workers/trainer.py:162)
    train (/tmp/r/runtime_resources/wd/pkg/workers/trainer.py:233)
    run (/usr/lib/python3.11/threading.py:982)
"""


def job(hang_timeout_s=None, state=JobState.RUNNING, attempt=1) -> JobRecord:
    spec = validate(
        {
            "name": "job",
            "model": {"family": "convnet", "preset": "convnet_small"},
            "data": {"source": "synthetic"},
            "train": {"steps": 1000},
            "checkpoint": {"storage": "/tmp/runs", "every_steps": 500},
            "metrics": {"log_every": 5},
            "fault_tolerance": {"hang_timeout_s": hang_timeout_s},
        },
        "test",
    )
    return JobRecord(
        id="job-1",
        name="job",
        spec=spec,
        priority=0,
        queue="default",
        preemptible=False,
        workers=2,
        per_worker={"CPU": 1.0},
        submitted_at=0.0,
        state=state,
        attempt=attempt,
        total_steps=1000,
    )


def report(step, t, compute=(0.01, 0.01), restarts=0, workers=WORKERS) -> dict:
    return {
        "step": step,
        "start_step": 0,
        "restarts": restarts,
        "workers": workers,
        "records": [{"step": step, "loss": 1.0, "time": t, "rank": 0, "compute_s": compute[0]}],
        "ranks": {1: {"step": step, "rank": 1, "compute_s": compute[1]}},
    }


def test_where_is_the_innermost_frame_of_the_training_loop():
    assert stacks.where(DUMP) == (
        "_wait_for_data_that_never_comes (/tmp/r/runtime_resources/wd/pkg/workers/faults.py:47)"
    )
    assert stacks.where("no stack: the dashboard said 404") is None
    shortened = (
        "Thread 7 (idle)\n    wait (threading.py:320)\n    forward (torch/nn/x.py:5)\n"
        "    step (workers/trainer.py:130)\n"
    )
    assert stacks.where(shortened) == "step (workers/trainer.py:130)"  # py-spy's default file names


def test_a_job_that_stops_stepping_is_hung_once_after_its_timeout():
    dog, j = Watchdog(), job(hang_timeout_s=10)
    for i, step in enumerate(range(5, 30, 5)):
        dog.observe(j, report(step, float(i)), now=float(i))
    assert dog.hung([j], now=10.0) == []
    [(found, watch, timeout)] = dog.hung([j], now=15.0)
    assert found is j and timeout == 10 and watch.workers == WORKERS
    assert dog.hung([j], now=30.0) == []  # handled: not again for the same stall


def test_only_running_jobs_of_the_current_attempt_are_judged():
    dog, j = Watchdog(), job(hang_timeout_s=10)
    dog.observe(j, report(5, 0.0), now=0.0)
    dog.observe(j, report(10, 1.0), now=1.0)
    assert dog.hung([job(hang_timeout_s=10, state=JobState.STOPPING)], now=100.0) == []
    assert dog.hung([job(hang_timeout_s=10, attempt=2)], now=100.0) == []


def test_the_automatic_timeout_follows_the_jobs_own_logged_intervals():
    dog, j = Watchdog(), job()
    for i, step in enumerate(range(5, 100, 5)):
        dog.observe(j, report(step, 30.0 * i), now=30.0 * i)
    assert dog.timeout_s(j) == 300.0  # 10 x 30 s between logged steps


def test_a_slow_rank_is_flagged_with_its_node_once_per_worker_group():
    dog, j = Watchdog(), job()
    for step in range(5, 200, 5):
        dog.observe(j, report(step, float(step), compute=(0.01, 0.02)), now=float(step))
    [flagged] = dog.stragglers(j.id)
    assert flagged["rank"] == 1 and flagged["node"] == "bbbb" and flagged["ip"] == "10.0.0.2"
    assert abs(flagged["ratio"] - 2 / 1.5) < 1e-9
    assert {r["rank"]: r["node"] for r in dog.ratios(j.id)} == {0: "aaaa", 1: "bbbb"}
    assert [s["rank"] for s in dog.new_stragglers(j.id)] == [1]
    assert dog.new_stragglers(j.id) == []
    dog.observe(j, report(205, 205.0, restarts=1), now=205.0)  # a new worker group
    assert dog.stragglers(j.id) == []
