"""A real S3 API server for the tests and the benchmarks: `moto_server` (PyPI's `moto[server]`,
in the `dev` extra) on a free port.

Clients reach it as they reach any S3-compatible store (MinIO, Ceph, R2): plain `s3://bucket/...`
URIs, with the endpoint and credentials in the standard AWS variables (`AWS_ENDPOINT_URL`,
`AWS_ACCESS_KEY_ID`, ...), which pyarrow, boto3 and the processes of a Ray cluster started after
them all read. `use()` puts them in this process's environment, so that the clusters the tests
start next inherit them.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

from orchestrator.testing.local_cluster import free_ports

BUCKET = "orchestrator-tests"
MOTO = str(Path(sys.executable).parent / "moto_server")


@dataclass
class S3Server:
    endpoint: str  # http://127.0.0.1:PORT
    process: subprocess.Popen
    log: Path

    @property
    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "orchestrator-tests",
            "AWS_SECRET_ACCESS_KEY": "orchestrator-tests",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",  # no instance metadata to look for here
        }

    def uri(self, *parts: str) -> str:
        return "/".join([f"s3://{BUCKET}", *parts])

    def fs(self, **options) -> pafs.S3FileSystem:
        return pafs.S3FileSystem(
            endpoint_override=self.endpoint.removeprefix("http://"),
            scheme="http",
            access_key=self.env["AWS_ACCESS_KEY_ID"],
            secret_key=self.env["AWS_SECRET_ACCESS_KEY"],
            region="us-east-1",
            **options,
        )

    def files(self, *parts: str) -> dict[str, int]:
        """{path under the prefix: size} of every object under s3://bucket/parts..."""
        prefix = "/".join([BUCKET, *parts])
        infos = self.fs().get_file_info(pafs.FileSelector(prefix, recursive=True, allow_not_found=True))
        return {i.path[len(prefix) + 1 :]: i.size for i in infos if i.type == pafs.FileType.File}

    def use(self) -> dict[str, str | None]:
        """Put its endpoint and credentials into this process's environment; returns what was
        there before (for `restore`)."""
        previous = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        return previous

    def stop(self) -> None:
        self.process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


def restore(previous: dict[str, str | None]) -> None:
    for key, value in previous.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def start_s3_server(niceness: int = 0) -> S3Server:
    """A moto S3 API server on a free loopback port, with the tests' bucket. `niceness`: the
    server's CPU priority (a benchmark lowers it: real S3 does not share the training machine)."""
    (port,) = free_ports(1)
    log = Path(tempfile.mkdtemp(prefix="moto-", dir="/tmp"), "moto.log")
    process = subprocess.Popen(
        ["nice", "-n", str(niceness), MOTO, "-H", "127.0.0.1", "-p", str(port)],
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    server = S3Server(f"http://127.0.0.1:{port}", process, log)
    deadline = time.time() + 60
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"moto_server exited: {log.read_text()[-2000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                server.fs(allow_bucket_creation=True).create_dir(BUCKET)
                return server
        time.sleep(0.2)
    server.stop()
    raise RuntimeError("moto_server did not start in 60 s")
