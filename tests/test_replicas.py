"""Replica groups (workers/replicas.py) on torchft's real lighthouse and gloo: two groups of one
process (tests/replicas_worker.py) train as one; a job's groups under torchrun train on through
one killed with SIGKILL, and a new group heals from the other, as the metrics log and the
groups' own summaries show."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.testing.replica_groups import kill_tree, torchrun_group

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "replicas_worker.py"


def start_lighthouse(min_replicas: int):
    from torchft.coordination import LighthouseServer

    return LighthouseServer(bind="[::]:0", min_replicas=min_replicas, join_timeout_ms=2000)


@pytest.fixture
def lighthouse():
    """A lighthouse whose quorum may be one group: the others may be lost."""
    server = start_lighthouse(1)
    try:
        yield server.address()
    finally:
        server.shutdown()


def start_group(group: int, steps: int, out: Path, lighthouse: str) -> subprocess.Popen:
    env = {**os.environ, "TORCHFT_LIGHTHOUSE": lighthouse}
    log = open(out.with_suffix(".stderr"), "a")
    command = [sys.executable, str(WORKER), str(group), str(steps), str(out)]
    return subprocess.Popen(command, env=env, stderr=log)


def lines(out: Path) -> list[dict]:
    if not out.exists():
        return []
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def wait_for(predicate, what: str, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, what
        time.sleep(0.1)


def finish(proc: subprocess.Popen, out: Path) -> None:
    assert proc.wait(timeout=180) == 0, out.with_suffix(".stderr").read_text()[-3000:]


def committed_steps(records: list[dict]) -> list[int]:
    return [r["step"] for r in records if r.get("committed")]


def healed_steps(records: list[dict]) -> list[int]:
    return max((r["healed_at"] for r in records if "healed_at" in r), key=len, default=[])


def final_weights(records: list[dict]) -> list[float]:
    [final] = [r["final"] for r in records if "final" in r]
    return final


def test_two_groups_train_as_one_and_end_with_the_same_weights(tmp_path):
    server = start_lighthouse(2)  # every quorum has both groups: each step is a step of both
    outs = [tmp_path / f"group{g}.jsonl" for g in (0, 1)]
    try:
        procs = [start_group(g, 30, outs[g], server.address()) for g in (0, 1)]
        for proc, out in zip(procs, outs):
            finish(proc, out)
    finally:
        server.shutdown()
    records = [lines(out) for out in outs]
    for group in records:
        assert committed_steps(group) == list(range(1, 31))  # each step once, none lost
        assert healed_steps(group) in ([], [0])  # at step 0 torchft may sync the initial weights
        assert {r["participants"] for r in group if r.get("committed")} == {2}
    leaders: dict[int, int] = {}
    for group in records:
        for r in group:
            if r.get("committed"):
                leaders[r["step"]] = leaders.get(r["step"], 0) + r["leads"]
    assert set(leaders.values()) == {1}  # each step, one group leads (writes the job's log)
    assert final_weights(records[0]) == pytest.approx(final_weights(records[1]), abs=1e-6)


# -- a job's replica groups under torchrun (workers/run.py, one torchrun per group) ----------

JOB_STEPS = 200  # at 0.3 s a step until the test says go: a minute to act in


def start_torchrun_group(group: int, tmp_path: Path, lighthouse: str, faults: Path, log: str, procs: int):
    """Group `group` of two, of `procs` processes: DDP inside a group of one, FSDP2 inside a
    larger one (HSDP: each rank's shard averaged with the same shard of the other group)."""
    sets = [
        "fault_tolerance.replica_groups=2",
        f"resources.num_workers={2 * procs}",
        f"parallel.strategy={'ddp' if procs == 1 else 'fsdp2'}",
        f"train.steps={JOB_STEPS}",
        "train.eval_every=100",
        "metrics.log_every=1",
        "checkpoint.every_steps=100",
        f"checkpoint.storage={tmp_path / 'runs'}",
        "name=groups",
    ]
    summary = tmp_path / f"group{group}-{time.monotonic_ns()}.json"
    return torchrun_group(group, sets, summary, lighthouse, faults, tmp_path / log, procs)  # paced until go


def shown_step(log: Path) -> int:
    """The newest step a group's progress line shows (its rank 0 prints one every second or so)."""
    shown = re.findall(r"\[groups\] step (\d+)/", log.read_text()) if log.exists() else []
    return int(shown[-1]) if shown else 0


@pytest.mark.parametrize("procs", [1, 2], ids=["ddp-groups-of-1", "hsdp-groups-of-2"])
def test_a_job_trains_on_through_a_killed_group_and_a_new_group_heals_from_the_other(
    tmp_path, lighthouse, procs
):
    from core.metrics_log import read_metrics

    faults = tmp_path / "faults"
    faults.mkdir()
    (faults / "groups").write_text("paced=0.3\n")  # slow, whatever the machine, until go
    run = str(tmp_path / "runs" / "groups")

    def steps() -> list[int]:
        try:
            return [r["step"] for r in read_metrics(run) if "loss" in r]
        except (FileNotFoundError, OSError):
            return []

    # group 1 starts first and leads; group 0 joins a few steps later and heals from it, then
    # group 1 dies: group 0 leads on, and the log must still hold the records of the steps
    # before it joined that group 1 had not finished when it sent its state
    doomed = start_torchrun_group(1, tmp_path, lighthouse, faults, "group1.log", procs)
    survivor, replacement = None, None
    first = tmp_path / "group0.log"
    try:
        wait_for(lambda: shown_step(tmp_path / "group1.log") >= 3, "group 1 showed no step 3")
        survivor = start_torchrun_group(0, tmp_path, lighthouse, faults, "group0.log", procs)
        wait_for(lambda: first.exists() and "group 0 healed from" in first.read_text(), "group 0 not healed")
        joined = int(re.search(r"group 0 healed from a peer at step (\d+)", first.read_text()).group(1))
        wait_for(lambda: shown_step(tmp_path / "group1.log") >= joined + 2, "group 1 stopped training")
        kill_tree(doomed)  # the leading group's torchrun and its workers, at once, seconds after
        doomed.wait()
        at_kill = shown_step(first)
        wait_for(lambda: shown_step(first) >= at_kill + 5, "the other group stopped training")
        replacement = start_torchrun_group(1, tmp_path, lighthouse, faults, "group1-new.log", procs)
        healed = tmp_path / "group1-new.log"
        wait_for(lambda: "group 1 healed from a peer" in healed.read_text(), "not healed", timeout=180)
        (faults / "groups.go").write_text("")
        assert survivor.wait(timeout=300) == 0, (tmp_path / "group0.log").read_text()[-3000:]
        assert replacement.wait(timeout=300) == 0, healed.read_text()[-3000:]
    finally:
        for proc in (survivor, doomed, replacement):
            if proc is not None and proc.poll() is None:
                kill_tree(proc)
    assert steps() == list(range(1, JOB_STEPS + 1))  # each step once: none lost, none repeated
    healed_steps = re.findall(r"group 1 healed from a peer at step (\d+)", healed.read_text())
    [healed_at] = set(healed_steps)  # every rank of the group at the same step
    assert len(healed_steps) == procs
    assert int(healed_at) >= at_kill + 5  # it joined at the survivor's step, not from a checkpoint
    summaries = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("group*.json"))]
    # the survivor's and the replacement's; the killed group never ended
    assert [(s["status"], s["steps"]) for s in summaries] == [("succeeded", JOB_STEPS)] * 2
    assert (tmp_path / "runs" / "groups" / f"checkpoint_{JOB_STEPS:08d}" / "trainer.pt").is_file()
    assert summaries[0]["eval"] == summaries[1]["eval"]  # the same model in both groups at the end
    survivor_summary, replacement_summary = (s["replica_group"] for s in summaries)
    assert survivor_summary["group"] == 0 and survivor_summary["steps_degraded"] >= 5  # alone after the kill
    assert survivor_summary["healed_at"] == [joined]  # it joined the first group, which led until killed
    assert replacement_summary["healed_at"] == [int(healed_at)] and replacement_summary["groups"] == 2


