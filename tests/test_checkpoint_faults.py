"""Faults in checkpoint storage: stray folders beside the checkpoints, and bit rot inside them.

Stray folders (empty or half-written `checkpoint_NNNNNNNN`, left by a crash or by hand) must
never count towards `checkpoint.keep`, and the newest complete checkpoint is never deleted:
checked in all three launchers (one process and torchrun here, Ray in
test_checkpoint_faults_ray.py). A file whose bytes changed
after the save (same size, so only its checksum tells) makes resume skip that checkpoint,
naming the file, and take the newest intact one.
"""

import json
import os
from pathlib import Path

import pytest
import torch

from core.spec import load_spec
from tests.conftest import ROOT, run_cli
from workers.checkpoint_files import (
    MANIFEST_FILE,
    TRAINER_FILE,
    damage_reason,
    incomplete_reason,
    newest_valid,
)
from workers.context import LocalContext
from workers.run import train

SPEC = ROOT / "jobs/convnet.yaml"  # the convnet on 8x8 digits: loads and trains in seconds
COMMON = ["checkpoint.every_steps=5", "metrics.log_every=5", "train.eval_every=null"]
ONE_PROCESS = ["resources.num_workers=1", "parallel.strategy=none"]


def train_here(storage: Path, *overrides: str) -> dict:
    spec = load_spec(SPEC, [*ONE_PROCESS, *COMMON, f"checkpoint.storage={storage}", *overrides])
    ctx = LocalContext(spec)
    try:
        return train(spec, ctx)
    finally:
        ctx.teardown()


def checkpoints(run_dir: Path) -> list[str]:
    return sorted(p.name for p in run_dir.glob("checkpoint_*") if p.is_dir())


