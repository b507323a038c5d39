"""`precision.compile: true`: torch.compile per block (torchtitan's `apply_compile`).

Transformers (vit, gpt) compile each block of `model.blocks`: the blocks are identical, so
dynamo traces one graph and reuses it for all of them (parameters are graph inputs), and
FSDP2's per-block all-gathers stay outside the compiled graphs. Convolutional models
(convnet, resnet) have blocks of different shapes; outside FSDP2 they compile as one whole
model instead, which also fuses the stem and head. `nn.Module.compile` compiles in place,
so parameter names (and checkpoints) do not change.

The built-in loss is compiled too (`builtin_loss`); the Triton cross-entropy is not (it
writes the gradient into the logits in place, which a compiled graph would copy).

Compilation happens lazily on the first step; the trainer reports that step's time
separately (`compile_s`) and leaves it out of the throughput.

ORCHESTRATOR_COMPILE_BACKEND overrides the backend (default "inductor"); tests use
"aot_eager" where the point is the code path, since inductor's C++ build is slow on a CPU.
"""

from __future__ import annotations

import functools
import os

import torch
from torch import nn

import kernels
from core.spec import JobSpec

TRANSFORMER_FAMILIES = {"vit", "gpt"}


def backend() -> str:
    return os.environ.get("ORCHESTRATOR_COMPILE_BACKEND", "inductor")


def apply(model: nn.Module, spec: JobSpec) -> str:
    """Compile `model` in place per the spec; returns what was compiled ("blocks", "model", "")."""
    if not spec.precision.compile:
        return ""
    if spec.model.family in TRANSFORMER_FAMILIES or spec.parallel.strategy == "fsdp2":
        for block in model.blocks:
            block.compile(backend=backend())
        return "blocks"
    model.compile(backend=backend())
    return "model"


def builtin_loss(spec: JobSpec):
    """The built-in cross-entropy, compiled with the model when it is: inductor fuses the
    upcast, log-softmax and loss into a pass or two over the logits (eager makes an fp32
    copy of the logits and several full passes over it)."""
    loss = functools.partial(kernels.cross_entropy, impl="torch")
    return torch.compile(loss, backend=backend()) if spec.precision.compile else loss
