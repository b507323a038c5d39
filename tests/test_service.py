"""The orchestrator service on a real Ray cluster: the queue, gang admission, preemption that
loses no step, one control process per attempt, sweeps, refusals at submission
(test_service_recovery.py: `ray job submit` through the queue, and what dies).

The cluster is a `ray start --head` of its own (token auth on) and two more nodes joined to it
(tests/conftest.py's SERVICE_NODES), each with its own CPUs and one `slot`, a custom resource
standing in for a GPU; each test job has 2 workers of 1 slot, so its gang spans two nodes and
two jobs never fit at once. Training is the digits convnet on CPUs. The tests read the service's own
durable job table (the JSON files in its store) to see what it decided and when.
"""

import json
import os
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from orchestrator.testing.local_cluster import list_actors
from tests.conftest import SERVICE_SPEC
from tests.service_helpers import events, ledger_of, train_steps, when

SPEC = "jobs/convnet.yaml"  # 2 workers, DDP, digits


@pytest.mark.timeout(600)
def test_jobs_that_do_not_fit_together_run_one_after_the_other(service, tmp_path):
    first = service.submit(name="gang-a")
    # the second is followed to its end (`--wait`): its history, progress, and a result line
    summary = tmp_path / "b.json"
    waited = service.submit(name="gang-b", extra=("--wait", "--summary", str(summary)))
    second = waited.stdout.split()[0]
    assert f"[{second}] queued" in waited.stdout and f"[{second}] admitted" in waited.stdout
    assert f"[{second}] succeeded: 30 steps, " in waited.stdout
    assert json.loads(summary.read_text())["steps"] == 30
    a, b = service.done(first), service.done(second)
    # all or nothing: b was admitted only once a had finished and released its slots (in
    # submission order under the default order, las-share, too: both stay at LAS level 0, under
    # 3600 worker-seconds, and b never fits beside a)
    assert when(b, "admitted") >= when(a, "succeeded")
    assert events(a).count("admitted") == events(b).count("admitted") == 1
    assert a["step"] == b["step"] == 30
    # every second of b in its ledger: it queued behind a, started, trained, lost nothing
    spent = ledger_of(b)
    assert spent["queued"] >= when(b, "admitted") - when(b, "queued") - 1.0
    assert spent["starting"] > 0 and spent["training"] > 0, b["ledger"]
    assert spent["lost"] == spent["stalled"] == 0, spent
    goodput = service.cli("goodput")
    assert goodput.returncode == 0 and second in goodput.stdout, goodput.stdout + goodput.stderr
    assert "cluster (" in goodput.stdout and "goodput " in goodput.stdout
    status = service.cli("status", second).stdout
    assert "  time:       [" in status and "] goodput " in status and "starting 0:00:" in status
    queue = service.cli("queue", "--all")
    assert queue.returncode == 0 and first in queue.stdout and "succeeded" in queue.stdout
    # the same name again continues its run, and says so: at submission and in its history
    again = service.submit("train.eval_every=10", name="gang-a", steps=40, extra=("--wait",))
    assert "resuming run gang-a: its newest checkpoint is at step 30" in again.stderr, again.stderr
    third = again.stdout.split()[0]
    assert f"[{third}] resuming run gang-a from step 30" in again.stdout, again.stdout
    assert f"[{third}] eval at step 40: loss " in again.stdout  # evaluations and checkpoints show
    assert f"[{third}] checkpoint at step 40: " in again.stdout
    assert f"[{third}] succeeded: 40 steps, train loss " in again.stdout and ", eval loss " in again.stdout
    assert train_steps(service.runs / "gang-a") == list(range(5, 41, 5))  # each step once


def loads_torch(pid: int) -> bool:
    """Whether a process has torch's library mapped (read from /proc: the ground truth)."""
    return "libtorch_cpu" in Path(f"/proc/{pid}/maps").read_text()


