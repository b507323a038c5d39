"""MLflow tracking of a job on the live cluster (tests/conftest.py's service and a real
`mlflow server`): the server is killed while the job trains, the job trains on, is preempted
and resumed by the service, and the server comes back. The job is one MLflow run whose curve
has every step of the job's metrics log once, with its tags and final status; the job's log
says the server was unreachable. (A sweep's trials as runs under one parent, live:
tests/test_service.py's sweep test.)"""

import json
import re
import secrets
import time
import urllib.request

import pytest
from mlflow import MlflowClient

from tests.mlflow_server import MlflowServer
from tests.test_service import train_steps


def loss_steps(client, run_id: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, "loss"))


def runs_of(client, experiment: str) -> list:
    found = client.get_experiment_by_name(experiment)
    return client.search_runs([found.experiment_id]) if found else []


@pytest.mark.timeout(600)
def test_a_job_is_one_run_across_a_preemption_and_a_tracking_server_that_died(service, mlflow_server):
    experiment, client = f"live-{secrets.token_hex(3)}", MlflowClient(mlflow_server.uri)
    name = service.paced("tracked")  # training, at the test's pace, until released
    tracking = [f"tracking.mlflow.uri={mlflow_server.uri}", f"tracking.mlflow.experiment={experiment}"]
    job = service.submit(*tracking, "checkpoint.every_steps=50", name=name, steps=300, workers=1)
    service.wait(job, lambda j: j["state"] == "running" and j["step"] >= 20, what="progress")
    deadline = time.time() + 60
    while not ((runs := runs_of(client, experiment)) and loss_steps(client, runs[0].info.run_id)):
        assert time.time() < deadline, "no curve in MLflow"
        time.sleep(0.5)

    mlflow_server.stop()  # it dies mid-run
    try:
        at = service.wait(job, lambda j: j["step"] >= 20, what="a step")["step"]
        service.wait(job, lambda j: j["step"] >= at + 20, what="training on without MLflow")
        assert service.cli("preempt", job).returncode == 0
        service.wait(job, lambda j: j["attempt"] == 2 and j["state"] == "running", what="the next attempt")
    finally:
        mlflow_server.start()  # back, on the same port with the same database
    service.release(name)
    done = service.done(job)
    assert done["preemptions"] == 1 and done["steps_lost"] == 0

    [run] = runs_of(client, experiment)  # one run for both attempts
    deadline = time.time() + 60  # the second attempt's driver waits up to 15 s for the server
    while client.get_run(run.info.run_id).info.status != "FINISHED":
        assert time.time() < deadline, client.get_run(run.info.run_id).info.status
        time.sleep(0.5)
    logged = train_steps(f"{service.runs}/{name}")
    assert logged == list(range(5, 301, 5))
    assert loss_steps(client, run.info.run_id) == logged  # every step of the metrics log, once
    tags = client.get_run(run.info.run_id).data.tags
    assert (tags["orchestrator.job_id"], tags["orchestrator.attempt"]) == (job, "2")
    assert tags["orchestrator.checkpoint"].endswith("checkpoint_00000300")
    assert "MLflow: cannot send to" in service.cli("logs", job).stdout


@pytest.mark.timeout(600)
def test_a_run_whose_server_was_down_from_mid_run_to_after_the_end_is_completed_by_the_service(
    service, tmp_path
):
    """The team's case: the server dies mid-run and is back only after the job succeeded; the
    driver gives up at the attempt's end, and the service completes the run from the metrics log
    within a minute of the server's return, saying meanwhile what waits."""
    server = MlflowServer(tmp_path / "mlflow").start()  # its own: this one stays down a while
    try:
        experiment, client = f"down-{secrets.token_hex(3)}", MlflowClient(server.uri)
        name = service.paced("tracked-down")
        tracking = [f"tracking.mlflow.uri={server.uri}", f"tracking.mlflow.experiment={experiment}"]
        job = service.submit(*tracking, name=name, steps=200, workers=1)
        service.wait(job, lambda j: j["state"] == "running" and j["step"] >= 20, what="progress")
        deadline = time.time() + 60
        while not ((runs := runs_of(client, experiment)) and loss_steps(client, runs[0].info.run_id)):
            assert time.time() < deadline, "no curve in MLflow"
            time.sleep(0.5)
        run = runs[0].info.run_id

        server.stop()  # it dies mid-run, and stays down past the job's end
        at = service.wait(job, lambda j: j["step"] >= 20, what="a step")["step"]
        service.wait(job, lambda j: j["step"] >= at + 20, what="training on without MLflow")
        service.release(name)
        service.done(job)
        deadline = time.time() + 120  # the service's first try comes ~30 s after the end
        while "records waiting since" not in (shown := service.cli("status", job).stdout):
            assert time.time() < deadline, shown
            time.sleep(2)
        assert re.search(
            r"tracking: +MLflow: \d+ records waiting since \d\d:\d\d \(server unreachable\)", shown
        )
        page = json.loads((service.home / "cluster.json").read_text())["status_page"]
        with urllib.request.urlopen(f"{page.rstrip('/')}/metrics", timeout=10) as reply:
            scraped = reply.read().decode()
        assert re.search(rf'orchestrator_job_mlflow_records_waiting{{job="{job}"}} [1-9]', scraped)

        server.start()  # back, on the same port with the same database
        deadline = time.time() + 60  # the "within a minute of its return"
        while client.get_run(run).info.status != "FINISHED":
            assert time.time() < deadline, client.get_run(run).info.status
            time.sleep(1)
        logged = train_steps(f"{service.runs}/{name}")
        assert logged == list(range(5, 201, 5))
        assert loss_steps(client, run) == logged  # every step of the metrics log, once
        assert "records waiting" not in service.cli("status", job).stdout
        assert [r.info.run_id for r in runs_of(client, experiment)] == [run]
    finally:
        server.stop()
