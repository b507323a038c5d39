"""A real MLflow tracking server for the tests: PyPI's `mlflow server` with a SQLite backend
and its artifacts in a folder, on a free port, started from its own virtualenv
(`.venv/mlflow-server`, made by scripts/test.sh: the server pins a pyarrow the project does
not use). `stop` ends its process group; `start` again brings it back on the same port with the
same database, as a restarted server comes back."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.testing.local_cluster import free_ports

ROOT = Path(__file__).resolve().parents[1]
# run as `python -m mlflow`: the venv's scripts name the path it was made at in their first line,
# and a checkout elsewhere (a git worktree sharing .venv) would find them broken
MLFLOW_PYTHON = ROOT / ".venv/mlflow-server/bin/python"


@dataclass
class MlflowServer:
    directory: Path
    port: int = field(default_factory=lambda: free_ports(1)[0])
    process: subprocess.Popen | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120) -> MlflowServer:
        assert MLFLOW_PYTHON.exists(), f"{MLFLOW_PYTHON} is missing: scripts/test.sh installs it"
        self.directory.mkdir(parents=True, exist_ok=True)
        command = [
            str(MLFLOW_PYTHON),
            *("-m", "mlflow", "server"),
            f"--backend-store-uri=sqlite:///{self.directory / 'mlflow.db'}",
            f"--artifacts-destination={self.directory / 'artifacts'}",
            "--host=127.0.0.1",
            f"--port={self.port}",
            "--workers=1",
        ]
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no job runner processes
        log = open(self.directory / "server.log", "a")
        self.process = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.time() + timeout
        while time.time() < deadline:
            assert self.process.poll() is None, (self.directory / "server.log").read_text()[-2000:]
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as reply:
                    if reply.status == 200:
                        return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"mlflow server did not answer in {timeout:.0f} s")

    def stop(self) -> None:
        """SIGKILL to its process group, as a server that dies."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)
        self.process = None
