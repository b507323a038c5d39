"""What bench/gpu_train.py trains: the modes (precision, compile, kernels), the two workloads
at the issue's shapes and their tiny `--dry-run` twins, the job spec of each, a synthetic batch,
and the loop as it was before the GPU measurements (`--legacy-loop`)."""

from __future__ import annotations

ALL_TRITON = {"attention": "triton", "layer_norm": "triton", "cross_entropy": "triton", "bias_gelu": "triton"}
# mode -> (precision.dtype, precision.compile, kernels section)
MODES = {
    "eager": ("bf16", False, {}),
    "compile": ("bf16", True, {}),
    "compile+fp8": ("fp8", True, {}),
    "compile+triton": ("bf16", True, ALL_TRITON),
}
# the targets on one H100, per model: (unit, figure)
TARGETS = {"vit_b16": ("samples_per_s", 4000), "gpt2_small": ("tokens_per_s", 500_000)}

# model -> (spec model section, data section, batch size); the shapes the issue names
WORKLOADS = {
    "vit_b16": (
        {"family": "vit", "preset": "vit_b16"},
        {"source": "synthetic", "kind": "image", "image_size": 224, "in_channels": 3, "num_classes": 1000},
        256,
    ),
    "gpt2_small": (
        {"family": "gpt", "preset": "gpt2_small"},
        {"source": "synthetic", "kind": "tokens", "seq_len": 1024, "vocab_size": 50257},
        16,
    ),
}
# --dry-run: the same code path on shapes a CPU runs in seconds
TINY = {
    "vit_b16": (
        {"family": "vit", "preset": "vit_micro", "overrides": {"depth": 1}},
        {"source": "synthetic", "kind": "image", "image_size": 28, "in_channels": 1, "num_classes": 10},
        2,
    ),
    "gpt2_small": (
        {"family": "gpt", "preset": "gpt_nano", "overrides": {"n_layer": 1}},
        {"source": "synthetic", "kind": "tokens", "seq_len": 16, "vocab_size": 64},
        2,
    ),
}


def make_spec(model: dict, data: dict, batch: int, mode: str, storage: str, loader_workers: int = 0):
    from core.spec import validate

    dtype, compile_, kernels = MODES[mode]
    return validate(
        {
            "name": "bench",
            "model": model,
            "data": {
                **data,
                "batch_size": batch,
                "eval_split": 0.0,
                "num_samples": 64 * batch,
                "loader_workers": loader_workers,
            },
            "train": {"steps": 1, "clip_grad_norm": 1.0},
            "optimizer": {"name": "adamw", "lr": 1e-4, "weight_decay": 0.1},
            "scheduler": {"name": "constant"},
            "parallel": {"strategy": "none"},
            "precision": {"dtype": dtype, "compile": compile_},
            "kernels": kernels,
            "checkpoint": {"storage": storage},
        }
    )


def synthetic_batch(info, device, batch: int):
    import torch

    if info.kind == "tokens":
        x = torch.randint(0, info.vocab_size, (batch, info.seq_len), device=device)
        return x, torch.roll(x, -1, dims=1)
    x = torch.randn(batch, info.in_channels, info.image_size, info.image_size, device=device)
    return x, torch.randint(0, info.num_classes, (batch,), device=device)


def use_legacy_loop(trainer) -> None:
    """The loop before the GPU measurements: for-each AdamW, an fp32 copy of the logits and
    an uncompiled built-in loss (kept here only to measure the change against)."""
    import torch

    import kernels

    groups = [
        {"params": g["params"], "weight_decay": g["weight_decay"]} for g in trainer.optimizer.param_groups
    ]
    o = trainer.spec.optimizer
    trainer.optimizer = torch.optim.AdamW(groups, lr=o.lr, betas=o.betas, eps=o.eps, foreach=True)
    trainer.scheduler = torch.optim.lr_scheduler.LambdaLR(trainer.optimizer, lambda step: 1.0)
    impl = trainer.spec.kernels.cross_entropy

    def loss(logits, target, label_smoothing):
        return kernels.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(),
            target.reshape(-1),
            label_smoothing=label_smoothing,
            impl=impl,
        )

    trainer.loss = loss
