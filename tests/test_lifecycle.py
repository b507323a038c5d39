"""A queued job's state machine: every transition the service takes is in `core.jobs`'s table,
and the only place that assigns a state is `Lifecycle.set_state`.

The lifecycle runs here on a real store (a local pyarrow filesystem) and the real job records;
jobs without a package and without a Ray Job need no Ray, so none is started.
"""

import ast
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from core.jobs import TRANSITIONS, IllegalTransition, JobState, check_transition
from core.spec import validate
from orchestrator.ray.launcher import driver_node
from orchestrator.service import lifecycle, progress
from orchestrator.service.lifecycle import PROGRESS_SAVE_S, Lifecycle
from orchestrator.service.live import LiveMetrics
from orchestrator.service.store import Store
from orchestrator.service.submission import new_record
from tests.conftest import ROOT

SPEC = validate(
    {
        "name": "job",
        "model": {"family": "convnet", "preset": "tiny"},
        "data": {"source": "synthetic"},
        "train": {"steps": 100},
    }
)
CONFIG = SimpleNamespace(start_deadline_s=60.0, backoff_s=1.0, max_backoff_s=8.0, max_failed_starts=3)


class Watched(Lifecycle):
    """The real lifecycle, noting each transition it takes."""

    def __init__(self, store):
        super().__init__(store, runner=None, config=CONFIG, generation=1)
        self.taken: list[tuple[JobState, JobState]] = []

    def set_state(self, job, state, now, *args, **kwargs):
        before = job.state
        super().set_state(job, state, now, *args, **kwargs)
        self.taken.append((before, state))


@pytest.fixture
def life(tmp_path):
    return Watched(Store(str(tmp_path)))


def queued(life, job_id="job-1"):
    job = new_record(SPEC, job_id, {}, launched_by="driver")  # a driver runs it: nothing to launch
    life.jobs[job.id] = job
    return job


def test_waited_counts_only_the_time_in_the_queue(life):
    job = queued(life)  # submitted now: its first wait starts at submission
    start = job.submitted_at
    life.admit(job, {"node-a": 1}, now=start + 4.0)
    life.mark_running(job, attempt=1)
    job.step_time_s, job.total_steps, job.step = 0.5, 100, 40
    assert job.waited(start + 500.0) == 4.0  # running: the clock of the wait is stopped
    life.request_stop(job, "preempt", now=start + 100.0)
    life.preempted(job, now=start + 101.0, acknowledged=True)
    assert job.waited(start + 111.0) == 14.0  # waiting again: 4 s before, 10 s since
    assert job.remaining_s is None  # no estimate while it waits
    life.admit(job, {"node-b": 1}, now=start + 121.0)
    assert job.waited(start + 999.0) == 24.0 and job.step_time_s is None  # this attempt measures anew
    life.mark_running(job, attempt=2)
    job.step_time_s = 0.25
    assert job.remaining_s == 15.0  # (100 - 40) x 0.25, from the new attempt's step time


def test_a_preempted_job_goes_round_and_ends(life):
    job = queued(life)
    life.admit(job, {"node-a": 1}, now=1.0)
    life.mark_running(job, attempt=1)
    job.step, job.last_checkpoint = 40, "/runs/job/checkpoint_00000040"
    life.request_stop(job, "preempt", now=2.0, by="other")
    life.preempted(job, now=3.0, acknowledged=True)
    assert job.state is JobState.PREEMPTED and job.preemptions == 1 and job.steps_lost == 0
    life.admit(job, {"node-b": 1}, now=4.0)
    life.mark_running(job, attempt=2)
    life.request_stop(job, "preempt", now=5.0)
    life.request_stop(job, "stop", now=5.5)  # a stop after a preemption request
    life.finish(job, JobState.STOPPED, now=6.0, reason="stopped by request")
    assert [e["event"] for e in job.history] == [
        "queued",
        "admitted",
        "running",
        "stop-requested",
        "preempted",
        "admitted",
        "running",
        "stop-requested",
        "stop-requested",
        "stopped",
    ]
    assert all(new in TRANSITIONS[old] for old, new in life.taken), life.taken
    assert life.store.load(job.id).state is JobState.STOPPED  # every change is saved