def make_strays(run_dir: Path) -> dict[str, str]:
    """Folders a crash or a person leaves: {name: why it is not a checkpoint}."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "checkpoint_00000001").mkdir()  # older than anything the run saves
    (run_dir / "checkpoint_00000900").mkdir()
    (run_dir / "checkpoint_00000901" / "rng").mkdir(parents=True)
    (run_dir / "checkpoint_00000901" / "rng" / "rank_00000.pt").write_bytes(b"half")
    (run_dir / "checkpoint_00000902").mkdir()
    (run_dir / "checkpoint_00000902" / TRAINER_FILE).write_bytes(b"\0" * 64)
    return {
        "checkpoint_00000001": "no trainer.pt",
        "checkpoint_00000900": "no trainer.pt",
        "checkpoint_00000901": "no trainer.pt",
        "checkpoint_00000902": "trainer.pt is unreadable",
    }


def scramble(path: Path) -> None:
    """Same size, other bytes: what bit rot or a stray write leaves."""
    path.write_bytes(os.urandom(path.stat().st_size))


# -- item 1: pruning -----------------------------------------------------------------------


@pytest.mark.parametrize("keep", [1, 3])
def test_stray_folders_never_count_towards_keep_in_one_process(tmp_path, caplog, keep):
    run_dir = tmp_path / "convnet-digits"
    strays = make_strays(run_dir)
    summary = train_here(tmp_path, "train.steps=20", f"checkpoint.keep={keep}")
    assert summary["status"] == "succeeded"
    kept = [f"checkpoint_{s:08d}" for s in (20, 15, 10)[:keep]]
    assert checkpoints(run_dir) == sorted([*kept, *strays])  # the strays stay where they were
    assert all(incomplete_reason(str(run_dir / name)) is None for name in kept)
    left = {item["checkpoint"]: item["reason"] for item in summary["checkpoints_left"]}
    assert set(left) == set(strays)
    assert all(left[name].startswith(strays[name]) for name in strays), left
    warnings = "\n".join(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert all(f"{name} left in place" in warnings for name in strays), warnings

    again = train_here(tmp_path, "train.steps=25", f"checkpoint.keep={keep}")
    assert again["resumed_from"]["step"] == 20 and again["steps"] == 25


def test_pruning_never_touches_a_checkpoint_ahead_of_the_run(tmp_path):
    """A complete checkpoint at a later step (the run resumed from an earlier one on purpose)
    belongs to another history: it is neither counted nor deleted."""
    run_dir = tmp_path / "convnet-digits"
    train_here(tmp_path, "train.steps=20", "checkpoint.keep=3")
    earlier = run_dir / "checkpoint_00000010"
    summary = train_here(tmp_path, "train.steps=15", "checkpoint.keep=1", f"checkpoint.resume={earlier}")
    assert summary["steps"] == 15
    assert checkpoints(run_dir) == ["checkpoint_00000015", "checkpoint_00000020"]
    [left] = summary["checkpoints_left"]
    assert left["checkpoint"] == "checkpoint_00000020" and "ahead of step 15" in left["reason"]


def test_a_save_still_being_written_when_an_older_one_prunes_is_not_left_in_the_summary(tmp_path):
    """Asynchronous saves: the save of step 15 becomes durable, and prunes, while step 20's is
    still being written (incomplete then). Once 20's is durable it is an ordinary checkpoint,
    not a folder pruning left in place."""
    from workers.checkpointer import Checkpointer
    from workers.context import RunContext

    run_dir = tmp_path / "convnet-digits"
    train_here(tmp_path, "train.steps=20", "checkpoint.keep=3")
    spec = load_spec(SPEC, [*COMMON, f"checkpoint.storage={tmp_path}", "checkpoint.keep=3"])
    ctx = RunContext()
    ctx.run_uri = str(run_dir)
    checkpointer = Checkpointer(spec, ctx, None, model=None, optimizer=None, scheduler=None, scaler=None)
    trainer_file = run_dir / "checkpoint_00000020" / "trainer.pt"
    trainer_file.rename(trainer_file.with_suffix(".writing"))  # not written yet
    checkpointer._durable(15, str(run_dir / "checkpoint_00000015"), 0.0)
    assert [item["checkpoint"] for item in checkpointer.left_in_place()] == ["checkpoint_00000020"]
    trainer_file.with_suffix(".writing").rename(trainer_file)  # its save is complete
    checkpointer._durable(20, str(run_dir / "checkpoint_00000020"), 0.0)
    assert checkpointer.left_in_place() == []
    assert checkpoints(run_dir) == ["checkpoint_00000010", "checkpoint_00000015", "checkpoint_00000020"]


@pytest.mark.timeout(300)
def test_stray_folders_never_count_towards_keep_under_torchrun(tmp_path):
    run_dir = tmp_path / "convnet-digits"
    strays = make_strays(run_dir)
    args = ["--standalone", "--nproc_per_node=2", "-m", "workers.run", str(SPEC)]
    for override in [*COMMON, "train.steps=10", "checkpoint.keep=1", f"checkpoint.storage={tmp_path}"]:
        args += ["--set", override]
    result = run_cli(*args, module="torch.distributed.run", timeout=280)
    assert result.returncode == 0, result.stderr[-3000:]
    assert checkpoints(run_dir) == sorted(["checkpoint_00000010", *strays])
    assert incomplete_reason(str(run_dir / "checkpoint_00000010")) is None
    assert all(f"{name} left in place" in result.stderr for name in strays), result.stderr[-3000:]


# -- item 2: integrity -----------------------------------------------------------------------


def test_every_file_of_a_checkpoint_is_in_its_manifest_with_a_checksum(tmp_path):
    train_here(tmp_path, "train.steps=5")
    checkpoint = tmp_path / "convnet-digits" / "checkpoint_00000005"
    manifest = json.loads((checkpoint / MANIFEST_FILE).read_text())
    on_disk = {
        str(p.relative_to(checkpoint))
        for p in checkpoint.rglob("*")
        if p.is_file() and p.name != MANIFEST_FILE
    }
    assert set(manifest["files"]) == on_disk
    for name, entry in manifest["files"].items():
        assert entry["size"] == (checkpoint / name).stat().st_size and len(entry["checksum"]) == 32
    assert damage_reason(str(checkpoint)) is None

    # a trainer state that still loads, with other values: only its checksum tells
    trainer = checkpoint / TRAINER_FILE
    original = trainer.read_bytes()
    state = torch.load(trainer, weights_only=True)
    torch.save({**state, "best_eval_loss": 0.5}, trainer)
    assert incomplete_reason(str(checkpoint)) is None
    assert (
        damage_reason(str(checkpoint)) == f"{TRAINER_FILE} does not match the checksum recorded at save time"
    )
    trainer.write_bytes(original)

    text = (checkpoint / MANIFEST_FILE).read_text()
    (checkpoint / MANIFEST_FILE).write_text(text.replace('"size": ', '"size": 1', 1))
    assert incomplete_reason(str(checkpoint)) == f"{MANIFEST_FILE} is damaged"
    (checkpoint / MANIFEST_FILE).unlink()  # a save that stopped right before its last file
    assert incomplete_reason(str(checkpoint)) == f"no {MANIFEST_FILE}"


def test_resume_skips_a_checkpoint_whose_bytes_changed_and_names_the_file(tmp_path, caplog):
    run_dir = tmp_path / "convnet-digits"
    train_here(tmp_path, "train.steps=10")
    shard = run_dir / "checkpoint_00000010" / "__0_0.distcp"
    scramble(shard)
    assert incomplete_reason(str(shard.parent)) is None  # sizes alone cannot tell

    summary = train_here(tmp_path, "train.steps=15")
    assert summary["status"] == "succeeded" and summary["steps"] == 15
    resumed = summary["resumed_from"]
    assert resumed["checkpoint"] == str(run_dir / "checkpoint_00000005") and resumed["step"] == 5
    reason = "__0_0.distcp does not match the checksum recorded at save time"
    assert resumed["skipped"] == [{"checkpoint": "checkpoint_00000010", "reason": reason}]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert f"skipping checkpoint_00000010: {reason}" in warnings

    scramble(run_dir / "checkpoint_00000015" / "__0_0.distcp")
    with pytest.raises(RuntimeError, match=f"is damaged: {reason}"):  # asked for by name: no fallback
        train_here(tmp_path, "train.steps=20", f"checkpoint.resume={run_dir / 'checkpoint_00000015'}")


def test_a_checkpoint_saved_without_checksums_still_resumes_unverified(tmp_path, caplog):
    """Checkpoints written before checksums were recorded: complete by the older rules,
    resumed from with a warning that their bytes cannot be checked."""
    run_dir = tmp_path / "convnet-digits"
    train_here(tmp_path, "train.steps=5")
    old = run_dir / "checkpoint_00000005"
    (old / MANIFEST_FILE).unlink()
    state = torch.load(old / TRAINER_FILE, weights_only=True)
    del state["manifest"]
    torch.save(state, old / TRAINER_FILE)
    assert incomplete_reason(str(old)) is None and damage_reason(str(old)) is None
    assert newest_valid(str(run_dir)) == (str(old), [])

    summary = train_here(tmp_path, "train.steps=10")
    assert summary["resumed_from"]["step"] == 5 and summary["resumed_from"]["verified"] is False
    assert any("saved without checksums" in r.getMessage() for r in caplog.records)
