"""The orchestrator service on a real Ray cluster, when something dies or comes in another way:
`ray job submit` of a spec and `orchestrator run` through the queue, the service actor killed, a job's attempt
controller killed, a rank killed with every node answering. The cluster is the session's
(tests/conftest.py's `service`: a head and two nodes of one `slot` each).
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.testing.local_cluster import list_actors
from tests.conftest import ROOT
from tests.service_helpers import events, ledger_of, lifecycle, train_steps, when

SPEC = "jobs/convnet.yaml"  # 2 workers, DDP, digits


@pytest.mark.timeout(600)
def test_ray_job_submit_goes_through_the_queue(service):
    submission = f"plain-ray-{os.getpid()}"
    command = [
        str(Path(sys.executable).parent / "ray"),
        "job",
        "submit",
        "--address",
        service.head.dashboard,
        "--submission-id",
        submission,
        "--working-dir",
        ".",
        "--",
        f"./{SPEC}",
        "--set",
        "train.steps=10",
        "--set",
        "resources.custom_per_worker.slot=1",
        "--set",
        f"checkpoint.storage={service.runs}",
        "--set",
        "name=via-ray",
        "--set",
        "resources.num_workers=1",  # the way in is the test, not the gang
    ]
    result = subprocess.run(
        command, cwd=ROOT, env={**os.environ, **service.env}, capture_output=True, text=True, timeout=400
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "queued as via-ray-" in result.stdout and "succeeded: 10 steps" in result.stdout
    job_id = result.stdout.split("queued as ")[1].split()[0]
    job = service.job(job_id)
    # the Ray Job's driver queued it through the one way in; the service ran its attempt
    assert job["state"] == "succeeded" and job["came_in_by"] == submission
    assert job["launched_by"] == "service" and job["submission_id"] == f"{job_id}-a1"
    # the queue's id finds the logs of the Ray Job it came in by
    logs = service.cli("logs", job_id)
    assert logs.returncode == 0 and f"==> {submission} (the driver it came in by" in logs.stdout, logs.stderr
    assert f"queued as {job_id}" in logs.stdout
    assert f"Ray Job:    {submission} (it came in by)\n" in service.cli("status", job_id).stdout
    # the id `ray job submit` printed names the same job: one job, whichever id is at hand
    by_ray_id = service.cli("status", submission)
    assert by_ray_id.returncode == 0 and by_ray_id.stdout.startswith(f"{job_id}: succeeded\n"), by_ray_id


def run_args(service, *sets: str) -> list[str]:
    args = ["run", SPEC, "--address", service.head.address, "--set", "resources.custom_per_worker.slot=1"]
    sets = ("resources.num_workers=1", *sets)  # the way in is the test, not the gang
    return args + [arg for s in sets for arg in ("--set", s)]


@pytest.mark.timeout(600)
def test_orchestrator_run_on_a_cluster_with_a_service_queues_through_it_and_follows_its_job(
    service, tmp_path
):
    # the same checks as `submit`: a disk of one node's own is refused for a cluster of three
    refused = service.cli(*run_args(service, "checkpoint.storage=./runs", "name=via-run-local"))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert "is a local path, and each of this cluster's 3 nodes has a disk of its own" in refused.stderr
    summary = tmp_path / "summary.json"
    sets = ("train.steps=10", f"checkpoint.storage={service.runs}", "name=via-run")
    done = service.cli(*run_args(service, *sets), "--summary", str(summary))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    job_id = done.stdout.split("queued as ")[1].split()[0]
    job = service.job(job_id)
    assert (
        job["state"] == "succeeded" and job["came_in_by"] is None and job["submission_id"] == f"{job_id}-a1"
    )
    assert json.loads(summary.read_text())["steps"] == 10
    assert (service.runs / "via-run" / "checkpoint_00000010").is_dir()

    # a SIGTERM (`ray job stop` sends one) asks the service to checkpoint and stop the job
    name = service.paced("via-run-stopped")
    sets = (
        "train.steps=600",
        "checkpoint.every_steps=1000",
        f"checkpoint.storage={service.runs}",
        f"name={name}",
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), **service.env}
    driver = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", *run_args(service, *sets)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = driver.stdout.readline()
    while "queued as" not in line:
        assert line, driver.stderr.read()[-2000:]
        line = driver.stdout.readline()
    job_id = line.split("queued as ")[1].split()[0]
    service.wait(job_id, lambda j: j["state"] == "running" and j["step"] >= 5, what="progress")
    driver.send_signal(signal.SIGTERM)
    out, err = driver.communicate(timeout=120)
    assert driver.returncode == 128 + signal.SIGTERM and "stopped (SIGTERM)" in err, out[-2000:] + err[-2000:]
    service.release(name)
    job = service.wait(job_id, lambda j: j["state"] == "stopped", what="stopped")
    assert job["last_checkpoint"] and job["reason"].startswith("stopped at step"), job  # checkpointed first


def _kill_service_actor(service) -> None:
    code = (
        f"import ray; ray.init(address='{service.head.address}'); "
        "ray.kill(ray.get_actor('orchestrator', namespace='orchestrator'), no_restart=False)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **service.env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.timeout(600)
def test_the_queue_survives_the_service_actor_dying(service):
    lease = service.store / "service.json"
    generation = json.loads(lease.read_text())["generation"]
    name = service.paced("through-restart")  # still training when the service is back
    job_id = service.submit(name=name, steps=600, workers=1)
    service.wait(job_id, lambda j: j["state"] == "running" and j["step"] >= 50, what="progress")
    _kill_service_actor(service)  # Ray restarts it; it reloads the queue from its store
    deadline = time.time() + 120
    while json.loads(lease.read_text())["generation"] == generation and time.time() < deadline:
        time.sleep(0.5)
    assert json.loads(lease.read_text())["generation"] == generation + 1, "the service did not come back"
    assert service.job(job_id)["state"] == "running"
    service.release(name)
    job = service.done(job_id)
    assert job["attempt"] == 1 and job["step"] == 600  # the driver ran on through it
    assert lifecycle(job) == ["queued", "admitted", "running", "succeeded"]


@pytest.mark.timeout(600)
def test_a_job_whose_attempt_controller_dies_resumes_from_its_newest_complete_checkpoint(service):
    name = service.paced("survivor")  # still training when its attempt's controller dies
    job_id = service.submit("checkpoint.every_steps=50", name=name, steps=600, workers=1)
    # `orchestrator logs --follow` with the id submit printed follows the job across its attempts
    follower = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "logs", "--follow", job_id],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **service.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    job = service.wait(job_id, lambda j: j["state"] == "running" and j["step"] >= 75, what="progress")
    (controller,) = [
        a
        for a in list_actors(service.head.dashboard, service.head.env, "AttemptController")
        if a["name"] == job["submission_id"] and a["state"] == "ALIVE"
    ]
    os.kill(controller["pid"], signal.SIGKILL)  # the attempt's controller crashes
    service.release(name)
    job = service.done(job_id, timeout=400)
    assert "driver-exited" in events(job) and job["attempt"] == 2
    assert job["step"] == 600
    # the second attempt resumed from its newest complete checkpoint, not from scratch
    resumed = job["summary"]["resumed_from_step"]
    assert resumed >= 50 and resumed % 50 == 0
    assert job["summary"]["resumed_from"]["checkpoint"].endswith(f"checkpoint_{resumed:08d}")
    steps = train_steps(service.runs / "survivor")
    assert steps == list(range(5, 601, 5))  # each step once
    # the steps trained past the checkpoint it resumed from, and the restart, are lost time
    assert ledger_of(job)["lost"] > 0, job["ledger"]
    out, err = follower.communicate(timeout=120)
    assert follower.returncode == 0, out[-2000:] + err[-2000:]
    assert f"job {job_id} succeeded" in err
    headers = [line for line in out.splitlines() if line.startswith("==> ")]
    assert [h.split()[1] for h in headers] == [f"{job_id}-a1", f"{job_id}-a2"], headers
    assert f"resuming at step {resumed}" in out.split(headers[1])[1]  # the second driver's own log
    printed = service.cli("logs", job_id).stdout  # and without --follow: both, oldest first
    assert printed.index(f"==> {job_id}-a1") < printed.index(f"==> {job_id}-a2")


@pytest.mark.timeout(600)
def test_a_rank_killed_with_every_node_answering_is_requeued_without_spending_max_failures(service):
    """A rank gone (its process killed: the OOM killer, a crashed driver) breaks the job's
    collectives although no node died: the service requeues it from its newest complete
    checkpoint, counted against fault_tolerance.max_infrastructure_failures, not max_failures
    (0 here, so Ray Train itself gives up at once)."""
    name = service.paced("worker-kill")  # still training when its rank is killed
    job_id = service.submit("checkpoint.every_steps=50", name=name, steps=600)
    service.wait(job_id, lambda j: j["state"] == "running" and j["step"] >= 75, what="progress")
    deadline, victim = time.time() + 60, None
    while victim is None and time.time() < deadline:  # the driver names its workers in its log
        found = re.search(
            r"workers: rank 0 pid \d+ on \S+, rank 1 pid (\d+)", service.cli("logs", job_id).stdout
        )
        victim = int(found.group(1)) if found else time.sleep(1)
    assert victim is not None and b"ray::" in Path(f"/proc/{victim}/cmdline").read_bytes()
    killed_at = time.time()
    os.kill(victim, signal.SIGKILL)
    service.release(name)
    job = service.done(job_id, timeout=400)
    failure = next(e for e in job["history"] if e["event"] == "infrastructure-failure")
    assert failure["count"] == "1 of 5" and "rank 1" in failure["reason"], failure
    assert job["attempt"] == 2 and job["infrastructure_failures"] == 1 and "node-lost" not in events(job)
    assert job["summary"]["restarts"] == 0  # Ray Train never restarted it: max_failures unspent
    assert job["summary"]["resumed_from_step"] == failure["step"] - failure["steps_lost"]
    assert 0 <= failure["steps_lost"] <= 50  # at most the checkpoint interval
    assert train_steps(service.runs / "worker-kill") == list(range(5, 601, 5))  # each step once
    spent = ledger_of(job)
    assert spent["lost"] > 0 and spent["training"] > 0  # the steps past the checkpoint, and the restart
    print(f"rank killed: requeued {when(job, 'infrastructure-failure') - killed_at:.1f} s after the kill")