def test_fp16_groups_skip_the_same_steps_and_end_with_the_same_model(tmp_path):
    """fp16 under torchrun, two groups of one process: the gradients are averaged over the
    groups before the loss scaler looks at them, so every group's scaler skips the same steps
    (an overflow halves its scale) and the groups never part. Both in every quorum."""
    server = start_lighthouse(2)
    faults = tmp_path / "faults"
    faults.mkdir()
    sets = [
        "fault_tolerance.replica_groups=2",
        "resources.num_workers=2",
        "precision.dtype=fp16",
        "train.steps=40",
        "metrics.log_every=10",
        "checkpoint.every_steps=1000",
        f"checkpoint.storage={tmp_path / 'runs'}",
        "name=fp16",
    ]
    try:
        lighthouse = server.address()
        procs = [
            torchrun_group(g, sets, tmp_path / f"group{g}.json", lighthouse, faults, tmp_path / f"g{g}.log")
            for g in (0, 1)
        ]
        for g, proc in enumerate(procs):
            assert proc.wait(timeout=300) == 0, (tmp_path / f"g{g}.log").read_text()[-3000:]
    finally:
        server.shutdown()
    first, second = (json.loads((tmp_path / f"group{g}.json").read_text()) for g in (0, 1))
    assert (first["status"], first["steps"]) == (second["status"], second["steps"]) == ("succeeded", 40)
    assert first["loss_scale"] == second["loss_scale"] < 2.0**16  # steps skipped, the same in both
    assert first["eval"] == second["eval"]  # the same model in both groups at the end
