"""The worker loop: exact resume, DDP parity with a single process, and learning for real."""

import json
import shutil

import pytest

from core.metrics_log import read_metrics
from core.spec import load_spec
from tests.conftest import ROOT, run_cli
from workers.context import LocalContext
from workers.run import train


def losses(run_dir) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(str(run_dir)) if "loss" in r}


def local_train(spec_path, tmp_path, *overrides):
    spec = load_spec(spec_path, [f"checkpoint.storage={tmp_path}", *overrides])
    return spec, train(spec, LocalContext(spec))


# a small ViT with dropout on digits: dropout makes the RNG state part of what resume must restore
VIT_DIGITS = [
    "model.family=vit",
    "model.preset=vit_micro",
    "model.overrides={dropout: 0.1}",
    "train.steps=16",
    "metrics.log_every=1",
    "checkpoint.every_steps=8",
    "parallel.strategy=none",
    "resources.num_workers=1",
    "data.batch_size=32",
    "train.eval_every=null",
]


def test_resume_reproduces_the_uninterrupted_run_exactly(tmp_path):
    spec_path = ROOT / "jobs/convnet.yaml"
    straight = tmp_path / "straight"
    spec, summary = local_train(spec_path, straight, *VIT_DIGITS)
    assert summary["status"] == "succeeded" and summary["steps"] == 16
    run_dir = straight / spec.name

    # a second run that only has the step-8 checkpoint, as if it had stopped right after it
    resumed = tmp_path / "resumed" / spec.name
    resumed.mkdir(parents=True)
    shutil.copytree(run_dir / "checkpoint_00000008", resumed / "checkpoint_00000008")
    _, summary2 = local_train(spec_path, tmp_path / "resumed", *VIT_DIGITS)
    assert summary2["steps"] == 16

    first, second = losses(run_dir), losses(resumed)
    assert sorted(second) == list(range(1, 17))  # the log holds steps 1-8 from the checkpoint
    for step in range(9, 17):
        assert second[step] == first[step], f"step {step}: {second[step]} != {first[step]}"


def test_resume_never_starts_a_new_run(tmp_path):
    overrides = [*VIT_DIGITS, "train.steps=4", "checkpoint.every_steps=2"]
    spec, first = local_train(ROOT / "jobs/convnet.yaml", tmp_path, *overrides)
    _, again = local_train(ROOT / "jobs/convnet.yaml", tmp_path, *overrides, "checkpoint.resume=never")
    assert again["steps"] == 4 and again["run"] != spec.name
    assert again["run"].startswith(spec.name + "-")
    # the first run's checkpoints are untouched, and keep=3 pruned the oldest
    assert sorted(p.name for p in (tmp_path / spec.name).glob("checkpoint_*")) == [
        "checkpoint_00000002",
        "checkpoint_00000004",
    ]


def test_nan_loss_fails_and_keeps_the_last_good_checkpoint(tmp_path):
    spec, summary = local_train(
        ROOT / "jobs/convnet.yaml",
        tmp_path,
        *VIT_DIGITS,
        "train.steps=12",
        "checkpoint.every_steps=4",
        "optimizer.lr=10",
        "train.clip_grad_norm=null",
        "optimizer.name=sgd",
    )
    if summary["status"] == "succeeded":
        pytest.fail("lr=10 with SGD and no clipping should diverge")
    assert summary["status"] == "failed" and "not finite" in summary["reason"]
    kept = sorted(p.name for p in (tmp_path / spec.name).glob("checkpoint_*"))
    assert kept, "the checkpoints written before the loss diverged must stay"


def torchrun(nproc: int, spec, *args, timeout=600):
    return run_cli(
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "workers.run",
        str(spec),
        *args,
        module="torch.distributed.run",
        timeout=timeout,
    )


def test_ddp_with_accumulation_matches_one_process_with_the_combined_batch(tmp_path):
    common = [
        "model.family=vit",
        "model.preset=vit_micro",
        "train.steps=12",
        "metrics.log_every=1",
        "data.batch_size=32",
        "train.eval_every=null",
        "train.label_smoothing=0.1",
    ]
    spec = ROOT / "jobs/convnet.yaml"
    single = run_cli(
        "run",
        "--local",
        str(spec),
        *[f"--set={o}" for o in common],
        f"--set=checkpoint.storage={tmp_path / 'one'}",
        "--set=parallel.strategy=none",
    )
    assert single.returncode == 0, single.stderr
    ddp = torchrun(
        2,
        spec,
        *[f"--set={o}" for o in common],
        f"--set=checkpoint.storage={tmp_path / 'two'}",
        "--set=parallel.strategy=ddp",
        "--set=train.grad_accum=2",
    )
    assert ddp.returncode == 0, ddp.stderr
    one = losses(tmp_path / "one/convnet-digits")
    two = losses(tmp_path / "two/convnet-digits")
    assert sorted(one) == sorted(two) == list(range(1, 13))
    for step in one:
        assert abs(one[step] - two[step]) <= 1e-5, f"step {step}: {one[step]} vs {two[step]}"
    assert one[12] < one[1]  # and it learns


def test_ddp_convnet_on_digits_reaches_95_percent(tmp_path):
    summary = tmp_path / "summary.json"
    result = torchrun(
        2, ROOT / "jobs/convnet.yaml", f"--set=checkpoint.storage={tmp_path}", "--summary", str(summary)
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(summary.read_text())
    assert data["world_size"] == 2 and data["steps"] == 300
    assert data["eval"]["eval_accuracy"] >= 0.95, data["eval"]
