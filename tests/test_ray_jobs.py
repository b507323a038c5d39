"""Jobs on a `ray start --head` cluster with token auth: `orchestrator submit/status/list/logs/stop`
and plain `ray job submit`, with the project shipped as the job's working_dir."""

import os
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli

SPEC = "jobs/convnet.yaml"  # 2 workers, DDP, digits
# where a test is about the way in, not the gang: half the CPU of a start on the 2 cores
ONE_WORKER = ("--set", "resources.num_workers=1")


def cli(head, *args, env=None, timeout=240):
    return run_cli(*args, "--address", head.dashboard, env={**head.env, **(env or {})}, timeout=timeout)


def job_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


@pytest.mark.timeout(300)
def test_submit_wait_runs_the_job_and_the_job_commands_show_it(ray_head, tmp_path):
    submission = job_id("submit-wait")
    result = cli(
        ray_head,
        "submit",
        SPEC,
        "--wait",
        "--id",
        submission,
        "--set",
        "train.steps=5",
        "--set",
        f"checkpoint.storage={tmp_path}",
        *ONE_WORKER,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert result.stdout.splitlines()[0] == submission
    assert "succeeded: 5 steps" in result.stdout  # the job's own log, streamed
    assert (tmp_path / "convnet-digits" / "checkpoint_00000005" / "trainer.pt").exists()

    status = cli(ray_head, "status", submission)
    assert status.returncode == 0 and f"{submission}: SUCCEEDED" in status.stdout
    assert "orchestrator run jobs/convnet.yaml --set train.steps=5" in status.stdout
    listing = cli(ray_head, "list")
    row = next(line for line in listing.stdout.splitlines() if submission in line)
    assert "SUCCEEDED" in row and "convnet-digits" in row
    logs = cli(ray_head, "logs", submission)
    assert logs.returncode == 0 and "succeeded: 5 steps" in logs.stdout


@pytest.mark.timeout(300)
def test_submit_wait_exits_nonzero_with_the_reason_when_the_job_fails(ray_head, tmp_path):
    # a parquet dataset with one file cannot feed two ranks: the workers fail at load time
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "data"
    data.mkdir()
    images = np.zeros((16, 64), dtype=np.float32)
    pq.write_table(
        pa.table(
            {
                "image": pa.array(list(images), type=pa.list_(pa.float32())),
                "label": pa.array(np.arange(16) % 10),
            }
        ),
        data / "part-0.parquet",
    )
    result = cli(
        ray_head,
        "submit",
        SPEC,
        "--wait",
        "--set",
        f"checkpoint.storage={tmp_path}",
        "--set",
        "data.source=parquet",
        "--set",
        f"data.path={data}",
        "--set",
        "data.in_channels=1",
        "--set",
        "data.image_size=8",
    )
    assert result.returncode == 1
    # the driver's one-line reason, in the job's log: whichever rank failed first
    assert re.search(
        r"error: convnet-digits: rank [01]: parquet: '"
        + re.escape(str(data))
        + r"' has 1 file\(s\) but there are 2 ranks; each rank needs at least one file",
        result.stdout,
    ), result.stdout[-2000:]
    assert "error: job " in result.stderr and "failed" in result.stderr


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "entrypoint", [["orchestrator", "run", SPEC], ["./" + SPEC]], ids=["orchestrator-run", "executable-spec"]
)
def test_plain_ray_job_submit(ray_head, tmp_path, entrypoint):
    ray = str(Path(sys.executable).parent / "ray")
    command = [
        ray,
        "job",
        "submit",
        "--address",
        ray_head.dashboard,
        "--working-dir",
        ".",
        "--",
        *entrypoint,
        "--set",
        "train.steps=5",
        "--set",
        f"checkpoint.storage={tmp_path}",
        *ONE_WORKER,
    ]
    result = subprocess.run(
        command, cwd=ROOT, env={**os.environ, **ray_head.env}, capture_output=True, text=True, timeout=280
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "succeeded: 5 steps" in output  # the orchestrator's summary line, from the job's log
    assert (tmp_path / "convnet-digits" / "checkpoint_00000005").is_dir()


@pytest.mark.timeout(240)
def test_stop_ends_a_running_job(ray_head, tmp_path):
    submission = job_id("stop-me")
    result = cli(
        ray_head,
        "submit",
        SPEC,
        "--id",
        submission,
        "--set",
        "train.steps=100000",
        "--set",
        f"checkpoint.storage={tmp_path}",
        *ONE_WORKER,
    )
    assert result.returncode == 0 and result.stdout.strip() == submission
    deadline = time.time() + 180  # stop it once its driver is up and starting the workers
    while "worker(s) on Ray cluster" not in cli(ray_head, "logs", submission).stdout:
        assert time.time() < deadline, cli(ray_head, "logs", submission).stdout[-2000:]
        time.sleep(1)
    stopped = cli(ray_head, "stop", submission)
    assert stopped.returncode == 0 and f"{submission}: STOPPED" in stopped.stdout
    assert f"{submission}: STOPPED" in cli(ray_head, "status", submission).stdout
    logs = cli(ray_head, "logs", submission).stdout
    assert "error: convnet-digits: stopped (SIGTERM)" in logs, logs[-2000:]  # a clean exit


def test_unknown_job_id_is_a_usage_error(ray_head):
    for command in ("status", "logs", "stop"):
        result = cli(ray_head, command, "no-such-job")
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip() == (
            "error: no job 'no-such-job' on this cluster; `orchestrator list` shows them"
        )


def test_a_missing_token_says_what_to_do(ray_head, tmp_path):
    # no token anywhere Ray looks: not in the environment, not in ~/.ray/auth_token
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env.update(HOME=str(tmp_path), PYTHONPATH=str(ROOT))
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator", "list", "--address", ray_head.dashboard],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    line = result.stderr.strip()
    assert line.startswith(f"error: the Ray cluster at {ray_head.dashboard} requires an auth token")
    assert "ray get-auth-token" in line and "RAY_AUTH_TOKEN" in line and "\n" not in line

    wrong = cli(ray_head, "list", env={"RAY_AUTH_TOKEN": "not-the-token"})
    assert wrong.returncode == 1 and "rejected this machine's auth token" in wrong.stderr
