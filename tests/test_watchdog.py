"""The service's watch over running jobs, the reading of py-spy's stacks (stacks.where)
and what the service does about a straggler (all in health.py but stacks), without Ray."""

import dataclasses
import threading
from types import SimpleNamespace

from core.jobs import JobState
from core.spec import validate
from orchestrator.policy.policy import Policy
from orchestrator.policy.types import Node
from orchestrator.service import stacks
from orchestrator.service.cycle import request
from orchestrator.service.health import Health, Watchdog
from orchestrator.service.lifecycle import Lifecycle
from orchestrator.service.store import JobRecord, Store
from orchestrator.service.views import Views

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


def test_the_job_view_says_hung_until_the_job_steps_again():
    """The view the CLI, the HTTP API and the status page read (not only the exporter's)."""
    dog, j = Watchdog(), job(hang_timeout_s=10)
    views = Views({j.id: j}, {}, dog, SimpleNamespace(notes={}))
    for i, step in enumerate(range(5, 30, 5)):
        dog.observe(j, report(step, float(i)), now=float(i))
    assert views.job(j)["hung"] is False
    assert dog.hung([j], now=15.0)
    assert views.job(j)["hung"] is True and views.job(j, history=False)["hung"] is True
    dog.observe(j, report(30, 16.0), now=16.0)
    assert views.job(j)["hung"] is False


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


def starting(t, restarts=0, start_step=0, step=0, workers=WORKERS) -> dict:
    """A report of a worker group that is up (or starting) and has logged no step past its start."""
    return {"step": step, "start_step": start_step, "restarts": restarts, "workers": workers, "records": []}


def test_a_worker_group_without_a_first_step_is_hung_after_the_start_timeout():
    dog, j = Watchdog(), job(hang_timeout_s=10)
    dog.observe(j, starting(0.0, start_step=None, workers={}), now=0.0)  # Ray Train starts the group
    assert dog.hung([j], now=100.0) == []  # no workers yet: the start deadline's business
    dog.observe(j, starting(100.0, start_step=None), now=100.0)  # all workers up, loading
    dog.observe(j, starting(104.0), now=104.0)  # the run began at step 0: no step since
    assert dog.hung([j], now=113.0) == []  # 9 s since it began (the user's timeout also bounds start-up)
    [(found, watch, timeout)] = dog.hung([j], now=115.0)
    assert found is j and timeout == 10 and watch.workers == WORKERS
    assert not watch.clock.armed and watch.clock.stalled_s(115.0) == 11.0
    assert dog.hung([j], now=200.0) == []  # handled: not again for the same stall


def test_the_default_start_timeout_leaves_room_for_compilation():
    dog, j = Watchdog(), job()  # no hang_timeout_s
    assert dog.timeout_s(j, start=True) == 600.0  # max(600 s, the automatic hang timeout of 120 s)
    dog.observe(j, starting(0.0), now=0.0)
    assert dog.hung([j], now=590.0) == []  # compiling for ten minutes is no hang
    [(_, _, timeout)] = dog.hung([j], now=601.0)
    assert timeout == 600.0


def test_a_restarted_worker_group_that_never_steps_is_hung():
    dog, j = Watchdog(), job(hang_timeout_s=10)
    for step in range(5, 30, 5):  # the first group trains
        dog.observe(j, report(step, float(step)), now=float(step))
    # Ray Train restarts the group; it resumes at its checkpoint's step 25 and never steps
    dog.observe(j, starting(40.0, restarts=1, start_step=None, step=25), now=40.0)
    dog.observe(j, starting(42.0, restarts=1, start_step=25, step=25), now=42.0)
    assert dog.hung([j], now=51.0) == []  # 9 s since it loaded its checkpoint
    [(_, watch, timeout)] = dog.hung([j], now=53.0)
    assert timeout == 10 and watch.group == 1 and not watch.clock.armed
    # a group that steps is judged by the hang timeout from there on, not the start timeout
    dog.observe(j, report(30, 60.0, restarts=2), now=60.0)  # a third group, up at 60 s
    dog.observe(j, {**report(35, 62.0, restarts=2), "start_step": 25}, now=62.0)
    assert dog.watches[j.id].clock.armed and dog.hung([j], now=71.0) == []


# -- what the service does about a straggler (health.py), on a real store -------------------------


def straggling(tmp_path, node_count: int):
    """A running 2-worker job (1 slot each) with `on_straggler: restart_excluding_node` whose
    rank 1 (node bbbb) computes twice as long as rank 0 (1.33x their median), on a cluster of
    `node_count` 1-slot nodes."""
    spec = job().spec.model_copy(deep=True)
    spec.fault_tolerance.on_straggler = "restart_excluding_node"
    j = dataclasses.replace(job(), spec=spec, per_worker={"slot": 1.0}, placement={"aaaa": 1, "bbbb": 1})
    lifecycle = Lifecycle(Store(str(tmp_path)), None, None, generation=1)
    lifecycle.jobs[j.id] = j
    nodes = [Node(n, {"slot": 1.0}) for n in ("aaaa", "bbbb", "cccc")[:node_count]]
    policy = Policy(nodes)
    health = Health(lifecycle, SimpleNamespace(policy=policy), Watchdog(), threading.RLock(), "", None)
    for step in range(5, 200, 5):
        health.watchdog.observe(j, report(step, float(step), compute=(0.01, 0.02)), now=float(step))
    return j, health


def test_a_straggler_restarts_its_job_away_from_its_node_once(tmp_path):
    j, health = straggling(tmp_path, node_count=3)
    assert health.stragglers(j, now=200.0)
    assert j.state is JobState.STOPPING and j.stop_requested == "preempt"  # checkpoint, requeue
    assert j.avoid_nodes == ["bbbb"]
    flagged, stop = j.history[-2:]
    assert flagged["event"] == "straggler" and flagged["action"] == (
        "restarting away from node bbbb: rank 1 straggles, 1.33x the median"
    )
    assert stop["event"] == "stop-requested" and stop["for"] == "straggler on node bbbb"
    stored = Store(str(tmp_path)).load_all()[j.id]  # saved before anyone learns of it
    assert stored.avoid_nodes == ["bbbb"] and stored.state is JobState.STOPPING
    # the next pass places it off that node (the job as the service hands it to the policy)
    decision = health.cycle.policy.schedule(300.0, [request(stored)], [])
    assert decision.admit == [(j.id, {"aaaa": 1, "cccc": 1})]
    assert health._cannot_restart_away(j, "bbbb") == "warning only: node bbbb is avoided already"


def test_a_job_that_would_not_fit_without_the_node_is_only_warned(tmp_path):
    j, health = straggling(tmp_path, node_count=2)  # two 1-slot nodes: it needs both
    assert health.stragglers(j, now=200.0)
    assert j.state is JobState.RUNNING and j.stop_requested is None and j.avoid_nodes == []
    action = j.history[-1]["action"]
    assert action.startswith("warning only, not restarted away from node bbbb: job job-1 needs 2 worker(s)")
    assert "room for only 1 such worker(s)" in action
