"""Numeric precision: autocast (single process, DDP), FSDP2's MixedPrecisionPolicy, grad scaling.

| dtype | compute                      | where the cast happens                 | loss scaling        |
|-------|------------------------------|----------------------------------------|---------------------|
| fp32  | fp32                         | -                                      | -                   |
| bf16  | bf16 matmuls, fp32 params    | autocast; under FSDP2 the policy casts | -                   |
| fp16  | fp16 matmuls, fp32 params    | as bf16                                | GradScaler (FSDP2: sharded)|
| fp8   | float8 Linears in the blocks, bf16 elsewhere (see workers/float8.py)   | -                   |

Under FSDP2 there is no autocast (as in torchtitan): `fully_shard` all-gathers parameters
already cast to `param_dtype` and reduce-scatters gradients in fp32.
"""

from __future__ import annotations

import contextlib

import torch

from core.spec import PrecisionSpec

# fp8 runs everything that is not a float8 Linear in bf16
LOW_PRECISION = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}

FP8_MIN_CAPABILITY = (8, 9)  # Ada (L4, L40S), Hopper, Blackwell: hardware float8 matmuls


def device_problems(spec: PrecisionSpec, device: torch.device) -> list[str]:
    """Settings this device cannot run, as 'path: reason' lines (checked on the worker)."""
    if spec.dtype != "fp8" or device.type == "cpu":  # CPU: torchao emulates float8 matmuls
        return []
    if device.type != "cuda":
        return [f"precision.dtype: fp8 runs on NVIDIA GPUs (or emulated on a CPU), not on '{device.type}'"]
    capability = torch.cuda.get_device_capability(device)
    if tuple(capability) < FP8_MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        return [
            f"precision.dtype: fp8 needs a GPU with compute capability 8.9 or newer "
            f"(Ada, Hopper, Blackwell); this worker's {name} has "
            f"{capability[0]}.{capability[1]}: use bf16"
        ]
    return []


def mixed_precision_policy(spec: PrecisionSpec):
    """FSDP2's policy: compute in the low-precision dtype, reduce gradients in fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=LOW_PRECISION[spec.dtype], reduce_dtype=torch.float32)


class Precision:
    def __init__(self, spec: PrecisionSpec, device: torch.device, strategy: str = "none"):
        problems = device_problems(spec, device)
        if problems:
            raise ValueError(problems[0])
        self.spec, self.device = spec, device
        self.sharded = strategy == "fsdp2"
        # FSDP2's MixedPrecisionPolicy does the casting there; autocast would only add copies
        self.autocast_dtype: torch.dtype | None = None if self.sharded else LOW_PRECISION[spec.dtype]
        # fp16 gradients underflow without loss scaling; bf16 has fp32's range and needs none
        enabled = spec.dtype == "fp16"
        if self.sharded:
            # each rank sees only its gradient shards: found-inf must be all-reduced across ranks
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

            self.scaler = ShardedGradScaler(device.type, enabled=enabled)
        else:
            self.scaler = torch.amp.GradScaler(device.type, enabled=enabled)

    def autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)