def test_failed_starts_back_off_then_fail(life):
    job = queued(life)
    for attempt in range(CONFIG.max_failed_starts):
        job.not_before = 0.0
        life.admit(job, {"node-a": 1}, now=10.0 * attempt)
        life.start_timed_out(job, now=10.0 * attempt + 1)
    assert job.state is JobState.FAILED and "3 times in a row" in job.reason
    assert all(new in TRANSITIONS[old] for old, new in life.taken)
    assert (JobState.ADMITTED, JobState.QUEUED) in life.taken


def test_a_driver_that_dies_while_running_requeues_with_the_steps_it_lost(life):
    job = queued(life)
    job.package = "/store/packages/job-1"  # the service can start it again
    job.submission_id = "job-1-a1"  # its driver runs already (a Ray Job)
    life.admit(job, {"node-a": 1}, now=1.0)
    life.mark_running(job, attempt=1)
    job.step, job.last_checkpoint = 57, "/runs/job/checkpoint_00000050"
    life.driver_gone(job, now=2.0, status="FAILED")
    assert job.state is JobState.QUEUED and job.steps_lost == 7 and job.not_before > 2.0
    assert job.history[-1]["event"] == "driver-exited"


def test_a_node_loss_counts_its_lost_steps_from_where_the_next_attempt_resumed(life):
    job = queued(life)
    life.admit(job, {"node-a": 1, "node-b": 1}, now=1.0)
    life.mark_running(job, attempt=1)
    job.step, job.last_checkpoint = 470, "/runs/job/checkpoint_00000400"
    life.node_lost(job, ["node-b"], now=2.0, why={"node-b": "does not answer (refused)"})
    assert job.steps_lost == 70  # noticed: from the last step and checkpoint the service knew
    # the ended attempt's summary: it reached 500; its driver knew of no newer checkpoint
    life.correct_node_loss(job, 1, {"steps": 500, "checkpoint_step": 400})
    assert job.steps_lost == 100
    life.admit(job, {"node-a": 2}, now=3.0)
    # the checkpoint at 500 was announced after the abort: the next attempt starts there
    live, watchdog = LiveMetrics(), SimpleNamespace(observe=lambda *a: None)
    assert progress.fold(job, {"start_step": 500, "step": 500}, live, watchdog)
    lost = next(e for e in job.history if e["event"] == "node-lost")
    assert job.steps_lost == 0 and lost["steps_lost"] == 0 and lost["resumed_at"] == 500
    assert not progress.fold(job, {"start_step": 500, "step": 500}, live, watchdog)  # once


def test_the_job_table_files_each_job_under_its_state_as_it_changes(life):
    a, b, c = queued(life, "a"), queued(life, "b"), queued(life, "c")
    assert life.jobs.pending() == [a, b, c] and life.jobs.holding() == []
    life.admit(b, {"node-a": 1}, now=b.submitted_at + 1.0)
    life.stop(c, now=c.submitted_at + 2.0)  # a queued job just leaves the queue
    assert life.jobs.pending() == [a] and life.jobs.holding() == [b]
    assert list(life.jobs.in_states([JobState.STOPPED])) == [c] and life.jobs.alive() == [a, b]
    assert life.jobs.count(JobState.ADMITTED) == 1 and len(life.jobs) == 3
    life.jobs.pop("a")
    assert life.jobs.pending() == [] and "a" not in life.jobs


def test_a_step_alone_is_saved_every_few_seconds_a_checkpoint_at_once(life, monkeypatch):
    job = queued(life)
    life.admit(job, {"node-a": 1}, now=1.0)
    life.mark_running(job, attempt=1)  # saved
    live, watchdog = LiveMetrics(), SimpleNamespace(observe=lambda *a: None)
    assert progress.fold(job, {"step": 10}, live, watchdog) == progress.STEP
    life.save_progress(job)
    assert life.store.load(job.id).step == 0  # saved a moment ago: the store waits
    later = time.monotonic() + PROGRESS_SAVE_S
    monkeypatch.setattr(lifecycle.time, "monotonic", lambda: later)
    life.save_progress(job)
    assert life.store.load(job.id).step == 10
    change = {"step": 20, "checkpoint": "/runs/job/checkpoint_00000020"}
    assert progress.fold(job, change, live, watchdog) == progress.RECORD  # the caller saves it now
    assert progress.fold(job, {"step": 20, "step_time_s": 0.5}, live, watchdog) == progress.NOTHING


