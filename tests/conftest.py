import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.ray_cluster import RayHead, free_ports, start_ray_head, stop_ray_head  # noqa: F401

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


# --- real Ray clusters (tests/ray_cluster.py): one per session, started like a user would --------

_free_ports = free_ports  # the name other test modules and the benches import


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
FAULTS_ENV = "ORCHESTRATOR_TEST_FAULTS"  # workers/faults.py


class Service:
    def __init__(self, head, home: Path, store: Path, runs: Path):
        self.head, self.home, self.store, self.runs = head, home, store, runs
        self.env = {**head.env, "ORCHESTRATOR_HOME": str(home)}

    def cli(self, *args, timeout=240):
        return run_cli(*args, env=self.env, timeout=timeout)

    def up(self) -> subprocess.CompletedProcess:
        """`orchestrator up` on this service's cluster and store; it must work."""
        result = self.cli(
            "up", "--address", self.head.address, "--store", str(self.store), "--metrics-port", "0"
        )
        assert result.returncode == 0, result.stdout + result.stderr
        return result

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


# The service's cluster: a head and two worker nodes, each with one `slot` (a stand-in for a GPU)
# and CPUs of its own; a test job of 2 workers x 1 slot spans two nodes, and two never fit at once.
SERVICE_NODES = {"head": (4, 1), "node-1": (2, 1), "node-2": (2, 1)}  # name -> (CPUs, slots)
GROW_AFTER_S = 5.0  # an elastic job grows back soon after room frees (the product waits 120 s)


@pytest.fixture(scope="session")
def service(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("service")
    cpus, slots = SERVICE_NODES["head"]
    # faults a test injects into its job (workers/faults.py): the cluster's processes inherit it
    faults = tmp / "faults"
    faults.mkdir()
    os.environ[FAULTS_ENV] = str(faults)
    head = start_ray_head(num_cpus=cpus, resources={"slot": slots})
    svc = Service(head, tmp / "home", tmp / "store", tmp / "runs")
    svc.faults = faults
    try:
        for name, (cpus, slots) in SERVICE_NODES.items():
            if name != "head":
                head.add_node(name, cpus, {"slot": slots})
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
            "--grow-after",
            str(GROW_AFTER_S),
        )
        assert up.returncode == 0, up.stdout + up.stderr
        assert "orchestrator service up" in up.stdout and head.dashboard in up.stdout
        assert f"{len(SERVICE_NODES)} node(s)" in up.stdout, up.stdout
        svc.page = json.loads((svc.home / "cluster.json").read_text())["status_page"]
        yield svc
    finally:
        svc.cli("down", timeout=60)
        stop_ray_head(head)
        os.environ.pop(FAULTS_ENV, None)
