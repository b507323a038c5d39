"""Loading a spec: a file plus `--set` overrides -> a validated `JobSpec`, or `SpecError`.

This is the one place a submission is validated: the CLI (or a driver started by `ray job
submit`) calls `load_spec` once, and every process after it passes the typed `JobSpec` on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from core.spec import sweep
from core.spec.checks import validate_fields
from core.spec.errors import SpecError, short
from core.spec.schema import JobSpec
from core.spec.yaml_reader import YAMLRefused, mapping_of_text, parse_yaml, read_yaml


def parse_override(text: str) -> tuple[list[str], Any]:
    """'train.steps=20' -> (['train', 'steps'], 20); values are YAML, typed later by the schema."""
    if "=" not in text:
        raise SpecError(
            [f"--set {short(text, quote=False)}: expected KEY=VALUE, e.g. train.steps=20"], "--set"
        )
    key, raw = text.split("=", 1)
    path = [part for part in key.strip().split(".")]
    if not all(path):
        raise SpecError([f"--set {short(text, quote=False)}: '{key}' is not a dotted field path"], "--set")
    try:
        value = parse_yaml(raw) if raw.strip() else ""
    except (yaml.YAMLError, YAMLRefused):
        value = raw
    return path, value


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    for text in overrides:
        path, value = parse_override(text)
        node = raw
        for i, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise SpecError([f"--set {text}: '{'.'.join(path[: i + 1])}' is not a section"], "--set")
            node = child
        node[path[-1]] = value
    return raw


def validate(raw: dict, source: str = "job spec") -> JobSpec:
    """A validated JobSpec; with a sweep, every trial it expands into must validate too (the
    trials, validated, are kept with the spec: `sweep.trials(spec)`)."""
    spec = validate_fields(raw, source)
    if spec.sweep is not None:
        try:
            sweep.expand(raw, into=spec)
        except SpecError as err:
            raise SpecError(err.problems, source) from None
    return spec


def load_spec(path: str | Path, overrides: list[str] | None = None) -> JobSpec:
    raw = read_yaml(path)
    raw = apply_overrides(raw, overrides or [])
    return validate(raw, str(path))


def load_spec_text(text: str, source: str, overrides: list[str] | None = None) -> JobSpec:
    """`load_spec` of a file's text; `source` names the file in errors, as the user named it."""
    raw = apply_overrides(mapping_of_text(text, source), overrides or [])
    return validate(raw, source)


def load_stored(path: str | Path) -> JobSpec:
    """A spec the service stored after validating it at submission (`submission.with_spec`): loaded into
    its typed form, not checked again."""
    try:
        return JobSpec.model_validate_json(Path(path).read_bytes())
    except (OSError, ValueError) as err:
        raise SpecError([f"not a stored job spec: {str(err).splitlines()[0]}"], str(path)) from None
