"""Knowing a node is dead without waiting for Ray's verdict: the service's own probes, the
cluster's health-check settings, failures the cluster (not the job) caused, and storage that
only one node would see. No Ray cluster here: the live tests are in tests/test_cluster.py."""

import socket
import threading
from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from core.spec import validate
from orchestrator.attempt.policy import collective_failure
from orchestrator.policy.node_watch import MISSES, NodeWatch
from orchestrator.ray.node_health import HealthChecks, probe
from orchestrator.service.lifecycle import Lifecycle
from orchestrator.service.store import Store
from orchestrator.service.submission import new_record, storage_refusal

# --- the probe ------------------------------------------------------------------------------


def test_a_probe_is_answered_where_something_listens_and_refused_where_nothing_does():
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert probe("127.0.0.1", port) is None
    assert probe("127.0.0.1", port) == "refused"  # closed now: nothing listens there


def test_a_probe_of_an_address_that_never_answers_gives_up_after_its_timeout():
    # a TEST-NET-1 address (RFC 5737): routed nowhere, so the connection is never answered
    why = probe("192.0.2.254", 9, timeout=0.3)
    assert why is not None and why != "refused"


# --- the bookkeeping: which nodes are usable ------------------------------------------------


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class Pool:
    """Runs each probe at once, on the caller's thread: the watch's order without threads."""

    def submit(self, fn, *args):
        future = Future()
        future.set_result(fn(*args))
        return future


def watch_with(answers: dict[str, str | None]) -> tuple[NodeWatch, Clock]:
    clock = Clock()
    ports = {port: node for node, port in zip(answers, range(1, len(answers) + 1))}
    watch = NodeWatch(lambda address, port: answers[ports[port]], every_s=2.0, clock=clock, pool=Pool())
    return watch, clock


def nodes(names) -> dict[str, tuple[str, int]]:
    return {name: ("127.0.0.1", port) for name, port in zip(names, range(1, len(names) + 1))}


def test_a_refused_probe_makes_a_node_unreachable_at_once():
    answers = {"a": None, "b": None}
    watch, clock = watch_with(answers)
    assert watch.update(nodes(answers)) == []  # probes started
    assert watch.update(nodes(answers)) == [] and watch.unusable() == set()
    answers["b"] = "refused"  # its raylet is gone
    clock.now += 2.0
    watch.update(nodes(answers))  # started the probe
    assert watch.update(nodes(answers)) == ["b"]  # read its answer
    assert watch.unreachable() == {"b": "refused"} and watch.unusable() == {"b"}
    answers["b"] = None  # it answers again (a raylet restarted behind the same port)
    clock.now += 2.0
    watch.update(nodes(answers))
    watch.update(nodes(answers))
    assert watch.unusable() == set()


def test_a_node_that_does_not_answer_is_unreachable_only_after_missing_twice():
    answers = {"a": "no answer in 2 s"}
    watch, clock = watch_with(answers)
    watch.update(nodes(answers))
    watch.update(nodes(answers))
    assert watch.unreachable() == {}  # one miss: the network may have dropped one packet
    for _ in range(MISSES - 1):
        clock.now += 2.0
        watch.update(nodes(answers))
        watch.update(nodes(answers))
    assert watch.unreachable() == {"a": "no answer in 2 s"}


def test_nodes_in_doubt_are_unusable_until_a_probe_sent_after_the_failure_is_answered():
    answers = {"a": None, "b": None}
    watch, clock = watch_with(answers)
    watch.update(nodes(answers))
    watch.update(nodes(answers))
    failed_at = clock.now + 0.5
    clock.now += 0.5
    watch.doubt(["a", "b"], failed_at)
    assert watch.unusable() == {"a", "b"}
    assert not watch.cleared("a", failed_at)  # the probe that was answered went out before
    watch.update(nodes(answers))  # a doubted node is probed at once, not after every_s
    watch.update(nodes(answers))
    assert watch.cleared("a", failed_at) and watch.cleared("b", failed_at)
    assert watch.unusable() == set()


def test_a_node_ray_no_longer_lists_is_forgotten():
    answers = {"a": "refused", "b": None}
    watch, _ = watch_with(answers)
    watch.update(nodes(answers))
    watch.update(nodes(answers))
    assert watch.unusable() == {"a"}
    watch.update(nodes({"b": None}))  # Ray declared it dead: its table is the truth now
    assert watch.unusable() == set() and watch.unreachable() == {}


def test_probes_run_beside_the_caller_and_a_slow_one_does_not_hold_up_the_others():
    release = threading.Event()

    def slow_for_a(address, port):
        if port == 1:
            release.wait(5)
        return None

    watch = NodeWatch(slow_for_a, every_s=0.0)
    try:
        watch.update(nodes(["a", "b"]))
        for _ in range(100):
            watch.update(nodes(["a", "b"]))
            if watch.cleared("b", 0.0):
                break
            threading.Event().wait(0.01)
        assert watch.cleared("b", 0.0) and not watch.cleared("a", 0.0)
    finally:
        release.set()
        watch.pool.shutdown(wait=True)


