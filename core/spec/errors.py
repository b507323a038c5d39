"""Spec errors: `SpecError` carries one readable 'dotted.path: reason' line per problem.

`format_errors` turns pydantic's validation errors into such lines, with the allowed range
of a number, the closest allowed value of a choice, and the closest field name of a typo.
"""

from __future__ import annotations

import difflib
from typing import Any, get_origin

from pydantic import ValidationError
from pydantic.fields import FieldInfo

from core.spec.schema import JobSpec, field_named, section_type

MAX_PROBLEMS = 50  # lines of one error report


class SpecError(Exception):
    """A job spec that cannot run; `problems` holds one 'path: reason' line each."""

    def __init__(self, problems: list[str], source: str = "job spec"):
        lines = [_one_line(p) for p in problems]
        if len(lines) > MAX_PROBLEMS:
            lines = lines[: MAX_PROBLEMS - 1] + [f"... and {len(lines) - MAX_PROBLEMS + 1} more problems"]
        self.problems = lines
        self.source = source
        super().__init__("\n".join(f"{source}: {p}" for p in lines))


def _one_line(problem: str, limit: int = 500) -> str:
    line = " ".join(str(problem).split("\n"))
    return line if len(line) <= limit else line[: limit - 3] + "..."


def format_errors(err: ValidationError, raw: Any, prefix: tuple = (), root: Any = JobSpec) -> list[str]:
    """pydantic's errors as 'dotted.path: reason' lines; `prefix` places `raw` inside a spec.
    `root`: the model `raw` was validated against (a job spec; the queue configuration)."""
    lines = []
    for e in err.errors(include_url=False):
        loc = [*prefix, *e["loc"]]
        path = ".".join(str(p) for p in loc) or "(top level)"
        kind, msg = e["type"], e["msg"]
        got = _value_at(raw, e["loc"])
        if kind == "extra_forbidden":
            lines.append(f"{path}: unknown field{_did_you_mean([str(p) for p in loc], root)}")
        elif kind == "missing":
            lines.append(f"{path}: required field is missing")
        elif kind == "invalid_key":
            parent = ".".join(str(p) for p in loc[:-1]) or "(top level)"
            lines.append(f"{parent}: the key {short(loc[-1])} is not a field name (field names are text)")
        elif kind == "literal_error":
            allowed = e.get("ctx", {}).get("expected", "")
            lines.append(
                f"{path}: {short(got)} is not allowed; expected {allowed}{close_literal(got, allowed)}"
            )
        elif kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal") or (
            kind == "float_type" and type(got) is int
        ):
            allowed = _allowed_range(loc, root) or _bound(e.get("ctx", {}))
            lines.append(f"{path}: {short(got)} is out of range; allowed: {allowed}")
        elif kind == "finite_number":
            lines.append(f"{path}: must be a finite number (got {short(got)})")
        elif kind in ("model_type", "model_attributes_type", "dict_type"):
            lines.append(f"{path}: expected a mapping of fields (a section), got {value_kind(got)}")
        elif kind in ("list_type", "tuple_type"):
            lines.append(f"{path}: expected a list, got {value_kind(got)}")
        else:
            if kind == "string_pattern_mismatch" and loc[-1] in ("name", "queue"):
                msg = "must be lowercase letters, digits, '-', '_' or '.', starting with a letter or digit"
            elif kind == "value_error":
                msg = msg.removeprefix("Value error, ")
            if got is _MISSING or kind in ("too_short", "too_long") or msg.startswith(f"{short(got)} "):
                lines.append(f"{path}: {msg}")  # (a message that starts with the value has said it)
            else:
                lines.append(f"{path}: {msg} (got {short(got) if _is_plain(got) else value_kind(got)})")
    # pydantic reports each failed branch of Optional/Union separately; keep one per path
    return list(dict.fromkeys(lines))


_MISSING = object()


def _value_at(raw: Any, loc) -> Any:
    node = raw
    for part in loc:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return _MISSING
    return node


def _is_plain(value: Any) -> bool:
    return not isinstance(value, (dict, list, tuple, set))


def value_kind(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    if value is None:
        return "null"
    return f"{type(value).__name__} {short(value)}"


def short(value: Any, limit: int = 80, quote: bool = True) -> str:
    """repr (or str) of a value a user wrote, cut to `limit` characters."""
    try:
        text = repr(value) if quote else str(value)
    except ValueError:  # an integer too long to print
        text = f"<an integer of about {int(value.bit_length() * 0.30103)} digits>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _field_at(loc: list, root: Any = JobSpec) -> FieldInfo | None:
    """The schema field a validation error's location points at (dict keys are skipped)."""
    model: Any = root
    field = None
    i = 0
    while i < len(loc):
        field = field_named(model, str(loc[i]))
        if field is None:
            return None
        i += 1
        if i == len(loc):
            return field
        if get_origin(field.annotation) is dict:
            i += 1  # the key of a mapping such as sweep.parameters
        model = section_type(field.annotation)
        if model is None:
            return None
    return field


def _allowed_range(loc: list, root: Any = JobSpec) -> str:
    """ "0 to 1", ">= 5": the bounds the schema gives the field at `loc` ("" if none are found)."""
    field = _field_at([p for p in loc if not isinstance(p, int)], root)
    bounds = {}
    for item in getattr(field, "metadata", []):
        for name in ("ge", "gt", "le", "lt"):
            if getattr(item, name, None) is not None:
                bounds[name] = getattr(item, name)
    if "ge" in bounds and "le" in bounds:
        return f"{_number(bounds['ge'])} to {_number(bounds['le'])}"
    words = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    return " and ".join(f"{words[k]} {_number(v)}" for k, v in bounds.items())


def _bound(ctx: dict) -> str:
    """The bound pydantic names in a range error (a value inside a mapping, whose field the
    schema walk does not reach)."""
    words = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    found = [f"{words[k]} {_number(ctx[k])}" for k in words if k in ctx]
    return " and ".join(found) or "see the README"


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def _did_you_mean(loc: list[str], root: Any = JobSpec) -> str:
    """Suggest the closest allowed key for an unknown field."""
    parent = _field_at(loc[:-1], root) if len(loc) > 1 else None
    model = root if len(loc) == 1 else section_type(parent.annotation) if parent else None
    if model is None:
        return ""
    return did_you_mean_in(model, loc[-1])


def did_you_mean_in(model: Any, word: str) -> str:
    names = []
    for name, field in model.model_fields.items():
        names += [name] + ([field.alias] if field.alias else [])
    close = difflib.get_close_matches(word, names, n=1, cutoff=0.6)
    if close:
        return f"; did you mean '{close[0]}'?"
    return f"; allowed: {', '.join(sorted(names))}"


def close_literal(got: Any, allowed: str) -> str:
    options = [o.strip().strip("'") for o in allowed.replace(" or ", ", ").split(",")]
    close = difflib.get_close_matches(short(got, quote=False), options, n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""
