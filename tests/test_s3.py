"""Checkpoints, the metrics log, TensorBoard and the commands that read them, on a real S3 API
server (moto_server, `orchestrator/testing/s3_server.py`), as they run on object storage: one
process, no Ray (the jobs on the cluster with S3 storage are in tests/test_cluster.py and
test_service.py; the job store on S3 in tests/test_head_restart.py).

What is counted comes from the bucket itself: the objects under each checkpoint, their bytes,
and what TensorBoard's own reader finds there.
"""

import os

import pytest
import torch

from core.metrics_log import read_metrics
from core.spec import load_spec
from tests.conftest import ROOT, run_cli
from workers.checkpoint_files import MANIFEST_FILE, damage_reason, incomplete_reason
from workers.context import LocalContext
from workers.run import train

SPEC = ROOT / "jobs/convnet.yaml"  # the convnet on 8x8 digits
ONE_PROCESS = ["resources.num_workers=1", "parallel.strategy=none", "train.eval_every=null"]


def train_on(storage: str, *overrides: str) -> dict:
    spec = load_spec(SPEC, [*ONE_PROCESS, f"checkpoint.storage={storage}", *overrides])
    ctx = LocalContext(spec)
    try:
        return train(spec, ctx)
    finally:
        ctx.teardown()


def checkpoint_names(s3, *parts) -> list[str]:
    return sorted({path.split("/")[0] for path in s3.files(*parts) if path.startswith("checkpoint_")})


def rot(s3, *parts) -> None:
    """The same number of other bytes in an object: what bit rot leaves."""
    fs, path = s3.fs(), "/".join(["orchestrator-tests", *parts])
    size = fs.get_file_info(path).size
    with fs.open_output_stream(path) as out:
        out.write(os.urandom(size))


def test_checkpoints_on_s3_resume_skip_damage_and_are_pruned_to_keep(s3):
    runs = s3.uri("one-process")
    run = f"{runs}/convnet-digits"
    first = train_on(runs, "train.steps=10", "checkpoint.every_steps=5", "checkpoint.keep=2")
    assert first["status"] == "succeeded" and first["checkpoint"] == f"{run}/checkpoint_00000010"
    saved = checkpoint_names(s3, "one-process", "convnet-digits")
    assert saved == ["checkpoint_00000005", "checkpoint_00000010"]
    objects = s3.files("one-process", "convnet-digits", "checkpoint_00000010")
    assert {"trainer.pt", MANIFEST_FILE, ".metadata", "rng/rank_00000.pt"} <= set(objects)
    assert incomplete_reason(first["checkpoint"]) is None and damage_reason(first["checkpoint"]) is None

    # a stray folder (a crash, a person) and bit rot in the newest checkpoint
    stray = "orchestrator-tests/one-process/convnet-digits/checkpoint_00000900/x"
    with s3.fs().open_output_stream(stray) as out:
        out.write(b"half")
    shard = next(name for name in objects if name.endswith(".distcp"))
    rot(s3, "one-process", "convnet-digits", "checkpoint_00000010", shard)

    second = train_on(runs, "train.steps=20", "checkpoint.every_steps=5", "checkpoint.keep=2")
    resumed = second["resumed_from"]
    assert resumed["step"] == 5 and resumed["verified"] is True  # the newest intact one
    assert resumed["skipped"][-1] == {
        "checkpoint": "checkpoint_00000010",
        "reason": f"{shard} does not match the checksum recorded at save time",
    }
    # pruned to the 2 newest complete ones; the stray stays where it is and never counts
    assert checkpoint_names(s3, "one-process", "convnet-digits") == [
        "checkpoint_00000015",
        "checkpoint_00000020",
        "checkpoint_00000900",
    ]
    steps = [r["step"] for r in read_metrics(run) if "loss" in r]
    assert steps == sorted(set(steps)) and steps[-1] == 20  # each step once, the rolled-back ones redone


def test_the_metrics_log_tensorboard_metrics_plot_and_export_read_from_s3(s3, tmp_path):
    runs = s3.uri("readers")
    run = f"{runs}/convnet-digits"
    summary = train_on(
        runs, "train.steps=20", "checkpoint.every_steps=10", "metrics.log_every=2", "metrics.tensorboard=true"
    )
    assert summary["status"] == "succeeded"
    logged = [r["step"] for r in read_metrics(run) if "loss" in r]
    assert logged == list(range(2, 21, 2))

    # TensorBoard's files are beside the checkpoints in the bucket, and its own reader (boto3,
    # the same AWS_* settings) finds the training curve there
    events = [name for name in s3.files("readers", "convnet-digits", "tensorboard") if "tfevents" in name]
    assert events, s3.files("readers", "convnet-digits")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(f"{run}/tensorboard")
    board.Reload()
    assert [event.step for event in board.Scalars("train/loss")] == logged

    table = run_cli("metrics", "convnet-digits", "--storage", runs, "--tail", "3")
    assert table.returncode == 0, table.stderr
    assert "convnet-digits: last 3 of 11 records, steps 18-20" in table.stdout  # 10 logged, the final eval
    plot = run_cli("plot", run, "--out", str(tmp_path / "curves.png"))
    assert plot.returncode == 0, plot.stderr
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"

    out = tmp_path / "model.safetensors"
    export = run_cli("export", summary["checkpoint"], "--out", str(out))
    assert export.returncode == 0, export.stderr
    from safetensors.torch import load_file

    from workers import data, models

    spec = load_spec(SPEC, ONE_PROCESS)
    model = models.build(spec.model, data.load(spec.data, seed=0).info)
    model.load_state_dict(load_file(out), strict=True)
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_a_missing_run_on_s3_is_one_line_and_exit_2(s3):
    result = run_cli("metrics", "nope", "--storage", s3.uri("nowhere"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"error: no metrics for 'nope' under {s3.uri('nowhere')}")


@pytest.mark.parametrize("threads", [1, 8])
def test_an_upload_sends_every_file_whole_however_many_go_at_once(s3, tmp_path, threads, monkeypatch):
    from workers import checkpoint_upload

    monkeypatch.setattr(checkpoint_upload, "UPLOAD_THREADS", threads)
    local = tmp_path / "part"
    (local / "rng").mkdir(parents=True)
    sizes = {"big.distcp": 23 << 20, "small.distcp": 10, "rng/rank_00000.pt": 3000, "empty": 0}
    for name, size in sizes.items():
        (local / name).write_bytes(os.urandom(size))
    where = f"orchestrator-tests/upload-{threads}/checkpoint_00000001"
    sent = checkpoint_upload.upload(local, s3.fs(), where)
    assert sent == sum(sizes.values())
    assert s3.files(f"upload-{threads}", "checkpoint_00000001") == sizes
    with s3.fs().open_input_stream(f"{where}/big.distcp") as src:
        assert src.read() == (local / "big.distcp").read_bytes()
