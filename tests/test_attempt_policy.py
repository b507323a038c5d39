"""One attempt, without Ray: its states and their table, the decisions its policy makes (what a
stop does in each state, how a failure is classified, what is reported), and its owner, the
AttemptController, driven through the workers' calls with listeners that record what they are
told."""

import os
import threading

import pytest

from core.spec import load_spec
from orchestrator.attempt import policy
from orchestrator.attempt.controller import AttemptController
from orchestrator.attempt.listeners import Feed, Listener
from orchestrator.attempt.runs import GroupRun, Runs
from orchestrator.attempt.states import (
    TRANSITIONS,
    Aborting,
    Ended,
    IllegalTransition,
    Progress,
    Restarting,
    RunStarted,
    Starting,
    Stopping,
    StopRequested,
    Training,
    WorkerFailed,
    check_transition,
)
from tests.conftest import ROOT


def test_a_stop_before_the_first_step_aborts_and_after_it_checkpoints():
    state = Starting()
    for request in ("stop", "preempt"):
        assert isinstance(policy.after_stop_request(state, StopRequested(request)), Aborting)
    assert policy.after_stop_request(state, StopRequested("preempt")) == Aborting(
        "preempted", "preempted before its first step"
    )
    # a group that failed before training restarts: still starting
    assert policy.after_event(state, WorkerFailed(1, "boom", True)) == state
    state = policy.after_event(state, RunStarted(0, 40))
    assert state == Training(40)
    assert policy.after_stop_request(state, StopRequested("preempt")) == Stopping("preempt")
    # the service requeued it: nothing to wait for
    assert policy.after_stop_request(state, StopRequested("abort", "requeued")) == Aborting(
        "aborted", "requeued"
    )


def test_a_restart_after_training_keeps_the_checkpointing_stop():
    state = policy.after_event(Training(0), WorkerFailed(1, "reset by peer", True))
    assert state == Restarting(1, "reset by peer")
    assert policy.after_stop_request(state, StopRequested("stop")) == Stopping("stop")
    assert policy.after_event(state, RunStarted(1, 50)) == Training(50)  # the newest checkpoint
    stopping = Stopping("stop")
    assert policy.after_event(stopping, RunStarted(2, 60)) == stopping  # changes nothing a stop needs
    assert policy.after_stop_request(stopping, StopRequested("preempt")) == stopping  # the first wins
    assert isinstance(policy.after_stop_request(stopping, StopRequested("abort")), Aborting)


def test_the_ends_are_final_and_every_state_can_end():
    assert TRANSITIONS[Ended] == set()
    for state, allowed in TRANSITIONS.items():
        if state is not Ended:
            assert Ended in allowed, state
    check_transition(Aborting("aborted", "x"), Ended({}))
    with pytest.raises(IllegalTransition):
        check_transition(Aborting("aborted", "x"), Training(3))  # a late event cannot revive it
    with pytest.raises(IllegalTransition):
        check_transition(Ended({}), Stopping("stop"))
    assert policy.after_stop_request(Ended({}), StopRequested("abort")) == Ended({})


FAILED_GROUP = {"died": [], "text": "Training failed", "group": True}


@pytest.mark.parametrize(
    "error,failure,reason,retryable,infrastructure",
    [
        ({"rank": 1, "reason": "bad data", "retry": False}, None, "rank 1: bad data", False, False),
        (
            {"rank": 0, "reason": "Connection reset by peer", "retry": True},
            FAILED_GROUP,
            "rank 0: Connection reset by peer; no restarts left (fault_tolerance.max_failures: 2)",
            True,
            True,
        ),
        (
            None,
            {"died": [1], "text": "", "group": True},
            "worker rank 1 died (killed, out of memory or its node lost); no restarts left "
            "(fault_tolerance.max_failures: 2)",
            True,
            True,
        ),
        (None, None, "the workers stopped without a result", True, False),
    ],
)
def test_a_failed_run_is_classified_for_the_service(error, failure, reason, retryable, infrastructure):
    progress = Progress(total_steps=100, last_step=42, last_checkpoint="/r/checkpoint_00000040")
    progress.checkpoint_step = 40
    summary = policy.ended_summary(policy.RunEnd(None, error, failure, 2), progress, "job", "run", 2)
    assert (summary["status"], summary["reason"]) == ("failed", reason)
    assert (summary["retryable"], summary["infrastructure"]) == (retryable, infrastructure)
    assert summary["steps"] == 42 and summary["checkpoint_step"] == 40 and summary["restarts"] == 1
    assert policy.exit_code(summary) == 1


