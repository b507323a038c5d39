"""Faults in checkpoint storage on a real Ray cluster (the session's `ray_head`): stray folders
never count towards `checkpoint.keep`, a checkpoint a person deleted does not stop the job, and
a shard whose bytes changed is skipped for the newest intact checkpoint. The same in one
process and under torchrun: test_checkpoint_faults.py.
"""

import json
import shutil
import time
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.test_checkpoint_faults import COMMON, SPEC, checkpoints, make_strays, scramble


def ray_run(head, storage, *overrides, summary=None, timeout=240):
    args = ["run", str(SPEC), "--address", head.address, "--set", f"checkpoint.storage={storage}"]
    for override in [*COMMON, *overrides]:
        args += ["--set", override]
    if summary:
        args += ["--summary", str(summary)]
    result = run_cli(*args, env=head.env, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result, json.loads(Path(summary).read_text()) if summary else None


STRAYS_RUN = ("checkpoint.keep=2", "resources.num_workers=1")  # one rank is enough: half the CPU


@pytest.mark.timeout(600)
def test_on_ray_strays_never_count_and_a_checkpoint_deleted_by_hand_does_not_stop_the_job(ray_head, tmp_path):
    run_dir = tmp_path / "convnet-digits"
    ray_run(ray_head, tmp_path, "train.steps=10", *STRAYS_RUN)
    strays = make_strays(run_dir)
    _, summary = ray_run(ray_head, tmp_path, "train.steps=20", *STRAYS_RUN, summary=tmp_path / "2.json")
    assert summary["resumed_from"]["step"] == 10
    assert checkpoints(run_dir) == sorted(["checkpoint_00000015", "checkpoint_00000020", *strays])
    assert {item["checkpoint"] for item in summary["checkpoints_left"]} == set(strays)

    # a person removes the newest checkpoint (say it was damaged): Ray had registered it
    shutil.rmtree(run_dir / "checkpoint_00000020")
    third, summary = ray_run(ray_head, tmp_path, "train.steps=25", *STRAYS_RUN, summary=tmp_path / "3.json")
    assert summary["resumed_from"]["step"] == 15 and summary["steps"] == 25
    assert "resuming at step 15" in third.stdout
    assert checkpoints(run_dir) == sorted(["checkpoint_00000020", "checkpoint_00000025", *strays])


@pytest.mark.timeout(600)
def test_on_ray_a_shard_with_other_bytes_is_skipped_for_the_newest_intact_checkpoint(ray_head, tmp_path):
    run_dir = tmp_path / "convnet-digits"
    ray_run(ray_head, tmp_path, "train.steps=10")
    shard = run_dir / "checkpoint_00000010" / "__1_0.distcp"  # rank 1's part
    scramble(shard)
    started = time.time()
    result, summary = ray_run(ray_head, tmp_path, "train.steps=15", summary=tmp_path / "s.json")
    reason = "__1_0.distcp does not match the checksum recorded at save time"
    assert f"skipped checkpoint_00000010: {reason}" in result.stdout, result.stdout[-3000:]
    assert "resuming at step 5" in result.stdout
    resumed = summary["resumed_from"]
    assert resumed["checkpoint"] == str(run_dir / "checkpoint_00000005") and summary["steps"] == 15
    assert resumed["verified"] is True and 0 <= resumed["check_s"] < time.time() - started
    size = sum(p.stat().st_size for p in (run_dir / "checkpoint_00000005").rglob("*") if p.is_file())
    print(f"bit rot: resumed from step 5 of 10, {resumed['check_s'] * 1e3:.1f} ms to choose ({size} bytes)")
