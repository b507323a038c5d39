"""Checks of a job spec that need the data plane's registries (models, data sources).

`core.spec` reads and validates a spec against its schema and imports nothing of `workers/`;
this module adds what only the data plane knows:

- `job_problems(spec)`: what `validate` and `run` check: the model preset and overrides
  (against the shapes the data gives, e.g. 28x28 images), for a sweep each trial too.
- `data_problems(spec)`: whether the job's data is available on this machine. It is a
  run-time check, made where the job runs (`run --local`, torchrun, the Ray driver's
  preflight); `validate` only notes it, since the data may exist only on the cluster.

Each returns 'dotted.path: reason' lines; [] means no problem. Neither raises.
"""

from __future__ import annotations

import json
from typing import Any

from core.spec import JobSpec, SpecError, sweep, validate_fields
from workers import data, models


def job_problems(spec: JobSpec) -> list[str]:
    problems = _model_problems(spec, {})
    if spec.sweep is not None and not problems:
        raw = spec.model_dump(by_alias=True)
        shapes: dict[str, Any] = {}  # data shapes by data section: trials often share one
        problems = sweep.trial_problems(raw, lambda trial: _trial_problems(trial, shapes))
    return problems


def data_problems(spec: JobSpec) -> list[str]:
    return [f"data.{path}: {message}" for path, message in data.check(spec.data)]


def _model_problems(spec: JobSpec, shapes: dict[str, Any]) -> list[str]:
    info = _data_shapes(spec, shapes)
    return [
        f"model.{path}: {message}"
        for path, message in models.check(spec.model.family, spec.model.preset, spec.model.overrides, info)
    ]


def _trial_problems(trial: dict, shapes: dict[str, Any]) -> list[str]:
    try:
        spec = validate_fields(trial)
    except SpecError as err:  # the schema has checked every trial already; kept for safety
        return err.problems
    return _model_problems(spec, shapes)


def _data_shapes(spec: JobSpec, cache: dict[str, Any]) -> Any:
    """The input shapes the data gives (image size, classes, vocabulary), or None where they
    cannot be known here: remote data is not listed during a check, and the shapes of data
    absent from this machine are checked where the job runs."""
    path = spec.data.path or ""
    if "://" in path and not path.startswith("file://"):
        return None
    key = json.dumps(spec.data.model_dump(), sort_keys=True)
    if key not in cache:
        try:
            cache[key] = data.describe(spec.data)  # most sources know their shapes without the files
        except Exception:  # a check reports; it never stops on data it cannot read
            cache[key] = None
    return cache[key]
