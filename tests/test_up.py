"""`orchestrator up` without an address: a local Ray head of its own with its dashboard,
Prometheus' config and the service; `ray job submit` from a fresh shell; a burst of job starts
on its 2-core head that leaves the head and every job alive; and `down`, which stops all of it.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT, _free_ports, run_cli

SPEC = "jobs/convnet.yaml"  # 2 workers, DDP, digits


def _processes_of(temp_dir: str) -> list:
    """The processes of the Ray head that uses `temp_dir`, with the children that renamed
    themselves (ray::DashboardAgent)."""
    import psutil

    found = [p for p in psutil.process_iter(["cmdline"]) if temp_dir in " ".join(p.info["cmdline"] or [])]
    return found + [c for p in found for c in p.children(recursive=True)]


@pytest.mark.cluster
@pytest.mark.timeout(900)
def test_up_starts_a_local_head_with_its_dashboard_and_down_stops_all_of_it(tmp_path):
    import psutil

    port, dashboard = _free_ports(2)
    env = {"ORCHESTRATOR_HOME": str(tmp_path / "home"), "RAY_ADDRESS": ""}
    args = ["--port", str(port), "--dashboard-port", str(dashboard), "--metrics-port", "0"]
    args += ["--num-cpus", str(BURST), "--store", str(tmp_path / "store")]
    first = run_cli("up", *args, env=env, timeout=180)
    try:
        assert first.returncode == 0, first.stdout + first.stderr
        assert "started a local Ray head" in first.stdout
        assert f"dashboard: http://127.0.0.1:{dashboard}" in first.stdout
        again = run_cli("up", *args, env=env, timeout=120)  # finds it, and keeps it ours to stop
        assert again.returncode == 0 and "orchestrator service already running" in again.stdout
        temp_dir = json.loads((tmp_path / "home" / "cluster.json").read_text())["temp_dir"]
        head = _processes_of(temp_dir)
        # Ray's client server names neither the temp dir nor a parent (init adopts it)
        client_server = [
            p
            for p in psutil.process_iter(["cmdline"])
            if "ray.util.client.server" in (p.info["cmdline"] or [])
            and any(a.startswith("--address=") and a.endswith(f":{port}") for a in p.info["cmdline"])
        ]
        assert client_server, "no client server found: the check below would prove nothing"
        head += client_server
        # Ray's workers (the service actor among them) run level with Ray's own processes
        workers = [p for p in head if p.name().startswith("ray::") and "Agent" not in p.name()]
        assert workers and all(p.nice() == 0 for p in workers)
        _the_dashboard_opens_with_the_token_up_named(first.stdout, dashboard)
        _prometheus_with_the_config_up_wrote_scrapes_both(first.stdout, tmp_path / "prometheus")
        _ray_job_submit_from_a_fresh_shell(dashboard, tmp_path)
        _a_burst_of_job_starts_leaves_the_head_and_every_job_alive(env, port, dashboard, tmp_path)
    finally:
        down = run_cli("down", env=env, timeout=120)
    assert down.returncode == 0 and "stopped the local Ray head" in down.stdout, down.stdout + down.stderr
    assert not [p for p in head if p.is_running() and p.status() != "zombie"]
    assert not (tmp_path / "home" / "cluster.json").exists()


NO_AGENT = "No available agent to submit job"
BURST = 8  # jobs started at once on the head `up` starts (12 on 2 cores killed a head tuned to 3 x 1 s)


def _a_burst_of_job_starts_leaves_the_head_and_every_job_alive(
    env: dict, port: int, dashboard: int, tmp_path: Path
) -> None:
    """A head busy starting many jobs on few cores leaves its own raylet's health checks
    unanswered for a while. `up`'s head is patient (orchestrator/ray/cluster.py): its raylet is
    never declared dead, the service never restarts, and every job runs once to its end."""
    import psutil

    from orchestrator.ray.node_health import HealthChecks
    from orchestrator.testing.local_cluster import list_nodes

    checks = HealthChecks.of_cluster(f"127.0.0.1:{port}")  # read from the head's own GCS
    assert checks.source == "the cluster's GCS"
    assert (checks.period_s, checks.timeout_s, checks.threshold) == (3.0, 20.0, 10)
    submitted, load = [], []
    for i in range(BURST):  # each queued in under a second: they all start together
        done = run_cli(
            "submit",
            SPEC,
            *("--set", "resources.num_workers=1", "--set", "resources.cpus_per_worker=1"),
            *("--set", "train.steps=20", "--set", f"checkpoint.storage={tmp_path / 'burst'}"),
            *("--set", f"name=burst-{i}"),
            env=env,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        submitted.append(done.stdout.split()[0])
    store = tmp_path / "store" / "jobs"
    deadline = time.time() + 600  # they start one after the other: minutes on a slow machine
    while time.time() < deadline:
        load.append(psutil.getloadavg()[0])
        jobs = [json.loads((store / f"{job_id}.json").read_text()) for job_id in submitted]
        if all(j["state"] in ("succeeded", "failed", "stopped") for j in jobs):
            break
        time.sleep(2)
    assert [(j["state"], j["attempt"]) for j in jobs] == [("succeeded", 1)] * BURST, [
        (j["id"], j["reason"], [(e["event"], e.get("reason")) for e in j["history"]])
        for j in jobs
        if (j["state"], j["attempt"]) != ("succeeded", 1)
    ]
    token = {"RAY_AUTH_TOKEN_PATH": os.path.expanduser("~/.ray/auth_token")}
    nodes = list_nodes(f"http://127.0.0.1:{dashboard}", token)
    assert [n["state"] for n in nodes] == ["ALIVE"], nodes  # the head was never declared dead
    lease = json.loads((tmp_path / "store" / "service.json").read_text())
    assert lease["generation"] == 1  # the service never started again
    print(f"burst of {BURST} job starts: peak load {max(load):.1f} on {os.cpu_count()} cores, head alive")


def _the_dashboard_opens_with_the_token_up_named(printed: str, dashboard: int) -> None:
    """Ray's dashboard asks for the cluster's token once (its /api/authenticate sets a cookie):
    `up` says where the token is, and it opens the dashboard."""
    source = re.search(r"asks for the cluster's token once: paste the one in (\S+)", printed).group(1)
    token = Path(source).read_text().strip()
    base = f"http://127.0.0.1:{dashboard}"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{base}/api/jobs/", timeout=10)
    assert refused.value.code == 401  # without it
    login = urllib.request.Request(
        f"{base}/api/authenticate", method="POST", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(login, timeout=10) as reply:
        cookie = reply.headers["Set-Cookie"].split(";")[0]
    with urllib.request.urlopen(
        urllib.request.Request(f"{base}/api/jobs/", headers={"Cookie": cookie})
    ) as jobs:
        assert jobs.status == 200


def _prometheus_with_the_config_up_wrote_scrapes_both(printed: str, tmp_path: Path) -> None:
    """The config `up` printed, in a real Prometheus: the service's endpoint and Ray's own
    (through the discovery file of the head `up` started) are both up."""
    from tests.test_monitoring import prometheus, wait_for

    tmp_path.mkdir()
    config = Path(re.search(r"prometheus --config.file=(\S+)", printed).group(1)).read_text()
    with prometheus(config, tmp_path) as query:
        for target in ("orchestrator", "ray"):
            result = wait_for(query, f'up{{job="{target}"}} == 1', tmp_path)
            assert result, target


def _ray_job_submit_from_a_fresh_shell(dashboard: int, tmp_path: Path) -> None:
    """The README's `ray job submit --working-dir . -- ./jobs/...yaml`, after `orchestrator up`, in
    a shell with nothing but the project's virtualenv activated: Ray's own client gets the
    head's token, and the spec's relative `./runs` lands where it was submitted from."""
    name = f"fresh-shell-{os.getpid()}"
    job = "./jobs/convnet.yaml --set train.steps=5 --set resources.num_workers=1 --set name=" + name
    activate = Path(sys.executable).parent / "activate"
    fresh = {
        "HOME": os.environ["HOME"],
        "PATH": "/usr/bin:/bin",
        "RAY_ADDRESS": f"http://127.0.0.1:{dashboard}",
    }

    def submit(working_dir: Path) -> subprocess.CompletedProcess:
        script = f". {activate} && ray job submit --working-dir . -- {job}"
        deadline = time.time() + 120
        while True:
            done = subprocess.run(
                ["bash", "-c", script],
                cwd=working_dir,
                env=fresh,
                capture_output=True,
                text=True,
                timeout=300,
            )
            # Ray's answer while its agent is busy on a loaded head, and its advice: try again later
            if NO_AGENT not in done.stdout + done.stderr or time.time() > deadline:
                return done
            time.sleep(2)

    runs = ROOT / "runs" / name
    try:
        done = submit(ROOT)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert f"is relative: in {ROOT}, where it was submitted from" in done.stdout
        assert (runs / "checkpoint_00000005" / "trainer.pt").is_file()  # not in Ray's temporary copy
    finally:
        shutil.rmtree(runs, ignore_errors=True)
    # submitted from a directory nobody recorded: its origin is unknown, so the path is refused
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(ROOT / "jobs", elsewhere / "jobs")
    refused = submit(elsewhere)
    assert refused.returncode != 0
    assert "error: checkpoint.storage './runs' is relative, and `ray job submit` runs" in refused.stdout
    assert not (elsewhere / "runs").exists() and not runs.exists()
