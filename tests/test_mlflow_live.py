"""MLflow tracking of a job on the live cluster (tests/conftest.py's service and a real
`mlflow server`): the server is killed while the job trains, the job trains on, is preempted
and resumed by the service, and the server comes back. The job is one MLflow run whose curve
has every step of the job's metrics log once, with its tags and final status; the job's log
says the server was unreachable. (A sweep's trials as runs under one parent, live:
tests/test_service.py's sweep test.)"""

import secrets
import time

import pytest
from mlflow import MlflowClient

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
    job = service.submit(*tracking, "checkpoint.every_steps=50", name=name, steps=300)
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