def assert_one_control_process_per_attempt_on_the_jobs_own_node(service, job: dict) -> None:
    """Ray's own actor table while one job runs: one process of ours for the attempt (its
    attempt controller, which is the run's state and runs `fit()` with Ray Train's controller
    loop) on the node with most of the job's workers (the head only when the job runs there),
    no Ray Job's supervisor or driver, and none of the actors Ray Train starts that the
    product does without (docs/scaling.md)."""
    from orchestrator.ray.launcher import driver_node

    def alive(name: str) -> list[dict]:
        actors = list_actors(service.head.dashboard, service.head.env, name)
        return [a for a in actors if a["state"] == "ALIVE"]

    (controller,) = alive("AttemptController")
    assert controller["name"] == f"{job['id']}-a{job['attempt']}"
    assert controller["node_id"] == driver_node(job["placement"]), (controller, job["placement"])
    # torch is loaded by the workers, never by the run's control (docs/ray.md, Start-up)
    assert not loads_torch(controller["pid"]), controller
    workers = alive("RayTrainWorker")
    assert workers and all(loads_torch(w["pid"]) for w in workers)
    # the driver's own processes are not there: no driver (`orchestrator run`), no Ray Job
    assert not [p for p in psutil.process_iter(["cmdline"]) if "--job-id" in (p.info["cmdline"] or [])]
    for name in (
        "JobSupervisor",
        "RunState",
        "TrainController",
        "TrainingRun",
        "PlacementGroupCleaner",
        "PreemptionWatcher",
        "AutoscalingCoordinator",
        "DatasetManager",
        "SynchronizationActor",
    ):
        assert alive(name) == [], name


@pytest.mark.timeout(600)
def test_a_high_priority_job_preempts_a_low_one_which_resumes_where_it_stopped(service):
    # paced until the high job has run, so it is preempted while it trains, not while it starts
    # nor after its end; its checkpoints on S3: the one it stops at must be durable before it
    # resumes from it
    runs = service.s3.uri("preemption")
    name = service.paced("low")
    low = service.submit("scheduling.preemptible=true", f"checkpoint.storage={runs}", name=name, steps=600)
    running = service.wait(low, lambda j: j["state"] == "running", what="running")
    assert_one_control_process_per_attempt_on_the_jobs_own_node(service, running)
    high = service.submit(name="high", priority=10, steps=10)
    h = service.done(high)
    service.release(name)
    lo = service.done(low)
    # the low job stopped at a step, checkpointed it, made way, and resumed from exactly there
    assert lo["preemptions"] == 1 and lo["steps_lost"] == 0
    preempted = next(e for e in lo["history"] if e["event"] == "preempted")
    assert preempted["acknowledged"] is True and preempted["steps_lost"] == 0
    assert when(h, "admitted") >= when(lo, "preempted")
    assert when(lo, "admitted", 1) >= when(h, "succeeded")
    assert lo["step"] == 600 and lo["attempt"] == 2
    assert 0 < preempted["step"] < 600  # it stopped mid-run
    assert lo["summary"]["resumed_from_step"] == preempted["step"]  # from its checkpoint on S3
    steps = train_steps(f"{runs}/low")
    assert steps == list(range(5, 601, 5))  # each step once, across the preemption
    status = service.cli("status", low)
    assert "preempted (step" in status.stdout and "steps lost: 0" in status.stdout
    # the handshake is time spent stopping, the wait for the high job queued again; nothing lost
    spent = ledger_of(lo)
    assert spent["stopping"] > 0 and spent["lost"] == 0
    assert spent["queued"] >= when(lo, "admitted", 1) - when(lo, "preempted") - 1.0


START_UP_STOP_S = 15  # a quarter of the default grace period (scheduling.preemption_grace_s)


def controller_alive(service, name: str) -> bool:
    """Whether Ray's actor table has an attempt controller `name` that is not dead."""
    actors = list_actors(service.head.dashboard, service.head.env, "AttemptController")
    return any(a["name"] == name and a["state"] != "DEAD" for a in actors)


