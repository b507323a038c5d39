"""A job's MLflow run completed from its durable metrics log (orchestrator/monitoring/
mlflow_sync.py) against a real tracking server, without Ray: a server that died mid-run and
came back after the job ended gets every step once and the final status, from the service's
catch-up (orchestrator/service/mlflow_catchup.py, driven here by hand) and from
`orchestrator tracking sync`; a second sync sends nothing. The service doing it on a live
cluster: tests/test_mlflow_live.py."""

import json
import secrets
import threading

from mlflow import MlflowClient

from core import run_folder
from core.jobs import JobState
from core.metrics_log import MetricsWriter
from orchestrator.monitoring import mlflow_sync
from orchestrator.service import mlflow_catchup
from orchestrator.service.submission import new_record
from tests.conftest import ROOT, run_cli
from tests.mlflow_server import MlflowServer
from tests.test_mlflow_tracking import evals, spec_for, steps_of, tracker, train, wait_for
from tests.test_training import torchrun

STEPS = range(10, 601, 10)  # 600 steps, a record every 10, as the team's job


def logged(run_uri: str, steps=STEPS) -> list[dict]:
    """The metrics log the job's driver writes, by the product's own writer."""
    writer = MetricsWriter(run_uri, flush_every_s=0)
    writer.rewind([])
    history = [*train(steps), *evals([300, 600])]
    writer.append(sorted(history, key=lambda r: r["step"]))
    writer.flush()
    return history


def left_running(server, spec, run_uri: str) -> str:
    """A driver that sent steps 10-100, then lost the server and gave up at the attempt's end."""
    attempt = tracker(spec, run_uri, {"id": "digits-1127", "attempt": 1}, [])
    attempt.add(train(range(10, 101, 10)))
    client = MlflowClient(server.uri)
    wait_for("steps 10-100", lambda: attempt.run_id and len(steps_of(client, attempt.run_id, "loss")) == 10)
    # the driver's own acknowledgement too: a server stopped between storing the batch and
    # answering leaves the driver believing it unsent (the count it hands over is a guess)
    wait_for("the driver to know they arrived", lambda: attempt._marks.get("train") == 100)
    server.stop()
    attempt.add([*train(range(110, 601, 10)), *evals([300, 600])])
    assert attempt.close({"status": "succeeded", "steps": 600}, timeout=1) is False
    wait_for("the driver to hand over", lambda: not attempt._thread.is_alive(), timeout=10)  # one sender
    return attempt.run_id


def test_a_run_the_server_missed_is_completed_once_and_a_second_sync_sends_nothing(tmp_path):
    server = MlflowServer(tmp_path / "server").start()
    try:
        spec, run_uri = spec_for(server.uri, f"sync-{secrets.token_hex(3)}", tmp_path), str(tmp_path / "run")
        logged(run_uri)
        run_id = left_running(server, spec, run_uri)
        assert mlflow_sync.known_marks(run_uri) == {"train": 100}  # what the driver knew was sent
        server.start()
        client = MlflowClient(server.uri)
        assert client.get_run(run_id).info.status == "RUNNING"  # what the team saw

        summary = {"status": "succeeded", "steps": 600}
        first = mlflow_sync.sync_run(spec.tracking.mlflow, run_uri, "digits-run", summary)
        assert (len(first.sent), first.already, first.status) == (52, 10, "FINISHED")
        assert first.line() == "digits-run: sent 52 records (steps 110-600), FINISHED; 10 were already there"
        run = client.get_run(run_id)
        assert run.info.status == "FINISHED"
        assert steps_of(client, run_id, "loss") == list(STEPS)  # every step once
        assert steps_of(client, run_id, "eval_accuracy") == [300, 600]
        got = client.download_artifacts(run_id, "summary.json", str(tmp_path))
        assert json.loads(open(got).read())["steps"] == 600

        again = mlflow_sync.sync_run(spec.tracking.mlflow, run_uri, "digits-run", summary)
        assert (again.sent, again.already, again.status) == ([], 62, None)
        assert again.line() == "digits-run: sent no records; the run stays FINISHED; 62 were already there"
        assert steps_of(client, run_id, "loss") == list(STEPS)
    finally:
        server.stop()


