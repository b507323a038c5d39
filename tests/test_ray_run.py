"""`orchestrator run` on a real Ray cluster: DDP, checkpoints in storage, resume, worker failure.

Most tests join the session's `ray start --head` cluster (token auth on) with --address; one
runs without an address, so the driver starts and stops a local cluster of its own.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from core.metrics_log import read_metrics
from tests.conftest import ROOT, run_cli
from tests.proc_threads import busy_thread_policies, someone_else_busy
from workers.checkpoint import incomplete_reason

SPEC = "jobs/convnet.yaml"  # 2 workers, DDP, digits: loads instantly
# where a test is not about the ranks: half the CPU of a start on the 2 cores
ONE_WORKER = "resources.num_workers=1"


def run(head, storage, *overrides, summary=None, env=None, address=True, timeout=240):
    args = ["run", SPEC, "--set", f"checkpoint.storage={storage}"]
    for override in overrides:
        args += ["--set", override]
    if address:
        args += ["--address", head.address]
    if summary:
        args += ["--summary", str(summary)]
    return run_cli(*args, env={**head.env, **(env or {})}, timeout=timeout)


def train_steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in read_metrics(str(run_dir)) if "loss" in r]


def wait_for_no_training_worker(head, timeout: float = 120) -> None:
    """Until no Ray Train worker process is left on the cluster of `head` (the `ray start` of
    this machine's one-node test cluster, whose raylet starts every worker process)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        descendants = psutil.Process(head.process.pid).children(recursive=True)
        workers = [p for p in descendants if "ray::RayTrainWorker" in " ".join(_cmdline(p))]
        if not workers:
            return
        time.sleep(0.5)
    raise AssertionError(f"a training worker outlived its run by {timeout:.0f} s")


def gives_way(pid: int, within: float = 15.0) -> tuple[set[int], dict[int, int]]:
    """The policies of the busy threads of a rank that should be giving way, once they are
    SCHED_IDLE or after `within` seconds (it looks at the others every second)."""
    deadline = time.time() + within
    while True:
        policies, used = busy_thread_policies(pid, seconds=1.0)
        if policies == {os.SCHED_IDLE} or time.time() > deadline:
            return policies, used


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:  # it ended meanwhile
        return []


def checkpoints(run_dir: Path) -> list[str]:
    return sorted(p.name for p in run_dir.glob("checkpoint_*") if p.is_dir())


@pytest.mark.timeout(420)
def test_ddp_job_checkpoints_to_storage_and_resumes(ray_head, tmp_path):
    common = ["checkpoint.every_steps=5", "metrics.log_every=5"]
    first = run(ray_head, tmp_path, "train.steps=10", *common, summary=tmp_path / "first.json")
    assert first.returncode == 0, first.stderr[-3000:]
    summary = json.loads((tmp_path / "first.json").read_text())
    run_dir = tmp_path / "convnet-digits"
    assert summary["status"] == "succeeded" and summary["steps"] == 10
    assert summary["world_size"] == 2 and summary["restarts"] == 0
    assert summary["checkpoint"] == str(run_dir / "checkpoint_00000010")
    assert checkpoints(run_dir) == ["checkpoint_00000005", "checkpoint_00000010"]
    # both ranks' parts were merged into one directory in storage
    last = run_dir / "checkpoint_00000010"
    assert {p.name for p in last.glob("*.distcp")} == {"__0_0.distcp", "__1_0.distcp"}
    assert (last / ".metadata").exists() and (last / "trainer.pt").exists()
    assert sorted(p.name for p in (last / "rng").iterdir()) == ["rank_00000.pt", "rank_00001.pt"]
    assert "workers: rank 0 pid" in first.stdout and "step 10/10" in first.stdout

    again = run(ray_head, tmp_path, "train.steps=20", *common, summary=tmp_path / "again.json")
    assert again.returncode == 0, again.stderr[-3000:]
    summary = json.loads((tmp_path / "again.json").read_text())
    assert "resuming at step 10" in again.stdout and "step 5/" not in again.stdout
    assert summary["steps"] == 20 and summary["resumed_from_step"] == 10
    assert checkpoints(run_dir) == [
        "checkpoint_00000010",
        "checkpoint_00000015",
        "checkpoint_00000020",
    ]  # checkpoint.keep: 3
    assert train_steps(run_dir) == [5, 10, 15, 20]


@pytest.mark.timeout(420)
def test_a_resume_reports_the_checkpoints_step_not_the_last_logged_one(ray_head, tmp_path):
    """Checkpoint at step 3, logged steps 4 and 6: resuming from step 3 says 3 (the log it
    restores holds no step at all yet)."""
    common = ["checkpoint.every_steps=3", "metrics.log_every=4", ONE_WORKER]
    first = run(ray_head, tmp_path, "train.steps=6", *common)
    assert first.returncode == 0, first.stderr[-3000:]
    resume = tmp_path / "convnet-digits" / "checkpoint_00000003"
    again = run(
        ray_head,
        tmp_path,
        "train.steps=6",
        *common,
        f"checkpoint.resume={resume}",
        summary=tmp_path / "s.json",
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming at step 3" in again.stdout, again.stdout[-2000:]
    assert json.loads((tmp_path / "s.json").read_text())["resumed_from_step"] == 3


def _read_until(process, pattern: str, lines: list, deadline: float) -> str:
    while time.time() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        if pattern in line:
            return line
    raise AssertionError(f"never saw {pattern!r}; output:\n{''.join(lines)[-3000:]}")


@pytest.mark.timeout(420)
def test_killed_worker_restarts_from_last_checkpoint(ray_head, tmp_path):
    steps = 600  # long enough to still be training after the kill, even on a fast machine
    args = [
        sys.executable,
        "-m",
        "orchestrator",
        "run",
        SPEC,
        "--address",
        ray_head.address,
        "--summary",
        str(tmp_path / "summary.json"),
    ]
    for override in [
        f"checkpoint.storage={tmp_path}",
        f"train.steps={steps}",
        "checkpoint.every_steps=40",
        "metrics.log_every=20",
        "fault_tolerance.max_failures=1",
        "train.eval_every=null",
    ]:
        args += ["--set", override]
    env = {**os.environ, "PYTHONPATH": str(ROOT), **ray_head.env}
    process = subprocess.Popen(
        args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []
    try:
        deadline = time.time() + 300
        workers = _read_until(process, "workers: rank 0 pid", lines, deadline)
        victim = int(workers.split("rank 1 pid ")[1].split()[0])
        # training on the CPU on the head gives way to a busy shell (workers/cpu_priority.py),
        # by the kernel's account
        with someone_else_busy(seconds=0):
            _read_until(process, "checkpoint at step 40", lines, deadline)
            cmdline = Path(f"/proc/{victim}/cmdline").read_bytes()
            assert b"ray::" in cmdline, cmdline  # a Ray worker process, not something else
            policies, used = gives_way(victim)
            assert policies == {os.SCHED_IDLE}, used
        os.kill(victim, signal.SIGKILL)
        rest, _ = process.communicate(timeout=300)
        lines.append(rest)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = "".join(lines)
    assert process.returncode == 0, output[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["restarts"] == 1, output[-3000:]
    assert summary["steps"] == summary["total_steps"] == steps  # what an undisturbed run does
    assert "restart 1: workers:" in output and "restarted from the checkpoint at step" in output
    # the log as of the checkpoint was kept and continued: every step once, none lost
    assert train_steps(tmp_path / "convnet-digits") == list(range(20, steps + 1, 20))


@pytest.mark.timeout(300)
def test_local_cluster_run_fails_on_nan_and_keeps_the_last_good_checkpoint(ray_head, tmp_path):
    # no --address: the driver starts a private local Ray and stops it again; a huge weight
    # decay blows the weights up after the step-1 checkpoint
    result = run(
        ray_head,
        tmp_path,
        "train.steps=10",
        "checkpoint.every_steps=1",
        "metrics.log_every=1",
        ONE_WORKER,
        "optimizer.lr=10",  # decoupled weight decay multiplies each weight by 1 - 10 x 10 per step
        "optimizer.weight_decay=10",
        address=False,
        summary=tmp_path / "summary.json",
        env={"HOME": str(tmp_path)},
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert "local Ray" in result.stdout
    reason = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert reason and "loss is not finite" in reason[-1], result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed"
    bad_step = int(reason[-1].rsplit("step ", 1)[1])
    newest = tmp_path / "convnet-digits" / checkpoints(tmp_path / "convnet-digits")[-1]
    assert newest.name == f"checkpoint_{bad_step - 1:08d}"  # the last good step was kept
    assert incomplete_reason(str(newest)) is None


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "storage",
    [
        "{tmp}/a-file/runs",  # a path under a regular file: cannot be created
        "s3://bucket/runs?endpoint_override=127.0.0.1:9&scheme=http",  # nothing listens there
    ],
)
def test_unusable_storage_fails_before_any_worker_starts(ray_head, tmp_path, storage):
    (tmp_path / "a-file").write_text("not a directory")
    storage = storage.format(tmp=tmp_path)
    result = run(
        ray_head,
        storage,
        env={"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", "AWS_EC2_METADATA_DISABLED": "true"},
    )
    assert result.returncode == 1
    assert "error: convnet-digits: checkpoint storage '" in result.stderr
    assert storage.split("?")[0] in result.stderr and "is not writable" in result.stderr
    assert "workers:" not in result.stdout and "Traceback" not in result.stderr


def test_spec_errors_exit_2_before_touching_a_cluster(ray_head, tmp_path):
    result = run(ray_head, tmp_path, "train.steps=0")
    assert result.returncode == 2 and "train.steps: 0 is out of range" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_dashboard_address_is_explained(ray_head, tmp_path):
    result = run_cli(
        "run",
        SPEC,
        "--set",
        f"checkpoint.storage={tmp_path}",
        "--address",
        ray_head.dashboard,
        env=ray_head.env,
    )
    assert result.returncode == 1
    assert "is a dashboard (Jobs API) address" in result.stderr
    assert "orchestrator submit" in result.stderr


@pytest.mark.timeout(120)
def test_joining_a_token_cluster_without_the_token_says_what_to_do(ray_head, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env.update(HOME=str(tmp_path), PYTHONPATH=str(ROOT))  # no ~/.ray/auth_token either
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "run",
            SPEC,
            "--address",
            ray_head.address,
            "--set",
            f"checkpoint.storage={tmp_path}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"error: convnet-digits: the Ray cluster at {ray_head.address} requires"
        " an auth token and none was found"
    )
    assert "ray get-auth-token" in last and "Traceback" not in result.stderr
    # a token the cluster does not know: refused in one line too (both asked once, at once)
    wrong = subprocess.run(
        result.args,
        cwd=ROOT,
        env={**env, "RAY_AUTH_TOKEN": "not-the-token"},
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert wrong.returncode == 1 and "Traceback" not in wrong.stderr
    assert f"the Ray cluster at {ray_head.address} rejected this machine's auth token" in wrong.stderr


@pytest.mark.timeout(600)
def test_resume_takes_the_newest_complete_checkpoint_in_storage(ray_head, tmp_path):
    """The driver is SIGKILLed right after a checkpoint lands; the next run resumes from that
    checkpoint (whatever Ray's own index had registered). Then the newest checkpoint is
    corrupted: the run after that falls back to the one before, and says why."""
    args = [sys.executable, "-m", "orchestrator", "run", SPEC, "--address", ray_head.address]
    for override in [
        f"checkpoint.storage={tmp_path}",
        "train.steps=5000",
        "checkpoint.every_steps=20",
        "checkpoint.keep=10",
        "metrics.log_every=20",
        "train.eval_every=null",
        ONE_WORKER,
    ]:
        args += ["--set", override]
    env = {**os.environ, "PYTHONPATH": str(ROOT), **ray_head.env}
    process = subprocess.Popen(
        args,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    try:
        _read_until(process, "checkpoint at step 60", lines, time.time() + 300)
        os.killpg(process.pid, signal.SIGKILL)  # the driver and everything it started
        process.wait(60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    # Ray ends the run's workers once their owner is gone; until then they train and save on
    run_dir = tmp_path / "convnet-digits"
    wait_for_no_training_worker(ray_head)
    newest = max(
        int(name.split("_")[1])
        for name in checkpoints(run_dir)
        if (run_dir / name / "trainer.pt").exists() and (run_dir / name / ".metadata").exists()
    )
    assert newest >= 60

    again = run(
        ray_head,
        tmp_path,
        f"train.steps={newest + 20}",
        "checkpoint.every_steps=20",
        "checkpoint.keep=10",
        "metrics.log_every=20",
        ONE_WORKER,
        summary=tmp_path / "again.json",
    )
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    summary = json.loads((tmp_path / "again.json").read_text())
    assert summary["resumed_from"]["checkpoint"] == str(run_dir / f"checkpoint_{newest:08d}")
    assert f"resuming at step {newest}" in again.stdout and summary["steps"] == newest + 20

    final = run_dir / f"checkpoint_{newest + 20:08d}"
    shard = sorted(final.glob("*.distcp"))[0]
    shard.write_bytes(shard.read_bytes()[:100])  # a write cut short
    third = run(
        ray_head,
        tmp_path,
        f"train.steps={newest + 40}",
        "checkpoint.every_steps=20",
        "checkpoint.keep=10",
        "metrics.log_every=20",
        ONE_WORKER,
        summary=tmp_path / "third.json",
    )
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    resumed = json.loads((tmp_path / "third.json").read_text())["resumed_from"]
    assert resumed["checkpoint"] == str(run_dir / f"checkpoint_{newest:08d}") and resumed["step"] == newest
    [skipped] = resumed["skipped"]
    assert skipped["checkpoint"] == final.name
    assert skipped["reason"].startswith(f"shard {shard.name} is truncated (100 of ")
    assert f"skipped {final.name}: shard {shard.name} is truncated" in third.stdout
    assert f"resuming at step {newest}" in third.stdout
