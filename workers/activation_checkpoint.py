"""Activation checkpointing on `model.blocks`, applied from outside (torchtitan's `apply_ac`).

    full        every block keeps only its input; the whole block is recomputed in backward
    selective   policy "blocks": every k-th block (`parallel.checkpoint_every`) as in full
                policy "ops":    every block, but the outputs of matmuls and attention are
                                 saved and only the cheap ops (norms, activations, adds,
                                 dropout) are recomputed: most of the memory, little compute

Blocks are wrapped with `checkpoint_wrapper` (non-reentrant). The wrapper's
`_checkpoint_wrapped_module.` prefix is removed from state dicts by the wrapper itself and
by torch.distributed.checkpoint, so checkpoints do not depend on this setting.
RNG state is preserved, so dropout masks in the recomputation equal those of the forward.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from core.spec import ParallelSpec
from workers.torch_internals import checkpoint_wrapper

_aten = torch.ops.aten
# compute-bound ops whose outputs are worth keeping (recomputing them costs real FLOPs)
SAVE_OPS = {
    _aten.mm.default,
    _aten.addmm.default,
    _aten.bmm.default,
    _aten.baddbmm.default,
    _aten._scaled_mm.default,
    _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_cudnn_attention.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
}


def _save_matmuls(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _op_selective_context():
    return create_selective_checkpoint_contexts(_save_matmuls)


def wrap_block(block: nn.Module, per_op: bool = False) -> nn.Module:
    if per_op:
        return checkpoint_wrapper(block, context_fn=_op_selective_context, preserve_rng_state=True)
    return checkpoint_wrapper(block, preserve_rng_state=True)


def apply(model: nn.Module, spec: ParallelSpec) -> int:
    """Wrap blocks of `model.blocks` in place per the spec; returns how many were wrapped."""
    mode = spec.activation_checkpointing
    if mode == "none":
        return 0
    policy = getattr(spec, "selective_policy", "blocks")
    wrapped = 0
    for i, block in enumerate(model.blocks):
        if mode == "selective" and policy == "blocks" and (i + 1) % spec.checkpoint_every:
            continue  # selective per block: the k-th, 2k-th, ... blocks only
        model.blocks[i] = wrap_block(block, per_op=mode == "selective" and policy == "ops")
        wrapped += 1
    return wrapped


__all__ = ["apply", "wrap_block", "SAVE_OPS"]
