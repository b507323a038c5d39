"""A job's MLflow run (orchestrator/monitoring/mlflow_tracking.py) against a real tracking
server (`mlflow server`, SQLite), driven as a driver drives it, without Ray: one run per job
across attempts with each step once, a sweep's trials under one parent, a server that dies
mid-run (nothing waits on it; the records arrive when it is back), and bad settings refused in
one line. The same on a live cluster: tests/test_mlflow_live.py."""

import json
import secrets
import time

import pytest
from mlflow import MlflowClient

from core.spec import load_spec
from orchestrator.monitoring import mlflow_tracking
from tests.conftest import run_cli
from tests.dist_suite import VIT_JOB
from tests.mlflow_server import MlflowServer


def spec_for(uri: str, experiment: str, storage):
    sets = [f"tracking.mlflow.uri={uri}", f"tracking.mlflow.experiment={experiment}"]
    return load_spec(VIT_JOB, [*sets, f"checkpoint.storage={storage}"])


def train(steps, at: float = 1.8e9) -> list[dict]:
    return [
        {"step": s, "time": at + s, "loss": 1.0 / s, "lr": 0.01, "samples_per_s": 100.0 + s} for s in steps
    ]


def evals(steps) -> list[dict]:
    return [{"step": s, "time": 1.8e9 + s, "eval_loss": 2.0 / s, "eval_accuracy": s / 100} for s in steps]


def tracker(spec, run_uri, job: dict, lines: list):
    return mlflow_tracking.for_attempt(spec, run_uri, "digits-run", job, lines.append)


def steps_of(client, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def wait_for(what, predicate, timeout: float = 60):
    deadline = time.time() + timeout
    while not (found := predicate()):
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)
    return found


def test_a_jobs_attempts_are_one_run_with_each_step_once(tmp_path, mlflow_server):
    experiment = f"attempts-{secrets.token_hex(3)}"
    spec, run_uri, lines = spec_for(mlflow_server.uri, experiment, tmp_path), str(tmp_path / "run"), []
    job = {"id": "digits-1127", "queue": "lab", "user": "ann", "team": "a", "attempt": 1}

    first = tracker(spec, run_uri, job, lines)
    first.add([*train(range(1, 11)), *evals([5, 10])])
    first.checkpoint(f"{run_uri}/checkpoint_00000006")
    first.close({"status": "preempted", "steps": 10})
    # the next attempt resumes from step 6: its history first (steps 1-6), then steps 7-15 again
    second = tracker(spec, run_uri, {**job, "attempt": 2}, lines)
    second.add([*train(range(1, 7)), *evals([5])])
    second.add([*train(range(7, 16), at=1.9e9), *evals([10, 15])])
    second.close({"status": "succeeded", "steps": 15, "checkpoint": f"{run_uri}/checkpoint_00000015"})

    client = MlflowClient(mlflow_server.uri)
    [run] = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert run.info.run_id == first.run_id == second.run_id
    assert json.loads((tmp_path / "run" / "mlflow.json").read_text())["run_id"] == run.info.run_id
    assert run.info.status == "FINISHED" and run.info.run_name == "digits-run"
    assert steps_of(client, run.info.run_id, "loss") == list(range(1, 16))  # each step once
    assert steps_of(client, run.info.run_id, "eval_accuracy") == [5, 10, 15]
    redone = {m.step: m.timestamp for m in client.get_metric_history(run.info.run_id, "loss")}
    assert redone[10] == int((1.8e9 + 10) * 1000) and redone[11] == int((1.9e9 + 11) * 1000)
    tags, params = run.data.tags, run.data.params
    assert {k: tags[k] for k in ("orchestrator.job_id", "orchestrator.queue", "orchestrator.user")} == {
        "orchestrator.job_id": "digits-1127",
        "orchestrator.queue": "lab",
        "orchestrator.user": "ann",
    }
    assert tags["orchestrator.attempt"] == "2" and tags["orchestrator.checkpoint"].endswith(
        "checkpoint_00000006"
    )
    assert params["model.family"] == spec.model.family and params["train.steps"] == str(spec.train.steps)
    assert not any(k.startswith(("tracking.", "sweep")) for k in params)
    summary = client.download_artifacts(run.info.run_id, "summary.json", str(tmp_path))
    assert json.loads(open(summary).read())["steps"] == 15
    assert lines == []  # nothing went wrong, nothing said