@pytest.mark.timeout(400)
def test_a_stop_or_preemption_during_start_up_ends_the_start_at_once(service):
    """Before the first step there is nothing to checkpoint: the start is cancelled (Ray Train's
    controller, workers and placement group end with it), not waited out for the grace period."""
    stopped = service.submit(name="stopped-early", steps=3000, workers=1)
    service.wait(stopped, lambda j: j["state"] == "admitted", what="admitted")
    asked = time.time()
    assert service.cli("stop", stopped).returncode == 0
    job = service.wait(stopped, lambda j: j["state"] == "stopped", timeout=60, what="stopped")
    assert "running" not in events(job)  # it was stopped while it started
    # cancelled, not waited out for the grace period (60 s) and then killed; how long it took
    # (a few seconds: one report, then the abort) is printed against its goal
    assert "killed" not in events(job), job["history"]
    stop_s = when(job, "stopped") - asked
    assert job["steps_lost"] == 0 and job["step"] == 0
    # the start's one process of ours ended with it, and the workers it owned with it
    deadline = time.time() + START_UP_STOP_S
    while controller_alive(service, f"{stopped}-a1"):
        assert time.time() < deadline, "the stopped start's attempt controller is still there"
        time.sleep(0.5)

    preempted = service.submit(name="preempted-early", steps=20, workers=1)
    service.wait(preempted, lambda j: j["state"] == "admitted", what="admitted")
    asked = time.time()
    assert service.cli("preempt", preempted).returncode == 0
    job = service.wait(preempted, lambda j: "preempted" in events(j), timeout=60, what="preempted")
    back = next(e for e in job["history"] if e["event"] == "preempted")
    assert back["acknowledged"] is True and back["steps_lost"] == 0  # it stopped itself, not killed
    preempt_s = back["time"] - asked
    done = service.done(preempted)  # admitted again and run to the end
    assert done["attempt"] == 2 and done["step"] == 20
    print(f"start-up: stop {stop_s:.1f} s, preemption {preempt_s:.1f} s (goal: under {START_UP_STOP_S} s)")