# --- the cluster's health checks -------------------------------------------------------------


def test_the_wait_follows_the_clusters_settings():
    assert HealthChecks().declare_dead_s == 5 * (3 + 10)  # Ray 2.60's defaults
    quick = HealthChecks.from_values({"period_ms": 1000, "failure_threshold": 3, "timeout_ms": 500}, "test")
    assert quick.declare_dead_s == 4.5
    assert "3 missed health checks 1 s apart" in quick.describe()


def test_with_no_gcs_here_the_settings_are_those_this_process_was_started_with():
    checks = HealthChecks.of_cluster("127.0.0.1:1")  # no gcs_server serves port 1 here
    assert checks.source == "this head's settings"
    assert (checks.period_s, checks.timeout_s, checks.threshold) == (3.0, 10.0, 5)


# --- failures of the cluster, not of the job --------------------------------------------------


@pytest.mark.parametrize(
    "failure, error, infrastructure",
    [
        ({"died": [1], "text": "x"}, None, True),  # a rank's actor gone
        (None, {"reason": "[gloo/transport/tcp/pair.cc:534] Connection reset by peer [10.0.0.2]:4567"}, True),
        (None, {"reason": "NCCL communicator was aborted on rank 3"}, True),
        ({"died": [], "text": "ActorDiedError: The actor died unexpectedly"}, None, True),
        (None, {"reason": "CUDA out of memory. Tried to allocate 2.00 GiB"}, False),
        (None, {"reason": "ValueError: the loss is not finite at step 40"}, False),
        (None, None, False),
    ],
)
def test_a_collective_failure_is_told_from_the_jobs_own(failure, error, infrastructure):
    assert collective_failure(failure, error) is infrastructure


SPEC = validate(
    {
        "name": "job",
        "model": {"family": "convnet", "preset": "tiny"},
        "data": {"source": "synthetic"},
        "train": {"steps": 100},
        "fault_tolerance": {"max_infrastructure_failures": 1},
    }
)
CONFIG = SimpleNamespace(start_deadline_s=60.0, backoff_s=1.0, max_backoff_s=8.0, max_failed_starts=3)


def test_collective_failures_requeue_from_the_checkpoint_until_their_own_budget_is_spent(tmp_path):
    life = Lifecycle(Store(str(tmp_path)), runner=None, config=CONFIG, generation=1)
    job = new_record(SPEC, "job-1", {}, launched_by="driver")
    life.jobs[job.id] = job
    reason = "rank 1: Connection reset by peer"
    for attempt, now in ((1, 10.0), (2, 20.0)):
        life.admit(job, {"node-a": 1}, now=now)
        life.mark_running(job, attempt=attempt)
        summary = {"steps": 40 * attempt, "checkpoint": f"/r/checkpoint_{30 * attempt:08d}", "reason": reason}
        life.attempt_ended(job, "failed", {**summary, "retryable": True, "infrastructure": True}, {}, now + 5)
        assert job.unconfirmed_failure is not None  # held until its nodes answered a probe
        life.infrastructure_failure(job, now + 6)
    # the first: back to its place in the queue, the steps since its checkpoint counted as lost
    first = next(e for e in job.history if e["event"] == "infrastructure-failure")
    assert (first["count"], first["steps_lost"], first["step"]) == ("1 of 1", 10, 40)
    # the second spends the budget: failed, naming it, with its last good checkpoint kept
    assert job.state.value == "failed" and job.infrastructure_failures == 2
    assert "fault_tolerance.max_infrastructure_failures: 1" in job.reason and reason in job.reason
    assert job.last_checkpoint == "/r/checkpoint_00000060"
    assert Store(str(tmp_path)).load(job.id).state.value == "failed"  # written through


# --- storage every node sees ------------------------------------------------------------------


def spec_with_storage(path: str):
    return validate(
        {
            "name": "job",
            "model": {"family": "convnet", "preset": "tiny"},
            "data": {"source": "synthetic"},
            "train": {"steps": 10},
            "checkpoint": {"storage": path},
        }
    )


def test_a_local_path_is_refused_on_a_cluster_of_many_nodes_unless_declared_shared():
    local = spec_with_storage("/data/runs")
    refusal = storage_refusal(local, [], nodes=3)
    assert refusal.startswith("checkpoint.storage: '/data/runs' is a local path")
    assert "3 nodes" in refusal and "--shared-storage" in refusal and "\n" not in refusal
    assert storage_refusal(local, [], nodes=1) is None  # one machine, one disk
    assert storage_refusal(local, ["/data"], nodes=3) is None  # an NFS mount on every node
    assert storage_refusal(spec_with_storage("/data-other/runs"), ["/data"], nodes=3) is not None
    assert storage_refusal(spec_with_storage("file:///data/runs"), ["/data"], nodes=3) is None
    assert storage_refusal(spec_with_storage("s3://bucket/runs"), [], nodes=3) is None
