"""The service's side of the queue configuration, without Ray: the service a job received
over its attempts (what LAS orders by), what the policy is told about a job, the stored
configuration, and the CLI refusing a bad file before anything is sent or started.
The same on a live cluster: tests/test_queues_live.py."""

from types import SimpleNamespace

import pytest

from core.jobs import JobState
from core.queues import validate_queue_config
from core.spec import validate
from orchestrator.service.cycle import allocation, request
from orchestrator.service.lifecycle import Lifecycle
from orchestrator.service.store import Store
from orchestrator.service.submission import new_record
from tests.conftest import run_cli

SPEC = validate(
    {
        "name": "job",
        "model": {"family": "convnet", "preset": "tiny"},
        "data": {"source": "synthetic"},
        "train": {"steps": 100},
        "resources": {"num_workers": 2, "gpus_per_worker": 1},
        "parallel": {"strategy": "ddp"},
    }
)
CONFIG = SimpleNamespace(start_deadline_s=60.0, backoff_s=1.0, max_backoff_s=8.0, max_failed_starts=3)


@pytest.fixture
def life(tmp_path):
    return Lifecycle(Store(str(tmp_path)), runner=None, config=CONFIG, generation=1)


def test_every_attempt_end_adds_its_gpu_seconds_and_the_policy_sees_them(life):
    job = new_record(SPEC, "job-1", {"user": "ada"}, launched_by="driver")
    life.jobs[job.id] = job
    t0 = job.submitted_at
    life.admit(job, {"a": 1, "b": 1}, now=t0 + 10.0)  # 2 workers x 1 GPU
    running = allocation(job)
    assert (running.user, running.attained_s, running.started_at) == ("ada", 0.0, t0 + 10.0)
    assert running.submitted_at == t0  # las-share's victim order and top share go by it
    life.mark_running(job, attempt=1)
    life.request_stop(job, "preempt", now=t0 + 50.0)
    assert job.attained_s == 0.0  # stopping still holds its GPUs: the attempt goes on
    life.preempted(job, now=t0 + 60.0, acknowledged=True)
    assert job.attained_s == 100.0 and job.placement == {}  # 50 s x 2 GPUs, from admission
    waiting = request(job)
    assert (waiting.user, waiting.attained_s) == ("ada", 100.0)
    assert waiting.submitted_at == t0 and waiting.queued_since == t0 + 60.0  # age kept, wait anew
    life.admit(job, {"a": 1}, now=t0 + 70.0)  # an elastic restart at 1 worker, say
    life.start_timed_out(job, now=t0 + 80.0)  # requeued: 10 s x 1 GPU
    assert job.attained_s == 110.0
    life.admit(job, {"a": 1, "b": 1}, now=t0 + 90.0)
    life.finish(job, JobState.SUCCEEDED, now=t0 + 100.0)
    assert job.attained_s == 130.0 and job.placement == {}
    assert life.store.load(job.id).attained_s == 130.0  # saved with the record


def test_a_job_without_a_user_is_unknown():
    assert new_record(SPEC, "job-2", {}, launched_by="service").user == "unknown"


def test_the_store_keeps_the_configuration_until_it_is_cleared(tmp_path):
    store = Store(str(tmp_path))
    assert store.load_queues() is None
    config = validate_queue_config(
        {"cohorts": ["c"], "queues": {"a": {"cohort": "c", "nominal": {"GPU": 2}}}}
    )
    store.save_queues(config.model_dump(mode="json"))
    assert validate_queue_config(store.load_queues()) == config
    store.save_queues(None)
    store.save_queues(None)  # twice is fine
    assert store.load_queues() is None


def test_a_bad_queue_file_is_refused_before_anything_is_sent_or_started(tmp_path):
    bad = tmp_path / "queues.yaml"
    bad.write_text("queues:\n  a: {nominal: {slot: -1}}\n")
    env = {"ORCHESTRATOR_HOME": str(tmp_path / "home")}  # no cluster recorded: nothing to reach
    for args in (("queues", "apply", str(bad)), ("up", "--queues", str(bad))):
        result = run_cli(*args, env=env, timeout=60)
        assert result.returncode == 2, result.stdout + result.stderr
        expected = f"error: {bad}: queues.a.nominal.slot: -1 is out of range; allowed: >= 0"
        assert result.stderr.strip() == expected
    good = tmp_path / "good.yaml"
    good.write_text("queues:\n  a: {nominal: {slot: 1}}\n")
    result = run_cli("up", "--queues", str(good), "--quota", "a=slot:2", env=env, timeout=60)
    assert result.returncode == 2 and "queue(s) a also have a --quota" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