def test_the_table_refuses_what_no_path_leads_to(life):
    job = queued(life)
    with pytest.raises(IllegalTransition):
        life.mark_running(job, attempt=1)  # queued -> running skips admission
    assert job.state is JobState.QUEUED
    for end in (JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED):
        assert TRANSITIONS[end] == frozenset()
        with pytest.raises(IllegalTransition):
            check_transition("x", end, JobState.QUEUED)


def test_only_the_lifecycle_assigns_a_state():
    """`job.state = ...` (or a tuple assignment that includes it) appears once in the control plane:
    in Lifecycle.set_state."""
    assignments = []
    for path in (ROOT / "orchestrator").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    leaves = target.elts if isinstance(target, ast.Tuple) else [target]
                    for leaf in leaves:  # `job.state = ...`, `a, job.state = ...`; not `self.state`
                        if (
                            isinstance(leaf, ast.Attribute)
                            and leaf.attr == "state"
                            and not (isinstance(leaf.value, ast.Name) and leaf.value.id == "self")
                        ):
                            assignments.append(f"{Path(path).relative_to(ROOT)}:{node.lineno}")
    assert len(assignments) == 1 and assignments[0].startswith("orchestrator/service/lifecycle.py"), (
        assignments
    )


class Launches:
    """The service's Ray Jobs, as the lifecycle sees them: where each driver was asked to run."""

    def __init__(self):
        self.started: list[tuple[str, dict]] = []

    def launch(self, job_id, attempt, package, placement, groups=1):
        self.started.append((f"{job_id}-a{attempt}", dict(placement)))
        return self.started[-1][0], driver_node(placement)


def test_the_service_starts_one_driver_per_attempt_on_the_jobs_own_node(tmp_path):
    life = Lifecycle(Store(str(tmp_path)), runner=Launches(), config=CONFIG, generation=1)
    job = new_record(SPEC, "job-1", {}, launched_by="service")
    job.package = str(tmp_path / "package")
    life.jobs[job.id] = job
    life.admit(job, {"node-b": 1, "node-a": 2}, now=1.0)
    assert job.submission_id == "job-1-a1" and job.driver_node == "node-a"  # most of its workers
    life.mark_running(job, attempt=1)
    life.request_stop(job, "preempt", now=5.0)
    life.preempted(job, now=6.0, acknowledged=True)
    assert job.submission_id is None and job.driver_node is None  # it ended with its attempt
    life.admit(job, {"node-c": 1}, now=9.0)  # so the next admission starts another, there
    assert life.runner.started == [("job-1-a1", {"node-b": 1, "node-a": 2}), ("job-1-a2", {"node-c": 1})]
    assert job.driver_node == "node-c"


def test_a_driver_that_queued_its_own_job_keeps_waiting_for_the_next_admission(life):
    job = queued(life)  # `ray job submit` or a terminal: the driver is not the service's
    job.submission_id = "raysubmit_1"
    life.admit(job, {"node-a": 1}, now=1.0)
    life.mark_running(job, attempt=1)
    life.request_stop(job, "preempt", now=5.0)
    life.preempted(job, now=6.0, acknowledged=True)
    assert job.submission_id == "raysubmit_1" and job.driver_node is None


def test_the_driver_node_is_the_one_with_most_workers_and_rank_zeros_on_a_tie():
    from orchestrator.service.runner import driver_node

    assert driver_node({"b": 2, "a": 2, "c": 1}) == "a"
    assert driver_node({"b": 3, "a": 2}) == "b"
    assert driver_node({}) is None
