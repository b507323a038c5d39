"""Parallelism, applied to a model from outside (as torchtitan's `parallelize` functions).

`parallelize(model, spec, mesh)` applies, in torchtitan's order:
    1. float8 conversion of the block Linears     (precision.dtype: fp8)
    2. activation checkpointing of the blocks      (parallel.activation_checkpointing)
    3. torch.compile per block                     (precision.compile)
    4. data parallelism: DDP around the model, or FSDP2's `fully_shard` on each block of
       `model.blocks` and then on the root         (parallel.strategy)
Each step wraps or converts modules in place; model classes know nothing of it.
"""

from __future__ import annotations

import contextlib
import logging

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from core.spec import JobSpec
from workers import activation_checkpoint, float8
from workers import compile as compile_
from workers.precision import mixed_precision_policy

log = logging.getLogger("workers")


def _device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _ensure_process_group(device: torch.device) -> None:
    """FSDP2 needs a process group even for one worker (e.g. `run --local` of an fsdp2 job)."""
    if dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)


def default_mesh(device: torch.device):
    from torch.distributed.device_mesh import init_device_mesh

    _ensure_process_group(device)
    return init_device_mesh(device.type, (dist.get_world_size(),))


def apply_fsdp(model: nn.Module, spec: JobSpec, mesh) -> nn.Module:
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    device = _device_of(model)
    offload = OffloadPolicy()
    if spec.parallel.cpu_offload:
        # parameters, gradients and optimizer state live on the CPU; pinned memory needs CUDA
        offload = CPUOffloadPolicy(pin_memory=device.type == "cuda")
    options = dict(mesh=mesh, offload_policy=offload)
    if spec.precision.dtype != "fp32":
        options["mp_policy"] = mixed_precision_policy(spec.precision)
    reshard = spec.parallel.reshard_after_forward
    last = len(model.blocks) - 1
    for i, block in enumerate(model.blocks):
        # the last block is all-gathered again right away for the backward: keep it unsharded
        fully_shard(block, reshard_after_forward=reshard and i < last, **options)
    fully_shard(model, reshard_after_forward=reshard, **options)  # embeddings, norm, head
    return model


def parallelize(model: nn.Module, spec: JobSpec, mesh=None) -> nn.Module:
    """Convert and wrap `model` (already on its device) for the spec; returns the model to train."""
    device = _device_of(model)
    if spec.precision.dtype == "fp8":
        float8.convert(model, spec.precision.fp8_recipe, device)
    wrapped = activation_checkpoint.apply(model, spec.parallel)
    if wrapped:
        log.info(
            "activation checkpointing (%s): %d of %d blocks",
            spec.parallel.activation_checkpointing,
            wrapped,
            len(model.blocks),
        )
    compiled = compile_.apply(model, spec)
    if compiled:
        log.info(
            "torch.compile (%s backend) per %s",
            compile_.backend(),
            "block" if compiled == "blocks" else "whole model",
        )
    if spec.parallel.strategy == "fsdp2":
        return apply_fsdp(model, spec, mesh if mesh is not None else default_mesh(device))
    if spec.parallel.strategy == "ddp" and dist.is_initialized():
        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    return model


def no_gradient_sync(model: nn.Module):
    """Skip the gradient all-reduce on the inner steps of gradient accumulation (DDP).

    FSDP2 keeps reduce-scattering on every micro-batch: skipping it would hold full,
    unsharded gradients on every rank, which is the memory FSDP is there to save.
    """
    if isinstance(model, DDP):
        return model.no_sync()
    return contextlib.nullcontext()
