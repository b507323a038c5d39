"""Model families by name, and checking a `model` section of a spec against them.

Everything here reads only the families' configurations (`configs/`), never their modules,
so that checking a spec (the CLI's `submit` and `validate`) does not import torch; building
models and counting their FLOPs is `registry.py`.
"""

from __future__ import annotations

import copy
import difflib
import math
import types
import typing
from typing import Any, Literal, Union

from core.spec.schema import KERNEL_IMPLS, KERNEL_OPS

from .configs import convnet, gpt, resnet, vit

FAMILIES: tuple[str, ...] = ("convnet", "resnet", "vit", "gpt")
_CONFIGS = {"convnet": convnet, "resnet": resnet, "vit": vit, "gpt": gpt}
IMAGE_FAMILIES = ("convnet", "resnet", "vit")

Problems = list[tuple[str, str]]


def presets(family: str) -> list[str]:
    if family not in _CONFIGS:
        raise ValueError(f"unknown model family {family!r}; choose from: {', '.join(FAMILIES)}")
    return list(_CONFIGS[family].PRESETS)


# --- validation ---------------------------------------------------------------------


def check(family: str, preset: str, overrides: dict | None, data_info: Any = None) -> Problems:
    """Problems as (path relative to the `model` section, message); [] means valid.

    With `data_info` the cross-field constraints are checked on the config the
    data would produce (e.g. a 28px dataset with a patch-16 ViT).
    """
    if not isinstance(family, str) or family not in _CONFIGS:
        return [("family", f"unknown family {family!r}{_suggest(family, FAMILIES)}")]
    module = _CONFIGS[family]
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
    module = _CONFIGS[family]
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
