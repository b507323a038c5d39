import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_cli(
    *args: str,
    cwd: Path | None = None,
    env: dict | None = None,
    timeout: float = 300,
    module: str = "orchestrator",
) -> subprocess.CompletedProcess:
    """Run `python -m <module> ARGS` as a user would, capturing output."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd or ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def cli():
    return run_cli


# --- a real Ray cluster for the Ray tests: one per session, started like a user would --------


@dataclass
class RayHead:
    address: str  # the cluster (GCS) address, for `orchestrator run --address`
    dashboard: str  # the Jobs API, for `orchestrator submit` and `ray job submit`
    env: dict  # what a client needs: token auth on, the token file, the venv on PATH
    temp_dir: str
    process: subprocess.Popen


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def start_ray_head(num_cpus: int = 4, resources: dict | None = None) -> RayHead:
    """`ray start --head --block` with token auth, its own ports and a short temp dir.

    Every port gets a free one so that this cluster never meets another on the machine, and
    it is stopped by its own pid (not `ray stop`, which stops every Ray on the machine).
    """
    temp_dir = tempfile.mkdtemp(prefix="r", dir="/tmp")  # Unix socket paths: 107 bytes at most
    token = os.path.join(temp_dir, "auth_token")
    with open(token, "w") as out:
        out.write(secrets.token_hex(32))
    env = {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": token,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_worker_niceness": "0",  # as the clusters the product starts (orchestrator/ray/cluster.py)
    }
    gcs, dash, client, agent, agent_grpc, runtime_env, metrics = _free_ports(7)
    ray = str(Path(sys.executable).parent / "ray")
    log = open(os.path.join(temp_dir, "head.log"), "w")
    process = subprocess.Popen(
        [
            ray,
            "start",
            "--head",
            "--block",
            f"--port={gcs}",
            f"--dashboard-port={dash}",
            "--dashboard-host=127.0.0.1",
            f"--ray-client-server-port={client}",
            f"--dashboard-agent-listen-port={agent}",
            f"--dashboard-agent-grpc-port={agent_grpc}",
            f"--runtime-env-agent-port={runtime_env}",
            f"--metrics-export-port={metrics}",
            f"--temp-dir={temp_dir}/ray",
            f"--num-cpus={num_cpus}",
            *([f"--resources={json.dumps(resources)}"] if resources else []),
            "--include-dashboard=true",
            "--disable-usage-stats",
        ],
        env={**os.environ, **env},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    head = RayHead(f"127.0.0.1:{gcs}", f"http://127.0.0.1:{dash}", env, temp_dir, process)
    deadline = time.time() + 120
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"ray start --head exited: {Path(temp_dir, 'head.log').read_text()}")
        try:  # 401 means the dashboard is up and wants the token
            urllib.request.urlopen(f"{head.dashboard}/api/version", timeout=2)
            return head
        except urllib.error.HTTPError:
            return head
        except OSError:
            time.sleep(1)
    stop_ray_head(head)
    raise RuntimeError("the Ray head did not come up in 120 s")


def stop_ray_head(head: RayHead) -> None:
    """SIGTERM to `ray start --block` stops the processes it started; then the group, by id."""
    if head.process.poll() is None:
        head.process.send_signal(signal.SIGTERM)
        try:
            head.process.wait(5)
        except subprocess.TimeoutExpired:  # the group we started, by its id
            os.killpg(head.process.pid, signal.SIGKILL)
            head.process.wait(10)
    shutil.rmtree(head.temp_dir, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def orchestrator_home(tmp_path_factory):
    """The CLI's own state (`orchestrator up`'s record) lives in a directory of the test session,
    never in the home directory of whoever runs the tests."""
    home = tmp_path_factory.mktemp("orchestrator-home")
    previous = os.environ.get("ORCHESTRATOR_HOME")
    os.environ["ORCHESTRATOR_HOME"] = str(home)
    yield home
    if previous is None:
        os.environ.pop("ORCHESTRATOR_HOME", None)
    else:
        os.environ["ORCHESTRATOR_HOME"] = previous


@pytest.fixture(scope="session")
def ray_head():
    head = start_ray_head()
    try:
        yield head
    finally:
        stop_ray_head(head)


# --- an orchestrator service on a cluster of its own (tests/test_service.py, test_monitoring.py)


SERVICE_SPEC = "jobs/convnet.yaml"  # 2 workers, DDP, digits


class Service:
    def __init__(self, head, home: Path, store: Path, runs: Path):
        self.head, self.home, self.store, self.runs = head, home, store, runs
        self.env = {**head.env, "ORCHESTRATOR_HOME": str(home)}

    def cli(self, *args, timeout=240):
        return run_cli(*args, env=self.env, timeout=timeout)

    def submit(self, *sets, priority=None, steps=30, name=None, extra=()):
        args = [
            "submit",
            SERVICE_SPEC,
            "--set",
            "resources.custom_per_worker.slot=1",
            "--set",
            f"train.steps={steps}",
            "--set",
            f"checkpoint.storage={self.runs}",
            "--set",
            "metrics.log_every=5",
        ]
        if name:
            args += ["--set", f"name={name}"]
        for s in sets:
            args += ["--set", s]
        if priority is not None:
            args += ["--priority", str(priority)]
        result = self.cli(*args, *extra)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        return result.stdout.split()[0] if not extra else result

    def job(self, job_id: str) -> dict:
        return json.loads((self.store / "jobs" / f"{job_id}.json").read_text())

    def wait(self, job_id: str, predicate, timeout=240, what="") -> dict:
        deadline = time.time() + timeout
        while time.time() < deadline:
            path = self.store / "jobs" / f"{job_id}.json"
            if path.exists():
                job = json.loads(path.read_text())
                if predicate(job):
                    return job
                if job["state"] in ("failed", "stopped") and "failed" not in what:
                    raise AssertionError(f"{job_id} {job['state']}: {job.get('reason')}")
            time.sleep(0.5)
        raise AssertionError(f"{job_id}: timed out waiting for {what or predicate}: {self.job(job_id)}")

    def done(self, job_id: str, timeout=300) -> dict:
        return self.wait(job_id, lambda j: j["state"] == "succeeded", timeout, "success")


@pytest.fixture(scope="session")
def service(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("service")
    head = start_ray_head(num_cpus=8, resources={"slot": 3})
    svc = Service(head, tmp / "home", tmp / "store", tmp / "runs")
    try:
        up = svc.cli(
            "up",
            "--address",
            head.address,
            "--store",
            str(svc.store),
            "--start-deadline",
            "120",
            "--metrics-port",
            "0",
        )
        assert up.returncode == 0, up.stdout + up.stderr
        assert "orchestrator service up" in up.stdout and head.dashboard in up.stdout
        svc.page = json.loads((svc.home / "cluster.json").read_text())["status_page"]
        yield svc
    finally:
        svc.cli("down", timeout=60)
        stop_ray_head(head)
