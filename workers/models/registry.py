"""Family lookup, spec validation, config assembly, building and FLOP counting.

Each family module (convnet, resnet, vit, gpt) provides `Config`, `PRESETS`,
`Model` and `validate(cfg)`; everything generic lives here.
"""

from __future__ import annotations

import copy
import difflib
import math
import types
import typing
from typing import Any, Literal, Union

import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from . import convnet, gpt, resnet, vit
from .layers import KERNEL_IMPLS, KERNEL_OPS

FAMILIES: tuple[str, ...] = ("convnet", "resnet", "vit", "gpt")
_MODULES = {"convnet": convnet, "resnet": resnet, "vit": vit, "gpt": gpt}
IMAGE_FAMILIES = ("convnet", "resnet", "vit")

Problems = list[tuple[str, str]]


def presets(family: str) -> list[str]:
    if family not in _MODULES:
        raise ValueError(f"unknown model family {family!r}; choose from: {', '.join(FAMILIES)}")
    return list(_MODULES[family].PRESETS)


# --- validation ---------------------------------------------------------------------


def check(family: str, preset: str, overrides: dict | None, data_info: Any = None) -> Problems:
    """Problems as (path relative to the `model` section, message); [] means valid.

    With `data_info` the cross-field constraints are checked on the config the
    data would produce (e.g. a 28px dataset with a patch-16 ViT).
    """
    if not isinstance(family, str) or family not in _MODULES:
        return [("family", f"unknown family {family!r}{_suggest(family, FAMILIES)}")]
    module = _MODULES[family]
    problems: Problems = []
    if not isinstance(preset, str) or preset not in module.PRESETS:
        problems.append(
            (
                "preset",
                f"unknown preset {preset!r} for family {family!r}{_suggest(preset, list(module.PRESETS))}",
            )
        )
    if overrides is None:
        overrides = {}
    if not isinstance(overrides, dict):
        return problems + [("overrides", f"expected a mapping of field: value, got {overrides!r}")]
    hints = typing.get_type_hints(module.Config)
    for key, value in overrides.items():
        path = f"overrides.{key}"
        if key == "kernels" and key not in hints:
            problems.append((path, f"the {family} family has no ops with fused kernels; {_KERNELS_HINT}"))
            continue
        if key not in hints:
            close = difflib.get_close_matches(str(key), list(hints), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}?" if close else f"allowed: {', '.join(hints)}"
            problems.append((path, f"unknown field; {hint}"))
            continue
        message = _type_problem(value, hints[key]) or _range_problem(key, value, hints[key])
        if message:
            problems.append((path, message))
    if data_info is not None:
        wants = "tokens" if family == "gpt" else "image"
        if getattr(data_info, "kind", wants) != wants:
            problems.append(
                (
                    "family",
                    f"family {family!r} needs {wants} data, but the data source gives {data_info.kind} data",
                )
            )
    if problems:
        return problems
    cfg = _assemble(family, preset, overrides, data_info)
    for fields, message in module.validate(cfg):
        changed = [f for f in fields if f in overrides]
        problems.append((f"overrides.{changed[0]}" if changed else "preset", message))
    return problems


def _suggest(word: str, choices: list[str] | tuple[str, ...]) -> str:
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    mean = f"; did you mean {close[0]!r}?" if close else ";"
    return f"{mean} choose from: {', '.join(choices)}"


_KERNELS_HINT = "the job's kernels section (e.g. kernels.cross_entropy) still picks the loss kernel"
_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
MAX_INT = 2**20  # no size or count in these configs comes near it (GPT-2's vocabulary: 50,257)
MAX_FLOAT = 1000.0  # ratios and probabilities