def test_the_service_shows_what_waits_and_completes_the_run_when_the_server_returns(tmp_path):
    server = MlflowServer(tmp_path / "server").start()
    try:
        spec = spec_for(server.uri, f"catch-up-{secrets.token_hex(3)}", tmp_path)
        job = new_record(spec, "digits-1127", {"user": "ann", "team": "a"}, "service")
        run_uri = run_folder.run_uri(spec, job.run)
        logged(run_uri)
        run_id = left_running(server, spec, run_uri)
        job.state, job.finished_at, job.summary = JobState.FAILED, 1.8e9, {"status": "failed", "steps": 600}
        catch_up = mlflow_catchup.MlflowCatchUp({job.id: job}, threading.RLock(), threading.Event())

        now = 1.8e9 + mlflow_catchup.AFTER_END_S
        catch_up.catch_up(now)  # the server is still down
        assert catch_up.records_waiting() == {job.id: 52}
        assert catch_up.note(job.id).startswith("MLflow: 52 records waiting since ")
        assert catch_up.note(job.id).endswith(" (server unreachable)")
        catch_up.catch_up(now + 1)  # not its turn yet: no new try
        assert catch_up.waiting[job.id].tries == 1

        server.start()
        catch_up.catch_up(now + max(mlflow_catchup.PAUSES_S))
        assert catch_up.records_waiting() == {} and catch_up.note(job.id) is None
        client = MlflowClient(server.uri)
        run = client.get_run(run_id)
        assert run.info.status == "FAILED"  # the job's own verdict
        assert run.data.tags["orchestrator.job_id"] == job.id and run.data.tags["orchestrator.user"] == "ann"
        assert steps_of(client, run_id, "loss") == list(STEPS)
        catch_up.catch_up(now + 1000)  # complete: not asked again
        assert steps_of(client, run_id, "loss") == list(STEPS)
    finally:
        server.stop()


def test_a_torchrun_job_is_synced_by_the_command_and_a_second_sync_sends_nothing(tmp_path, mlflow_server):
    experiment = f"torchrun-{secrets.token_hex(3)}"
    sets = [
        f"tracking.mlflow.uri={mlflow_server.uri}",
        f"tracking.mlflow.experiment={experiment}",
        f"checkpoint.storage={tmp_path}",
        *("train.steps=20", "metrics.log_every=5", "train.eval_every=10", "checkpoint.every_steps=10"),
        *("parallel.strategy=none", "resources.num_workers=1"),
    ]
    spec, summary = ROOT / "jobs/convnet.yaml", tmp_path / "summary.json"
    ran = torchrun(1, spec, *[f"--set={s}" for s in sets], f"--summary={summary}")
    assert ran.returncode == 0, ran.stderr[-2000:]
    client = MlflowClient(mlflow_server.uri)
    assert client.get_experiment_by_name(experiment) is None  # torchrun sends nothing itself

    command = ["tracking", "sync", str(spec), *[f"--set={s}" for s in sets], f"--summary={summary}"]
    first = run_cli(*command)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == (
        "convnet-digits: sent 6 records (steps 5-20), FINISHED; 0 were already there"
    )
    [run] = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "convnet-digits"
    assert steps_of(client, run.info.run_id, "loss") == [5, 10, 15, 20]
    assert steps_of(client, run.info.run_id, "eval_accuracy") == [10, 20]
    assert run.data.params["train.steps"] == "20"

    second = run_cli(*command)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == (
        "convnet-digits: sent no records; the run stays FINISHED; 6 were already there"
    )


def test_sync_refuses_a_spec_without_tracking_or_a_run_folder_in_one_line(tmp_path):
    spec = ROOT / "jobs/convnet.yaml"
    untracked = run_cli("tracking", "sync", str(spec))
    assert untracked.returncode == 2 and "Traceback" not in untracked.stderr
    assert untracked.stderr.strip() == (
        f"error: {spec}: no tracking.mlflow in the spec; add it or --set tracking.mlflow.uri=URL"
    )
    tracked = [
        "--set=tracking.mlflow.uri=http://127.0.0.1:5000",
        "--set=tracking.mlflow.experiment=x",
        f"--set=checkpoint.storage={tmp_path}",
    ]
    nothing = run_cli("tracking", "sync", str(spec), *tracked)
    assert nothing.returncode == 2 and "Traceback" not in nothing.stderr
    assert nothing.stderr.strip() == (
        f"error: convnet-digits: nothing logged in {tmp_path}/convnet-digits (another run folder: --run NAME)"
    )


def test_the_records_waiting_per_job_are_a_prometheus_gauge():
    from orchestrator.monitoring.exporter import ServiceCollector, exposition

    class Snapshot:
        def exporter_snapshot(self):
            return {"jobs": [], "nodes": [], "mlflow_waiting": {"digits-1127": 50}}

    text = exposition(ServiceCollector(Snapshot())).decode()
    assert 'orchestrator_job_mlflow_records_waiting{job="digits-1127"} 50.0' in text