def test_a_server_that_dies_holds_nothing_up_and_gets_the_records_after_it_returns(tmp_path):
    server = MlflowServer(tmp_path / "server").start()
    try:
        spec, run_uri, lines = spec_for(server.uri, "dies", tmp_path), str(tmp_path / "run"), []
        attempt = tracker(spec, run_uri, {}, lines)
        attempt.add(train(range(1, 6)))
        client = MlflowClient(server.uri)
        wait_for("steps 1-5", lambda: attempt.run_id and len(steps_of(client, attempt.run_id, "loss")) == 5)
        server.stop()
        for step in range(6, 11):  # the driver's poll goes on as before
            attempt.add(train([step]))
        attempt.checkpoint(f"{run_uri}/checkpoint_00000010")
        # handing over does not fail: a send to the dead server would be refused (an error
        # here); the records only join a list, and the sending thread says why they wait
        wait_for("the warning", lambda: any("cannot send" in line for line in lines))
        assert [line for line in lines if "cannot send" in line][0].startswith(
            f"MLflow: cannot send to {server.uri}"
        )
        server.start()
        wait_for("steps 6-10", lambda: len(steps_of(client, attempt.run_id, "loss")) == 10, timeout=90)
        attempt.close({"status": "succeeded", "steps": 10})
        run = client.get_run(attempt.run_id)
        assert run.info.status == "FINISHED" and run.data.tags["orchestrator.checkpoint"].endswith("0010")
        assert steps_of(client, attempt.run_id, "loss") == list(range(1, 11))
        assert (
            sum("answers again" in line for line in lines) == 1
            and sum("cannot send" in line for line in lines) == 1
        )
    finally:
        server.stop()


def test_the_end_waits_a_bounded_time_for_a_server_that_never_answers(tmp_path):
    from orchestrator.testing.local_cluster import free_ports

    spec, lines = spec_for(f"http://127.0.0.1:{free_ports(1)[0]}", "never", tmp_path), []
    attempt = tracker(spec, str(tmp_path / "run"), {}, lines)
    attempt.add(train(range(1, 4)))
    # it gives up after its timeout (a wait with none would end only at the suite's timeout)
    assert attempt.close({"status": "succeeded", "steps": 3}, timeout=2) is False
    assert lines[-1].startswith("MLflow: ") and "did not take the run's last 3 record(s) in 2 s" in lines[-1]


def test_a_sweeps_trials_are_runs_of_their_own_under_one_parent(tmp_path, mlflow_server):
    experiment, sweep = f"sweep-{secrets.token_hex(3)}", "lr-sweep-1127"
    trials = [
        tracker(
            spec_for(mlflow_server.uri, experiment, tmp_path),
            str(tmp_path / f"trial-{i}"),
            {"sweep": sweep},
            [],
        )
        for i in range(3)
    ]  # their threads open their runs together
    for i, trial in enumerate(trials):
        trial.add(train(range(1, 3 + i)))
        trial.close({"status": "succeeded", "steps": 2 + i})
    client = MlflowClient(mlflow_server.uri)
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    [parent] = [r for r in runs if r.data.tags.get(mlflow_tracking.PARENT) == sweep]
    children = [r for r in runs if r is not parent]
    assert sorted(r.info.run_id for r in children) == sorted(t.run_id for t in trials)
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parent.info.run_id}
    assert {r.data.tags["orchestrator.sweep"] for r in children} == {sweep}


@pytest.mark.parametrize(
    "setting, message",
    [
        (
            "tracking.mlflow.uri=localhost:5000",
            "tracking.mlflow.uri: 'localhost:5000' is not a tracking server's address; expected"
            " http://HOST:PORT or https://...",
        ),
        (
            "tracking.mlflow.experimnt=x",
            "tracking.mlflow.experimnt: unknown field; did you mean 'experiment'?",
        ),
    ],
)
def test_bad_tracking_settings_are_refused_in_one_line_naming_the_field(setting, message):
    extra = [] if "uri=" in setting else ["--set", "tracking.mlflow.uri=http://127.0.0.1:5000"]
    result = run_cli("validate", str(VIT_JOB), *extra, "--set", setting)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [f"error: {VIT_JOB}: {message}"]
