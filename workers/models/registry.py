"""Building models and counting their FLOPs.

Each family module (convnet, resnet, vit, gpt) provides `Model`, built from its `Config`
(`configs/<family>.py`); looking families up and checking specs is `families.py`, which
needs no torch.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from . import convnet, gpt, resnet, vit
from .families import FAMILIES, make_config, presets

_MODULES = {"convnet": convnet, "resnet": resnet, "vit": vit, "gpt": gpt}


def build(model_spec: Any, data_info: Any = None, kernels: dict[str, str] | None = None) -> nn.Module:
    """Build the model of a ModelSpec (anything with .family, .preset, .overrides)."""
    cfg = make_config(
        model_spec.family, model_spec.preset, dict(model_spec.overrides or {}), data_info, kernels
    )
    return _MODULES[model_spec.family].Model(cfg)


def config_class(family: str) -> type:
    return _MODULES[family].Config


def model_class(family: str) -> type[nn.Module]:
    return _MODULES[family].Model


# --- catalog and FLOPs ----------------------------------------------------------------


def example_input(config: Any, batch_size: int = 1) -> torch.Tensor:
    """A batch at the config's full input size, on the current default device."""
    if hasattr(config, "block_size"):
        return torch.zeros(batch_size, config.block_size, dtype=torch.long)
    return torch.randn(batch_size, config.in_channels, config.image_size, config.image_size)


def _cpu_sdpa_flop(q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(q_shape, k_shape, v_shape)


# FlopCounterMode knows the CUDA SDPA kernels and the math fallback (used on meta),
# but not the fused CPU kernel: without this, attention would count 0 on CPU.
_EXTRA_FLOPS = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_flop}


def count_flops(model: nn.Module, example_input: torch.Tensor) -> int:
    """Forward FLOPs (2 per multiply-add) of one call; attention is counted unmasked."""
    counter = FlopCounterMode(display=False, custom_mapping=_EXTRA_FLOPS)
    with torch.no_grad(), counter:
        model(example_input)
    return counter.get_total_flops()


def _input_desc(cfg: Any) -> str:
    if hasattr(cfg, "block_size"):
        return f"seq {cfg.block_size}, vocab {cfg.vocab_size}"
    size = cfg.image_size
    return f"{cfg.in_channels}x{size}x{size}, {cfg.num_classes} classes"


def catalog() -> list[dict]:
    """Every preset with its exact size and forward FLOPs at batch 1 (computed on meta: no memory)."""
    rows = []
    for family in FAMILIES:
        for preset in presets(family):
            cfg = make_config(family, preset)
            with torch.device("meta"):
                model = _MODULES[family].Model(cfg)
                flops = count_flops(model, example_input(cfg))
            rows.append(
                dict(
                    family=family,
                    preset=preset,
                    params=sum(p.numel() for p in model.parameters()),
                    input=_input_desc(cfg),
                    forward_flops=flops,
                )
            )
    return rows


__all__ = ["build", "catalog", "config_class", "count_flops", "example_input", "model_class"]