def test_the_workers_summary_is_reported_as_theirs():
    workers = {"job": "j", "run": "r", "status": "stopped_early", "steps": 7, "samples_per_s": 1.0}
    progress = Progress(total_steps=7, resumed_from=3)
    summary = policy.ended_summary(policy.RunEnd(workers, None, None, 1), progress, "j", "r", 0)
    assert summary["status"] == "stopped_early" and summary["resumed_from_step"] == 3
    assert policy.outcome(summary) == "succeeded" and policy.exit_code(summary) == 0
    assert "retryable" not in summary


def test_a_feed_drops_what_its_follower_has_read():
    feed = Feed()
    for i in range(3):
        feed.event("job", f"line {i}")
    calls, cursor = feed.since(0)
    assert [text for _, _, text, _ in calls] == ["line 0", "line 1", "line 2"] and cursor == 3
    feed.update("job", state="running")
    # a read that never arrived (a timeout) is asked again from the same cursor: nothing lost
    assert feed.since(3) == feed.since(3) == ([("update", "job", None, {"state": "running"})], 4)
    assert len(feed.calls) == 1  # the first three are dropped once the follower asks past them
    assert feed.since(4) == ([], 4) and feed.calls == []
    # nobody reads it (the service's attempts): it keeps the newest `keep` calls only
    small = Feed(keep=2)
    for i in range(5):
        small.event("job", f"line {i}")
    calls, cursor = small.since(0)
    assert [text for _, _, text, _ in calls] == ["line 3", "line 4"] and cursor == 5


class Recorder(Listener):
    def __init__(self):
        self.told = []

    def event(self, event, progress):
        self.told.append(type(event).__name__)

    def state_changed(self, before, after, progress):
        self.told.append(f"{type(before).__name__}->{type(after).__name__}")


def made_on_a_thread_of_its_own(factory):
    """`factory()` on a thread of its own: an attempt controller lowers the priority of the
    thread that makes it (bookkeeping), which this test process, and what it starts, must not
    inherit."""
    made = []
    thread = threading.Thread(target=lambda: made.append(factory()))
    thread.start()
    thread.join()
    return made[0]


def test_the_controller_moves_its_state_only_through_set_state_and_tells_every_listener():
    before = os.getpriority(os.PRIO_PROCESS, 0)  # this thread's nice value (Linux: per thread)
    controller = made_on_a_thread_of_its_own(AttemptController)
    assert os.getpriority(os.PRIO_PROCESS, 0) == before
    recorder = Recorder()
    controller.listeners = [recorder]
    controller.progress = Progress(total_steps=10)
    assert controller.join("pg-1", 0, 2, 11, "10.0.0.1", "n1") == 0
    assert controller.join("pg-1", 1, 2, 12, "10.0.0.2", "n2") == 0
    controller.restore(0, [{"step": 4, "loss": 1.0}], {"checkpoint": "/r/checkpoint_00000004", "step": 4})
    controller.log(0, [{"step": 5, "loss": 0.9, "total_steps": 10}])
    controller._take_events()
    assert recorder.told == ["WorkersStarted", "Rewound", "RunStarted", "Starting->Training", "Records"]
    assert controller.state == Training(4) and controller.progress.last_step == 5
    controller._set_state(policy.after_stop_request(controller.state, StopRequested("preempt")))
    assert controller.stop_requested() == "preempt"  # what rank 0 reads, set with the state
    # a new group (a restart) replaces the old one: a late record of the old group is dropped
    controller.join("pg-2", 0, 1, 13, "10.0.0.1", "n1")
    controller.log(0, [{"step": 6, "loss": 0.8}])
    controller.fail(1, "gone", retry=True)
    controller.fail(0, "bad data", retry=False)
    assert controller.fatal() == "bad data"  # the failure a restart cannot mend wins
    controller._take_events()
    assert controller.progress.last_step == 5 and controller.state == Stopping("preempt")
    assert [name for name, _ in controller.path] == ["starting", "training", "stopping"]


