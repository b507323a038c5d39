"""Optimizers and learning-rate schedules from the spec."""

from __future__ import annotations

import math

import torch
from torch import nn

from core.spec import OptimizerSpec, SchedulerSpec


def build_optimizer(model: nn.Module, spec: OptimizerSpec) -> torch.optim.Optimizer:
    # no weight decay on biases and norm weights (1-D tensors), as is standard for transformers
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    groups = [{"params": decay, "weight_decay": spec.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if spec.name == "adamw":
        # one fused kernel per step on CUDA (the for-each version launches several per
        # parameter group); sharded (DTensor) parameters keep the for-each version
        fused = all(p.is_cuda and type(p) in (torch.Tensor, nn.Parameter) for p in decay + no_decay)
        return torch.optim.AdamW(groups, lr=spec.lr, betas=spec.betas, eps=spec.eps, fused=fused or None)
    return torch.optim.SGD(groups, lr=spec.lr, momentum=spec.momentum, nesterov=spec.momentum > 0)


def clip_grad_norm_(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Clip the gradients to `max_norm` and return their norm before clipping, as a local 0-d
    tensor on every rank. Under FSDP2 each rank's norm is a partial one (a DTensor); one
    all-reduce makes it whole, here and only here (torchtitan does the same)."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in model.parameters() if p.grad is not None]
    norm = nn.utils.get_total_norm(grads)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    nn.utils.clip_grads_with_norm_(model.parameters(), max_norm, norm)
    return norm


def lr_factor(spec: SchedulerSpec, step: int, total_steps: int) -> float:
    """Multiplier of the base learning rate at `step` (0-based)."""
    if spec.name == "onecycle":
        # rise linearly to the peak over pct_start of the run, then cosine down to min_lr
        peak = max(1, int(spec.pct_start * total_steps))
        if step < peak:
            return 0.04 + 0.96 * step / peak
        return _cosine(spec.min_lr_ratio, step - peak, total_steps - peak)
    if step < spec.warmup_steps:
        return (step + 1) / spec.warmup_steps
    if spec.name == "constant":
        return 1.0
    return _cosine(spec.min_lr_ratio, step - spec.warmup_steps, total_steps - spec.warmup_steps)


def _cosine(floor: float, step: int, steps: int) -> float:
    progress = min(step / max(1, steps), 1.0)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, spec: SchedulerSpec, total_steps: int):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(spec, step, total_steps))
