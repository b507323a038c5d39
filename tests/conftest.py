import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from orchestrator.testing.local_cluster import (  # noqa: F401
    RayHead,
    free_ports,
    start_ray_head,
    stop_ray_head,
)
from orchestrator.testing.s3_server import restore, start_s3_server

ROOT = Path(__file__).resolve().parents[1]
# SUITE_CPU_LOG=FILE: CPU seconds per test (cpu_per_test); the tests' order and when the
# session's clusters stop (lanes)
pytest_plugins = ["tests.cpu_per_test", "tests.lanes"]


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


# --- real Ray clusters (orchestrator/testing/local_cluster.py): one per session, as a user starts one

_free_ports = free_ports  # the name other test modules import (orchestrator/testing/local_cluster.py)


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
def s3():
    """A real S3 API server (moto_server) for the session, its endpoint and credentials in the
    environment of this process and of every cluster started after it."""
    server = start_s3_server()
    previous = server.use()
    try:
        yield server
    finally:
        server.stop()
        restore(previous)


FAULTS_ENV = "ORCHESTRATOR_TEST_FAULTS"  # workers/faults.py


@pytest.fixture(scope="session", autouse=True)
def faults_folder(tmp_path_factory):
    """Where tests put the faults they inject into their jobs (workers/faults.py): every
    cluster started in the session inherits it."""
    folder = tmp_path_factory.mktemp("faults")
    os.environ[FAULTS_ENV] = str(folder)
    try:
        yield folder
    finally:
        os.environ.pop(FAULTS_ENV, None)


@pytest.fixture(scope="session")
def ray_head(s3):  # its processes inherit the S3 server's endpoint and credentials
    from tests.lanes import released_early

    head = start_ray_head()
    with released_early("ray_head", lambda: stop_ray_head(head)):
        yield head


# --- an orchestrator service on a cluster of its own (tests/test_service.py, test_monitoring.py)


SERVICE_SPEC = "jobs/convnet.yaml"  # 2 workers, DDP, digits


class Service:
    """The service of the tests' three-node cluster. `runs` is storage every node sees (the
    machine's disk, declared shared with `up --shared-storage`, as an NFS mount would be);
    `local` is a disk of each node's own (a tmpfs per worker node); `s3` the S3 server."""

    def __init__(self, head, home: Path, store: Path, runs: Path, s3=None):
        self.head, self.home, self.store, self.runs, self.s3 = head, home, store, runs, s3
        self.env = {**head.env, "ORCHESTRATOR_HOME": str(home)}
        self.faults = Path(os.environ[FAULTS_ENV])  # the session's (faults_folder)

    def paced(self, name: str, seconds: float = 0.1) -> str:
        """Job `name` trains a step per `seconds` at most until `release(name)`: still running
        when the test acts on it, whatever the machine's pace; then it ends soon."""
        (self.faults / f"{name}.go").unlink(missing_ok=True)
        (self.faults / name).write_text(f"paced={seconds}\n")
        return name

    def release(self, name: str) -> None:
        """Job `name`, paced, trains at full speed from now on."""
        (self.faults / f"{name}.go").touch()

    def cli(self, *args, timeout=240):
        return run_cli(*args, env=self.env, timeout=timeout)

    def up_args(self, *extra: str) -> list[str]:
        """`orchestrator up` as the fixture ran it: this cluster, this store, `runs` shared."""
        return [
            "up",
            "--address",
            self.head.address,
            "--store",
            str(self.store),
            "--metrics-port",
            "0",
            "--shared-storage",
            str(self.runs),
            *extra,
        ]

    def up(self) -> subprocess.CompletedProcess:
        """`orchestrator up` on this service's cluster and store; it must work."""
        result = self.cli(*self.up_args())
        assert result.returncode == 0, result.stdout + result.stderr
        return result

    def submit(self, *sets, priority=None, steps=30, name=None, extra=(), workers=None):
        """`orchestrator submit` of SERVICE_SPEC (2 workers, one slot each: two such jobs never
        fit at once); `workers=1` where a test is not about the gang (half the CPU of a start)."""
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
        if workers is not None:
            args += ["--set", f"resources.num_workers={workers}"]
        for s in sets:
            args += ["--set", s]
        if priority is not None:
            args += ["--priority", str(priority)]
        result = self.cli(*args, *extra)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        return result.stdout.split()[0] if not extra else result

    def job(self, job_id: str) -> dict:
        job = self._read(job_id)
        if job is None:
            raise FileNotFoundError(f"no record of {job_id} in {self.store}")
        return job

    def _read(self, job_id: str) -> dict | None:
        """The job's record in the store (a path, or a URI: s3://), None while there is none."""
        from core import storage
        from orchestrator.service.store import read_json

        fs, path = storage.resolve(storage.join(str(self.store), "jobs", f"{job_id}.json"))
        try:  # as the service reads its store: a read that straddles a rewrite is read again
            return read_json(fs, path)
        except FileNotFoundError:
            return None

    def wait(self, job_id: str, predicate, timeout=240, what="") -> dict:
        deadline = time.time() + timeout
        while time.time() < deadline:
            job = self._read(job_id)
            if job is not None:
                if predicate(job) or predicate(job := self._with_live_step(job)):
                    return job
                if job["state"] in ("failed", "stopped") and "failed" not in what:
                    # the history says how each attempt ended: what a failure in CI needs
                    history = [{k: v for k, v in e.items() if k != "time"} for e in job["history"][-10:]]
                    raise AssertionError(f"{job_id} {job['state']}: {job.get('reason')}; history: {history}")
            time.sleep(0.5)
        raise AssertionError(f"{job_id}: timed out waiting for {what or predicate}: {self.job(job_id)}")

    def _with_live_step(self, job: dict) -> dict:
        """The stored record with the step the service holds now: its store saves a step that
        only moves every 10 s (orchestrator/service/lifecycle.py), the rest at once."""
        try:
            page = json.loads((self.home / "cluster.json").read_text())["status_page"]
            with urllib.request.urlopen(f"{page.rstrip('/')}/api/jobs/{job['id']}", timeout=10) as reply:
                live = json.load(reply)
        except (OSError, ValueError, KeyError):  # no service up just now: the store's record
            return job
        same = live.get("state") == job["state"] and live.get("attempt") == job.get("attempt")
        return {**job, "step": live["step"]} if same and "step" in live else job

    def done(self, job_id: str, timeout=300) -> dict:
        return self.wait(job_id, lambda j: j["state"] == "succeeded", timeout, "success")