@pytest.mark.timeout(600)
def test_a_sweep_queues_one_job_per_trial_and_ranks_them(service, mlflow_server):
    experiment = f"sweep-{os.getpid()}-{int(time.time())}"
    result = service.cli(
        "submit",
        "jobs/sweep.yaml",
        "--set",
        "train.steps=10",
        "--set",
        "resources.custom_per_worker.slot=1",
        "--set",
        "resources.num_workers=1",  # the three trials fit side by side
        "--set",
        f"checkpoint.storage={service.runs}",
        "--set",
        f"tracking.mlflow.uri={mlflow_server.uri}",  # each trial a run of its own, under one parent
        "--set",
        f"tracking.mlflow.experiment={experiment}",
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    trials = result.stdout.split()
    assert trials == ["convnet-lr-000", "convnet-lr-001", "convnet-lr-002"]
    jobs = [service.done(t, timeout=400) for t in trials]
    lrs = [j["sweep_params"]["optimizer.lr"] for j in jobs]
    assert lrs == [0.001, 0.003, 0.01]
    ranking = service.cli("sweep", "convnet-lr")
    assert ranking.returncode == 0, ranking.stderr
    rows = [line.split() for line in ranking.stdout.splitlines() if line.strip()[:1].isdigit()]
    accuracies = [float(row[3]) for row in rows]
    assert [row[1] for row in rows] and sorted(accuracies, reverse=True) == accuracies  # best first
    assert {row[1] for row in rows} == set(trials)
    _the_trials_are_mlflow_runs_under_one_parent(mlflow_server.uri, experiment, trials)


def _the_trials_are_mlflow_runs_under_one_parent(uri: str, experiment: str, trials: list[str]) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    experiment_id = client.get_experiment_by_name(experiment).experiment_id
    deadline = time.time() + 60  # a trial's driver sends its end after the service has it
    while True:
        runs = client.search_runs([experiment_id])
        if sum(r.info.status == "FINISHED" for r in runs) >= len(trials):
            break
        assert time.time() < deadline, [(r.info.run_name, r.info.status) for r in runs]
        time.sleep(0.5)
    [parent] = [r for r in runs if "orchestrator.sweep_parent" in r.data.tags]
    children = {r.data.tags["orchestrator.job_id"]: r for r in runs if r is not parent}
    assert sorted(children) == sorted(trials)
    assert {r.data.tags["mlflow.parentRunId"] for r in children.values()} == {parent.info.run_id}
    assert {r.info.status for r in children.values()} == {"FINISHED"}
    lrs = {job: float(r.data.params["optimizer.lr"]) for job, r in children.items()}
    assert sorted(lrs.values()) == [0.001, 0.003, 0.01]


@pytest.mark.timeout(120)
def test_a_job_bigger_than_the_cluster_is_refused_at_submission(service):
    result = service.cli(
        "submit",
        SPEC,
        "--set",
        "resources.custom_per_worker.slot=1",
        "--set",
        "resources.num_workers=4",
        "--set",
        f"checkpoint.storage={service.runs}",
    )
    assert result.returncode == 2
    assert "but the whole cluster has room for only 3 such worker(s)" in result.stderr
    assert "Traceback" not in result.stderr


def cli_driver_rows(service, command: str) -> int:
    """Rows of Ray's own job list (the dashboard's) left by `orchestrator COMMAND` joining the
    cluster as a driver (its entrypoint is the command line)."""
    token = Path(service.head.env["RAY_AUTH_TOKEN_PATH"]).read_text().strip()
    request = urllib.request.Request(
        f"{service.head.dashboard}/api/jobs/", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        rows = json.load(reply)
    words = [(row.get("entrypoint") or "").split() for row in rows if row.get("type") == "DRIVER"]
    return sum(1 for w in words if command in w and any("orchestrator" in part for part in w))


def test_submit_queue_and_status_talk_to_the_service_over_http_and_leave_ray_s_job_list_alone(service):
    service.up()  # records the page again: a test above may have had the service restarted on another port
    submits = cli_driver_rows(service, "submit")
    job_id = service.done(service.submit(name="read-quickly", steps=10, workers=1))["id"]
    assert cli_driver_rows(service, "submit") == submits  # queued over HTTP, not as a Ray driver
    before = {command: cli_driver_rows(service, command) for command in ("queue", "status")}
    queue = service.cli("queue", "--all")
    assert queue.returncode == 0 and job_id in queue.stdout, queue.stdout + queue.stderr
    status = service.cli("status", job_id)
    assert status.returncode == 0 and f"{job_id}: succeeded" in status.stdout, status.stdout + status.stderr
    assert "page:       http://" in status.stdout and f"/#/jobs/{job_id}" in status.stdout
    # neither joined the cluster as a driver
    assert {command: cli_driver_rows(service, command) for command in before} == before
    # with --address they join the cluster (the way to a service `up` did not record here)
    assert service.cli("queue", "--address", service.head.address).returncode == 0
    assert cli_driver_rows(service, "queue") == before["queue"] + 1


def test_the_service_process_never_loads_the_data_plane(service):
    """After jobs ran through it (the first tests of this module), the service actor's process has
    loaded neither torch, kernels nor any training code of `workers/`: it schedules, it does not
    train. (It reads the catalogue of model presets and data sources a spec sent over HTTP is
    checked against: `page_view.SPEC_CATALOGUE`.)"""
    if not any(service.store.glob("jobs/*.json")):
        service.done(service.submit(name="control-plane", workers=1))
    # the service actor may have been restarted by a test above, on another port: `up` finds it
    up = service.cli(*service.up_args())
    assert up.returncode == 0 and "already running" in up.stdout, up.stdout + up.stderr
    page = re.search(r"status:\s+(\S+)", up.stdout).group(1)
    info = json.loads(urllib.request.urlopen(f"{page.rstrip('/')}/api/info", timeout=10).read())
    process = info["process"]
    assert process["data_plane_modules"] == []
    assert 0 < process["rss_bytes"] < 2**30


def test_unwritable_storage_is_refused_at_submission_and_never_retried(service):
    # under the storage every node shares, a file where a directory should be
    service.runs.mkdir(parents=True, exist_ok=True)
    (service.runs / "a-file").write_text("not a directory")
    bad = str(service.runs / "a-file" / "runs")
    jobs_before = set(service.store.glob("jobs/*.json"))
    refused = service.cli(
        "submit", SERVICE_SPEC, "--set", f"checkpoint.storage={bad}", "--set", "name=bad-store"
    )
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith("error: bad-store: checkpoint storage '") and "is not writable" in line
    assert set(service.store.glob("jobs/*.json")) == jobs_before  # nothing queued

    # past the submission check (`--no-validate`), the driver finds it: the job fails at once
    # with that reason, and is not started again
    through = service.cli(
        "submit",
        SERVICE_SPEC,
        "--no-validate",
        "--wait",
        "--set",
        f"checkpoint.storage={bad}",
        "--set",
        "name=bad-store-late",
        "--set",
        "resources.custom_per_worker.slot=1",
        "--set",
        "resources.num_workers=1",
    )
    assert through.returncode == 1, through.stdout[-2000:] + through.stderr[-2000:]
    [job] = [json.loads(p.read_text()) for p in set(service.store.glob("jobs/*.json")) - jobs_before]
    assert job["state"] == "failed" and "is not writable" in job["reason"], job["reason"]
    assert job["attempt"] <= 1 and [e["event"] for e in job["history"]].count("admitted") <= 1
