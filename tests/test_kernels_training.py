"""Models train with every op on the Triton kernels (CPU interpreter) as on the torch path."""

import pytest

from core.metrics_log import read_metrics
from core.spec import load_spec
from tests.conftest import ROOT
from workers.context import LocalContext
from workers.run import train

ALL_TRITON = [
    "kernels.attention=triton",
    "kernels.layer_norm=triton",
    "kernels.cross_entropy=triton",
    "kernels.bias_gelu=triton",
]
# fp32 everywhere; kernels sum in another order than ATen (~1e-6 per op), which a few
# optimizer steps amplify a little: 1e-4 relative still catches any wrong gradient
TOLERANCE = 1e-4

# one block each: every kernel is in it, and the interpreter runs each Triton program in Python
MODELS = {
    "vit": ["model.family=vit", "model.preset=vit_micro", "model.overrides={depth: 1}", "data.source=digits"],
    "gpt": [
        "model.family=gpt",
        "model.preset=gpt_nano",
        "model.overrides={n_layer: 1}",
        "data.source=synthetic",
        "data.kind=tokens",
        "data.seq_len=16",
        "data.vocab_size=64",
        "data.num_samples=256",
    ],
}


def step_losses(tmp_path, name, overrides):
    spec = load_spec(
        ROOT / "jobs/convnet.yaml",
        [
            *overrides,
            f"checkpoint.storage={tmp_path / name}",
            "train.steps=3",
            "metrics.log_every=1",
            # the interpreter runs each Triton program in Python: keep batches and eval tiny
            "data.batch_size=4",
            "data.eval_batch_size=4",
            "train.eval_batches=1",
            "parallel.strategy=none",
            "resources.num_workers=1",
            "train.eval_every=null",
            "train.label_smoothing=0.1",
            "checkpoint.every_steps=null",
        ],
    )
    summary = train(spec, LocalContext(spec))
    assert summary["status"] == "succeeded"
    records = read_metrics(str(tmp_path / name / spec.name))
    return [r["loss"] for r in records if "loss" in r], summary["eval"]["eval_loss"]


@pytest.mark.parametrize("family", sorted(MODELS))
def test_training_with_triton_kernels_matches_torch(tmp_path, monkeypatch, family):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    torch_losses, torch_eval = step_losses(tmp_path, "torch", MODELS[family])
    triton_losses, triton_eval = step_losses(tmp_path, "triton", MODELS[family] + ALL_TRITON)
    assert len(torch_losses) == len(triton_losses) == 3
    for a, b in zip(torch_losses, triton_losses):
        assert abs(a - b) <= TOLERANCE * abs(a), (torch_losses, triton_losses)
    assert abs(torch_eval - triton_eval) <= TOLERANCE * abs(torch_eval)
