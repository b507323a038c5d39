"""`orchestrator export`: a checkpoint becomes one plain state dict that a freshly built model
loads with `load_state_dict(strict=True)` and evaluates to the training run's eval loss."""

import json

import pytest
import torch
import torch.nn.functional as F

from core.spec import load_spec
from tests.conftest import run_cli
from tests.dist_suite import GPT, GPT_JOB, VIT, VIT_JOB, suite
from workers import data, models
from workers.context import LocalContext
from workers.run import train

EVAL_TOL = 1e-5  # relative: only the summation order of the eval loss differs


@torch.no_grad()
def plain_eval_loss(model: torch.nn.Module, spec) -> float:
    """Plain PyTorch: the whole eval split, mean cross-entropy per target."""
    eval_set = data.load(spec.data, seed=spec.train.seed).eval
    model.eval()
    total = count = 0.0
    for x, y in torch.utils.data.DataLoader(eval_set, batch_size=64):
        logits = model(x)
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum").item()
        count += y.numel()
    return total / count


def fresh_model(spec):
    info = data.load(spec.data, seed=spec.train.seed).info
    return models.build(spec.model, info)


def test_export_to_safetensors_loads_strictly_and_gives_the_same_eval_loss(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import load_file

    # GPT: its lm_head shares the token embedding's weight; both names must be in the file
    spec = load_spec(
        GPT_JOB,
        [
            *GPT,
            "train.steps=4",
            "train.eval_batches=null",
            "parallel.strategy=none",
            f"checkpoint.storage={tmp_path}",
        ],
    )
    summary = train(spec, LocalContext(spec))
    out = tmp_path / "export" / "model.safetensors"
    result = run_cli("export", summary["checkpoint"], "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "gpt/gpt_nano at step 4" in result.stdout

    model = fresh_model(spec)
    model.load_state_dict(load_file(out), strict=True)
    assert model.lm_head.weight.data_ptr() == model.wte.weight.data_ptr()  # still tied
    loss = plain_eval_loss(model, spec)
    assert abs(loss - summary["eval"]["eval_loss"]) <= EVAL_TOL * summary["eval"]["eval_loss"]
    with safe_open(out, "pt") as f:  # the job's model section travels with the weights
        assert json.loads(f.metadata()["model"])["preset"] == "gpt_nano"


def test_export_of_a_sharded_two_worker_checkpoint(tmp_path_factory, tmp_path):
    run = suite(tmp_path_factory.getbasetemp() / "dist_suite")["fsdp2"]  # FSDP2, 2 workers
    out = tmp_path / "model.pt"
    result = run_cli("export", str(run.directory / "checkpoint_00000020"), "--out", str(out))
    assert result.returncode == 0, result.stderr

    spec = load_spec(VIT_JOB, [*VIT, "parallel.strategy=fsdp2"])
    model = fresh_model(spec)
    model.load_state_dict(torch.load(out, weights_only=True), strict=True)
    expected = run.summary["eval"]["eval_loss"]  # evaluated by the two workers, each on half
    assert abs(plain_eval_loss(model, spec) - expected) <= EVAL_TOL * expected


@pytest.mark.parametrize(
    "args,message",
    [
        (["--out", "model.bin"], "must end in .safetensors or .pt"),
        (["--out", "model.pt"], "is not a checkpoint directory"),
    ],
)
def test_export_rejects_bad_input_with_exit_status_2(tmp_path, capsys, args, message):
    from orchestrator.cli import main

    assert main(["export", str(tmp_path), *args[:1], str(tmp_path / args[1])]) == 2
    assert message in capsys.readouterr().err
