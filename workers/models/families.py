"""Model families by name, and checking a `model` section of a spec against them.

Everything here reads only the families' configurations (`configs/`), never their modules,
so that checking a spec (the CLI's `submit` and `validate`) does not import torch; building
models and counting their FLOPs is `registry.py`.
"""

from __future__ import annotations

import copy
import difflib
import functools
import typing
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, create_model

from core.spec.errors import close_literal, did_you_mean_in
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
    problems += [(f"overrides.{k}", m) for k, m in _invalid(overrides, _HINTS[family], family)]
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


def _check_kernels(kernels: dict[str, str]) -> dict[str, str]:
    for op, impl in kernels.items():
        if op not in KERNEL_OPS:
            raise ValueError(f"unknown kernel op {op!r}{_suggest(op, KERNEL_OPS)}")
        if impl not in KERNEL_IMPLS:
            raise ValueError(f"{op}: unknown impl {impl!r}; choose from: {', '.join(KERNEL_IMPLS)}")
    return kernels


# Generic bounds: every int in these configs is a size or count, every float a finite ratio
# (dropout: a probability); the pydantic type of each annotation, and how a message names it
MAX_INT = 2**20  # no size or count in these configs comes near it (GPT-2's vocabulary: 50,257)
MAX_FLOAT = 1000.0  # ratios and probabilities
_SIZE = Annotated[int, Field(ge=1, le=MAX_INT)]
_TYPES: dict[Any, Any] = {
    int: _SIZE,
    float: Annotated[float, Field(gt=0, le=MAX_FLOAT, allow_inf_nan=False)],
    ("dropout", float): Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)],
    list[int]: Annotated[list[_SIZE], Field(min_length=1)],
    dict[str, str]: Annotated[dict[str, str], AfterValidator(_check_kernels)],
}
_NAMES = {int: "an integer", float: "a number", bool: "true or false", bool | None: "true or false or null"}
_NAMES |= {list[int]: "a list of integers", dict[str, str]: "a mapping of names to strings"}
_KERNELS_HINT = "the job's kernels section (e.g. kernels.cross_entropy) still picks the loss kernel"
_HINTS = {family: typing.get_type_hints(module.Config) for family, module in _CONFIGS.items()}


@functools.cache
def _schema(fields: tuple[tuple[str, Any], ...]) -> type[BaseModel]:
    """A strict pydantic model of config fields, bounded as above."""
    types = {name: (_TYPES.get((name, tp), _TYPES.get(tp, tp)), None) for name, tp in fields}
    return create_model("Overrides", __config__=ConfigDict(extra="forbid", strict=True), **types)


def _invalid(values: dict, hints: dict[str, Any], family: str) -> Problems:
    """(field, message) for each field of `values` that `hints` (a Config's) refuses."""
    model = _schema(tuple(hints.items()))
    try:
        model.model_validate(values)
        return []
    except ValidationError as err:
        first = {e["loc"][0]: e for e in reversed(err.errors(include_url=False))}  # one per field
    return [
        (str(k), _message(first[k], model, hints.get(k), values[k], family)) for k in values if k in first
    ]


def _message(e: Any, model: type[BaseModel], tp: Any, value: Any, family: str) -> str:
    """One pydantic error about the field `e["loc"][0]`, annotated `tp` in the Config."""
    kind, loc = e["type"], e["loc"]
    if kind in ("extra_forbidden", "invalid_key"):
        if loc[0] == "kernels":
            return f"the {family} family has no ops with fused kernels; {_KERNELS_HINT}"
        return "unknown field" + did_you_mean_in(model, str(loc[0]))
    each = isinstance(value, list) and len(loc) > 1  # an item of a list
    got = value[loc[1]] if each else value
    if kind.startswith(("greater_than", "less_than")) or (kind == "float_type" and type(got) is int):
        allowed = f"> 0 and <= {MAX_FLOAT:g}" if tp is float else f"1 to {MAX_INT}"
        allowed = "in [0, 1)" if loc[0] == "dropout" else allowed
        return f"{'every item ' if each else ''}must be {allowed}, got {_short(got)}"
    if kind == "finite_number":
        return f"must be a finite number, got {got}"
    if kind == "too_short":
        return "must not be empty"
    if kind == "value_error":  # of _check_kernels
        return e["msg"].removeprefix("Value error, ")
    if each:
        return f"item {loc[1]}: expected {_NAMES[int]}, got {got!r}"
    if kind == "literal_error":
        choices = ", ".join(repr(a) for a in typing.get_args(tp))
        return f"expected one of {choices}, got {got!r}{close_literal(got, e['ctx']['expected'])}"
    return f"expected {_NAMES[tp]}, got {got!r}"


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
        problems += _invalid({"kernels": kernels}, {"kernels": dict[str, str]}, family)
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
    # validated anew: a copy, with YAML's 1 for 1.0 made a float
    model = _schema(tuple(_HINTS[family].items()))
    values.update(model.model_validate(overrides).model_dump(exclude_unset=True))
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