# The service's cluster: a head and two worker nodes, each with one `slot` (a stand-in for a GPU)
# and CPUs of its own; a test job of 2 workers x 1 slot spans two nodes, and two never fit at once.
SERVICE_NODES = {"head": (4, 1), "node-1": (2, 1), "node-2": (2, 1)}  # name -> (CPUs, slots)
GROW_AFTER_S = 5.0  # an elastic job grows back soon after room frees (the product waits 120 s)


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real MLflow tracking server (tests/mlflow_server.py) for the session; the tests that
    need one that dies start their own."""
    from tests.mlflow_server import MlflowServer

    server = MlflowServer(tmp_path_factory.mktemp("mlflow")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def service(tmp_path_factory, s3):
    tmp = tmp_path_factory.mktemp("service")
    cpus, slots = SERVICE_NODES["head"]
    head = start_ray_head(num_cpus=cpus, resources={"slot": slots})  # Ray's own health checks
    svc = Service(head, tmp / "home", tmp / "store", tmp / "runs", s3)
    svc.local = tmp / "local"  # each worker node's own disk
    svc.local.mkdir()
    head.private_disks = [str(svc.local)]

    def stop() -> None:
        svc.cli("down", timeout=60)
        stop_ray_head(head)

    from tests.lanes import released_early

    with released_early("service", stop):
        for name, (cpus, slots) in SERVICE_NODES.items():
            if name != "head":
                head.add_node(name, cpus, {"slot": slots})
        up = svc.cli(*svc.up_args("--start-deadline", "120", "--grow-after", str(GROW_AFTER_S)))
        assert up.returncode == 0, up.stdout + up.stderr
        assert "orchestrator service up" in up.stdout and head.dashboard in up.stdout
        assert f"{len(SERVICE_NODES)} node(s)" in up.stdout, up.stdout
        svc.page = json.loads((svc.home / "cluster.json").read_text())["status_page"]
        yield svc


def pytest_terminal_summary(terminalreporter):
    """Seconds per test file (setup, call and teardown together), slowest first: where the
    suite's time goes, in a few lines at the end of the output."""
    spent: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if hasattr(report, "duration") and hasattr(report, "nodeid"):
                path = report.nodeid.split("::")[0]
                spent[path] = spent.get(path, 0.0) + report.duration
    if not spent:
        return
    slowest = sorted(spent.items(), key=lambda item: -item[1])[:20]
    terminalreporter.write_sep("=", f"time per test file (all: {sum(spent.values()):.0f} s)")
    terminalreporter.write_line("  ".join(f"{path.removeprefix('tests/')} {s:.0f}" for path, s in slowest))
