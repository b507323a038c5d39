"""ViT-B/16 and GPT-2 small train on a GPU with every op on the Triton kernels as on the
built-in ops: the real training loop (workers.trainer) in bf16, a few steps each.

Tolerance: each step's loss within 2% of the built-in path's, and the final eval loss too.
bf16 rounds each op's output to 8 bits of mantissa (~0.4%), and the two paths round in
different places (fused kernels keep fp32 in registers where the built-in ops store bf16),
so a few optimizer steps drift by a few tenths of a percent; a wrong gradient or a wrong
mask moves the loss by far more within a step or two.

    python -m pytest -m gpu tests/gpu/test_training_parity_cuda.py
"""

import pytest
import torch

from core.metrics_log import read_metrics
from core.spec import validate
from workers.context import LocalContext
from workers.run import train

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TOLERANCE = 2e-2
STEPS = 6
ALL_TRITON = {"attention": "triton", "layer_norm": "triton", "cross_entropy": "triton", "bias_gelu": "triton"}
PRESETS = {
    "vit_b16": (
        {"family": "vit", "preset": "vit_b16"},
        {
            "source": "synthetic",
            "kind": "image",
            "image_size": 224,
            "in_channels": 3,
            "num_classes": 1000,
            "batch_size": 32,
            "num_samples": 256,
        },
    ),
    "gpt2_small": (
        {"family": "gpt", "preset": "gpt2_small"},
        {
            "source": "synthetic",
            "kind": "tokens",
            "seq_len": 1024,
            "vocab_size": 50257,
            "batch_size": 8,
            "num_samples": 128,
        },
    ),
}


def losses(tmp_path, name, model, data, kernels):
    spec = validate(
        {
            "name": name,
            "model": model,
            "data": {**data, "eval_split": 0.1, "eval_batch_size": data["batch_size"]},
            "train": {"steps": STEPS, "eval_batches": 1, "label_smoothing": 0.1},
            "optimizer": {"name": "adamw", "lr": 3e-4, "weight_decay": 0.1},
            "scheduler": {"name": "constant"},
            "precision": {"dtype": "bf16"},
            "kernels": kernels,
            "checkpoint": {"storage": str(tmp_path)},
            "metrics": {"log_every": 1},
        }
    )
    summary = train(spec, LocalContext(spec))
    assert summary["status"] == "succeeded", summary
    records = read_metrics(str(tmp_path / name))
    return [r["loss"] for r in records if "loss" in r], summary["eval"]["eval_loss"]


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_trains_the_same_on_triton_kernels(tmp_path, preset):
    model, data = PRESETS[preset]
    builtin, builtin_eval = losses(tmp_path, "builtin", model, data, {})
    fused, fused_eval = losses(tmp_path, "triton", model, data, ALL_TRITON)
    print(f"{preset}: built-in {builtin} eval {builtin_eval}; triton {fused} eval {fused_eval}")
    assert len(builtin) == len(fused) == STEPS
    assert len(set(builtin)) == STEPS  # the weights move: every step sees a different model
    for step, (a, b) in enumerate(zip(builtin, fused), 1):
        assert abs(a - b) <= TOLERANCE * abs(a), f"step {step}: {builtin} vs {fused}"
    assert abs(builtin_eval - fused_eval) <= TOLERANCE * abs(builtin_eval)
