"""The training loss: mean cross-entropy in fp32 from logits of any precision.

The trainer takes the loss of each micro-batch with it and the evaluator of each eval batch;
the kernel is the one `kernels.cross_entropy` in the spec picks (the built-in one compiled with
the model when it is: `compile.builtin_loss`).
"""

from __future__ import annotations

import torch

import kernels
from core.spec import JobSpec
from workers import compile as compile_


def padded_logits(logits: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(the tensor to compute the loss on, the number of classes).

    A model with a padded vocabulary (GPT's `vocab_multiple`) returns its logits as the
    first `vocab_size` columns of a wider buffer. Taking the loss on that buffer, with
    `classes`, keeps the slice out of the autograd graph: its backward would zero-fill a
    buffer-sized gradient and copy into it (~2.5 ms a step for GPT-2 small on an H100)."""
    base = logits._base
    if (
        base is not None
        and base.dim() == logits.dim()
        and base.shape[:-1] == logits.shape[:-1]
        and base.shape[-1] > logits.shape[-1]
        and base.stride() == logits.stride()
        and base.storage_offset() == logits.storage_offset()
        and base.dtype == logits.dtype
    ):
        return base, logits.shape[-1]
    return logits, logits.shape[-1]


class Loss:
    """`loss(logits, target, label_smoothing)`: the job's cross-entropy."""

    def __init__(self, spec: JobSpec):
        self.spec = spec
        self.builtin = compile_.builtin_loss(spec)

    def __call__(self, logits: torch.Tensor, target: torch.Tensor, label_smoothing: float) -> torch.Tensor:
        """Mean cross-entropy in fp32, from logits of any precision (never copied to fp32 first)."""
        logits, classes = padded_logits(logits)
        logits, target = logits.reshape(-1, logits.shape[-1]), target.reshape(-1)
        impl = kernels.resolve("cross_entropy", self.spec.kernels.cross_entropy, logits, vocab=classes)
        if impl == "triton":
            # the logits are dead after the loss: their memory takes the gradient
            return kernels.cross_entropy(
                logits, target, label_smoothing, impl="triton", inplace_backward=True, classes=classes
            )
        return self.builtin(logits, target, label_smoothing, classes=classes)
