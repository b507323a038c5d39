"""float8 training through torchao (`convert_to_float8_training`), as torchtitan's float8 converter.

Only the Linear layers inside `model.blocks` are converted: the first and last layers
(patch/token embedding, classifier or LM head) stay in high precision, where float8
costs the most accuracy for the least time. Of the block Linears, those whose
dimensions are not multiples of 16 (a float8 matmul requirement) or too small to
gain (torchao's H100 thresholds per recipe, the "auto filter" torchtitan uses) stay
in bf16. On a CPU, torchao emulates the float8 matmuls: no speed to gain there, so
the size thresholds are skipped and every eligible block Linear is converted, which
keeps the code path and its numerics covered by tests on small models.
"""

from __future__ import annotations

import dataclasses
import logging

import torch
from torch import nn

log = logging.getLogger("workers")


def _passes_size_threshold(recipe: str, linear: nn.Linear) -> bool:
    # torchao's auto filter (torchao.float8._auto_filter_for_recipe), on the weight's (N, K)
    n, k = linear.weight.shape
    if recipe == "tensorwise":
        return not (k <= 4096 and n <= 1024)
    return not (n <= 2048 or k <= 1024 or (n <= 4096 and k <= 2048))


def layer_filter(model: nn.Module, recipe: str, emulate: bool):
    """The `module_filter_fn` for convert_to_float8_training: (module, fqn) -> convert?"""
    in_blocks = {id(m) for m in model.blocks.modules()}

    def keep_fp8(module: nn.Module, fqn: str) -> bool:
        if not isinstance(module, nn.Linear) or id(module) not in in_blocks:
            return False
        n, k = module.weight.shape
        if n % 16 or k % 16:
            return False
        return emulate or _passes_size_threshold(recipe, module)

    return keep_fp8


def convert(model: nn.Module, recipe: str, device: torch.device) -> list[str]:
    """Swap the eligible Linears of `model` for torchao Float8Linear in place; returns their names."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training  # heavy import

    emulate = device.type != "cuda"
    config = dataclasses.replace(Float8LinearConfig.from_recipe_name(recipe), emulate=emulate)
    keep = layer_filter(model, recipe, emulate)
    names = [name for name, m in model.named_modules() if keep(m, name)]
    convert_to_float8_training(model, module_filter_fn=keep, config=config)
    kept = sum(isinstance(m, nn.Linear) for m in model.modules()) - len(names)
    log.info(
        "float8 (%s%s): %d Linear layers in float8, %d kept in high precision",
        recipe,
        ", emulated" if emulate else "",
        len(names),
        kept,
    )
    if not names:
        log.warning("float8: no Linear layer is large enough to gain from float8; the run is bf16")
    return names