def test_records_a_joined_group_lacks_are_in_storage_at_once_the_others_at_the_next_flush(tmp_path):
    """The attempt's metrics log (`MetricsLog`): records in the log's buffer until its next
    flush, but a batch the workers send as durable (replica groups: records a group that joined
    lacks, which it reads back from storage should it come to lead) written at once."""
    from core.metrics_log import read_metrics
    from orchestrator.attempt.listeners import MetricsLog
    from orchestrator.attempt.states import Records, Rewound

    log = MetricsLog(str(tmp_path / "run"), tensorboard=False)
    progress = Progress(total_steps=10)
    log.event(Rewound([]), progress)
    log.event(Records([{"step": 1, "loss": 1.0, "time": 1.0}]), progress)
    assert read_metrics(str(tmp_path / "run")) == []  # buffered until the next flush
    log.event(Records([{"step": 2, "loss": 0.9, "time": 2.0}], durable=True), progress)
    assert [r["step"] for r in read_metrics(str(tmp_path / "run"))] == [1, 2]
    log.log.close()


def two_groups():
    sets = ["fault_tolerance.replica_groups=2", "resources.num_workers=2"]
    return load_spec(ROOT / "jobs/convnet.yaml", sets)


class StartsRecorded(Runs):
    """`Runs` whose replacement groups are recorded, not started (no Ray Train here)."""

    def _start(self, group, placement):
        self.started.append((group, placement))
        self.current[group] = GroupRun(group, placement)


def test_a_group_judged_lost_while_it_runs_is_told_to_leave_and_replaced_without_waiting_for_it():
    """The service marks a replica group lost (its node's raylet stopped answering, or Ray
    declared the node dead) while the group's workers may still train: the attempt dismisses it
    once, its worker group reads "leave" (the others the attempt's own stop), its summary is not
    the attempt's, and its replacement starts once the service places it, whether or not the
    dismissed run has ended."""
    spec = two_groups()
    controller = made_on_a_thread_of_its_own(AttemptController)
    told = []
    runs = controller.runs = StartsRecorded(spec, "run", None, told.append)
    runs.started = []
    runs.current = {0: GroupRun(0, {"a": 1}), 1: GroupRun(1, {"b": 1})}
    assert controller.join("pg-1", 0, 1, 11, "10.0.0.1", "a", replica=0) == 0
    assert controller.join("pg-2", 0, 1, 12, "10.0.0.2", "b", replica=1) == 1
    controller._follow([{"a": 1}, {"b": 1}])
    assert controller.stop_requested(0) is None and controller.stop_requested(1) is None and not told

    controller._follow([{"a": 1}, {}])  # judged lost: no place for a replacement yet
    assert controller.stop_requested(1) == "leave" and controller.stop_requested(0) is None
    assert runs.current[1].dismissed and not runs.started
    assert [(e.group, e.fields["state"]) for e in told] == [(1, "lost")]
    controller._follow([{"a": 1}, {}])
    assert len(told) == 1  # once

    controller._follow([{"a": 1}, {"c": 1}])  # placed again: starts there, its old run still going
    assert runs.started == [(1, {"c": 1})]
    assert controller.join("pg-3", 0, 1, 13, "10.0.0.3", "c", replica=1) == 2
    assert controller.stop_requested(2) is None and controller.stop_requested(1) == "leave"
    controller.finish({"status": "left", "replica_group": {"group": 1}}, 1)  # the dismissed group's
    assert controller.workers_summary is None and controller.group_summaries == {}
    controller.finish({"status": "succeeded", "replica_group": {"group": 1}}, 2)
    assert controller.workers_summary["status"] == "succeeded"


def test_a_dismissed_run_that_ended_by_itself_is_lost_once_and_its_end_is_a_failure():
    """A run Ray Train saw fail (its node declared dead) and then dismissed: told lost by its
    `fit()` only; a dismissed run that ended without an error (its workers left) is a failure."""
    spec = two_groups()
    told = []
    runs = StartsRecorded(spec, "run", None, told.append)
    runs.started = []
    failed = GroupRun(1, {"b": 1}, ended=True, failure={"died": [0], "text": "node died", "group": True})
    runs.current = {0: GroupRun(0, {"a": 1}), 1: failed}
    assert runs.follow([{"a": 1}, {}]) == [1] and told == []
    assert failed.failure["text"] == "node died"
    assert runs.failure() == failed.failure