def _type_problem(value: Any, tp: Any) -> str | None:
    """None if `value` fits the annotation `tp`, else 'expected ..., got ...'."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if any(_type_problem(value, a) is None for a in options):
            return None
        return f"expected {' or '.join(_describe(a) for a in options)} or null, got {value!r}"
    if origin is Literal:
        if value in args and isinstance(value, str) == isinstance(args[0], str):
            return None
        close = difflib.get_close_matches(str(value), [str(a) for a in args], n=1, cutoff=0.6)
        mean = f"; did you mean {close[0]!r}?" if close else ""
        return f"expected one of {', '.join(repr(a) for a in args)}, got {value!r}{mean}"
    if origin is list:
        if not isinstance(value, (list, tuple)):
            return f"expected {_describe(tp)}, got {value!r}"
        for i, item in enumerate(value):
            if _type_problem(item, args[0]):
                return f"item {i}: expected {_describe(args[0])}, got {item!r}"
        return None
    if origin is dict:
        if not isinstance(value, dict) or any(
            _type_problem(k, args[0]) or _type_problem(v, args[1]) for k, v in value.items()
        ):
            return f"expected {_describe(tp)}, got {value!r}"
        return None
    ok = {
        bool: lambda v: isinstance(v, bool),
        int: lambda v: isinstance(v, int) and not isinstance(v, bool),
        float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        str: lambda v: isinstance(v, str),
    }[tp](value)
    return None if ok else f"expected {_describe(tp)}, got {value!r}"


def _describe(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list:
        return f"a list of {_describe(args[0]).split(' ', 1)[1]}s"
    if origin is dict:
        return "a mapping of names to strings"
    return _NAMES.get(tp, str(tp))


def _range_problem(key: str, value: Any, tp: Any) -> str | None:
    """Generic bounds: every int in these configs is a size or count (1 to MAX_INT), every float
    a finite ratio (dropout: a probability)."""
    if key == "kernels":
        for op, impl in value.items():
            if op not in KERNEL_OPS:
                return f"unknown kernel op {op!r}{_suggest(op, KERNEL_OPS)}"
            if impl not in KERNEL_IMPLS:
                return f"{op}: unknown impl {impl!r}; choose from: {', '.join(KERNEL_IMPLS)}"
        return None
    if isinstance(value, bool) or value is None:
        return None
    if tp is float:
        try:
            value = float(value)  # YAML's 0 for a float field is 0.0
        except OverflowError:
            return f"must be > 0 and <= {MAX_FLOAT:g}, got {_short(value)}"
    if isinstance(value, int) and not 1 <= value <= MAX_INT:
        return f"must be 1 to {MAX_INT}, got {_short(value)}"
    if isinstance(value, (list, tuple)):
        if not value:
            return "must not be empty"
        bad = [v for v in value if not 1 <= v <= MAX_INT]
        return f"every item must be 1 to {MAX_INT}, got {_short(bad[0])}" if bad else None
    if isinstance(value, float):
        if not math.isfinite(value):
            return f"must be a finite number, got {value}"
        if key == "dropout" and not 0.0 <= value < 1.0:
            return f"must be in [0, 1), got {value}"
        if key != "dropout" and not 0.0 < value <= MAX_FLOAT:
            return f"must be > 0 and <= {MAX_FLOAT:g}, got {value}"
    return None


def _short(value: Any, limit: int = 40) -> str:
    try:
        text = str(value)
    except ValueError:  # an integer too long to print
        return "a huge integer"
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- assembly -------------------------------------------------------------------------


def make_config(
    family: str,
    preset: str,
    overrides: dict | None = None,
    data_info: Any = None,
    kernels: dict[str, str] | None = None,
):
    """Preset defaults, then the data's input shape, then user overrides, then kernels."""
    problems = check(family, preset, overrides, data_info)
    if kernels:
        message = _type_problem(kernels, dict[str, str]) or _range_problem("kernels", kernels, dict)
        problems += [("kernels", message)] if message else []
    if problems:
        raise ValueError("invalid model spec: " + "; ".join(f"model.{p}: {m}" for p, m in problems))
    cfg = _assemble(family, preset, overrides or {}, data_info)
    if hasattr(cfg, "kernels"):  # families without kernel-backed ops (convnet, resnet) have none
        cfg.kernels = {**cfg.kernels, **(kernels or {})}
    return cfg


def _assemble(family: str, preset: str, overrides: dict, data_info: Any):
    module = _MODULES[family]
    values = copy.deepcopy(module.PRESETS.get(preset, {}))
    if data_info is not None:
        values.update(_from_data(family, data_info, {**values, **overrides}))
    values.update(copy.deepcopy(overrides))
    hints = typing.get_type_hints(module.Config)
    for key, tp in hints.items():  # YAML gives 1 for 1.0; keep configs typed
        if tp is float and isinstance(values.get(key), int):
            values[key] = float(values[key])
    return module.Config(**values)


def _from_data(family: str, info: Any, chosen: dict) -> dict:
    if family in IMAGE_FAMILIES:
        if getattr(info, "kind", "image") != "image":
            return {}
        fields = ("image_size", "in_channels", "num_classes")
        return {f: getattr(info, f) for f in fields if getattr(info, f, None) is not None}
    if getattr(info, "kind", "tokens") != "tokens":
        return {}
    values = {}
    if info.vocab_size is not None:
        values["vocab_size"] = info.vocab_size
    if info.seq_len is not None:
        block = chosen.get("block_size", gpt.Config.block_size)
        values["block_size"] = max(block, info.seq_len)
    return values


def build(model_spec: Any, data_info: Any = None, kernels: dict[str, str] | None = None) -> nn.Module:
    """Build the model of a ModelSpec (anything with .family, .preset, .overrides)."""
    cfg = make_config(
        model_spec.family, model_spec.preset, dict(model_spec.overrides or {}), data_info, kernels
    )
    return _MODULES[model_spec.family].Model(cfg)


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


__all__ = ["FAMILIES", "presets", "check", "make_config", "build", "catalog", "count_flops", "example_input"]
