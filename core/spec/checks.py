"""The rules of a job spec that span fields, and `validate_fields`: schema plus those rules.

Each rule needs nothing but the spec (no data, no model registry: those checks are made
where the data plane is, `workers/checks.py`) and gives 'dotted.path: reason' lines.
"""

from __future__ import annotations

from typing import Any, get_args, get_origin

from pydantic import ValidationError

from core.spec.errors import SpecError, did_you_mean_in, format_errors
from core.spec.schema import JobSpec, field_named, section_type


def cross_field_problems(spec: JobSpec) -> list[str]:
    """Rules that span fields and need nothing but the spec; each returns 'dotted.path: reason'."""
    problems = []
    workers, accum, batch = spec.resources.max_workers, spec.train.grad_accum, spec.data.batch_size
    most = "resources.num_workers.max" if spec.resources.elastic else "resources.num_workers"
    if batch % (workers * accum):
        problems.append(
            f"data.batch_size: {batch} must be divisible by {most} x train.grad_accum"
            f" = {workers} x {accum} = {workers * accum}"
        )
    if spec.parallel.strategy == "none" and workers > 1:
        problems.append(
            f"parallel.strategy: 'none' trains on one worker, but {most} is {workers}; use 'ddp' or 'fsdp2'"
        )
    if spec.resources.elastic and len(spec.worker_sizes()) < 2:
        low, divisors = (
            spec.resources.min_workers,
            [n for n in range(1, workers + 1) if workers * accum % n == 0],
        )
        problems.append(
            f"resources.num_workers: from min {low} to max {workers} the global batch splits evenly only at"
            f" {workers} workers; sizes that divide max x train.grad_accum = {workers * accum}:"
            f" {', '.join(map(str, divisors))}"
        )
    if spec.parallel.cpu_offload and spec.parallel.strategy != "fsdp2":
        problems.append("parallel.cpu_offload: only applies to parallel.strategy 'fsdp2'")
    if spec.precision.dtype == "fp8" and spec.model.family not in {"vit", "gpt"}:
        problems.append(
            f"precision.dtype: fp8 applies to Linear layers of vit and gpt models, not '{spec.model.family}'"
        )
    if spec.checkpoint.async_save and spec.checkpoint.every_steps is None:
        problems.append("checkpoint.async: needs checkpoint.every_steps")
    if spec.train.eval_every is None and spec.train.early_stopping is not None:
        problems.append("train.early_stopping: needs train.eval_every")
    if spec.data.augment is not None and (spec.data.source == "text" or spec.data.kind == "tokens"):
        problems.append("data.augment: applies to image data only")
    if spec.data.source == "parquet" and not spec.data.path:
        problems.append("data.path: required for source 'parquet' (a directory, file or URI)")
    problems += _replica_group_problems(spec)
    if spec.sweep is not None:
        problems += _sweep_problems(spec)
    return problems


def _replica_group_problems(spec: JobSpec) -> list[str]:
    groups, workers = spec.fault_tolerance.replica_groups, spec.resources.max_workers
    if groups == 1:
        return []
    if spec.resources.elastic:
        return ["fault_tolerance.replica_groups: not with an elastic resources.num_workers"]
    field = "fault_tolerance.replica_groups"
    if workers % groups:
        return [f"{field}: {groups} groups do not divide resources.num_workers ({workers})"]
    return []


def _sweep_problems(spec: JobSpec) -> list[str]:
    problems = []
    longest = 63 - len("-000")  # trial names: <name>-NNN, within NAME_PATTERN
    if len(spec.name) > longest:
        problems.append(
            f"name: a sweep names its trials <name>-NNN, so its name has at most {longest} characters"
            f" (this one has {len(spec.name)})"
        )
    for path in spec.sweep.parameters:
        reason = sweepable(path)
        if reason:
            problems.append(f"sweep.parameters.{path}: {reason}")
    return problems


def sweepable(path: str) -> str | None:
    """None if the dotted path names a spec field a sweep may set, else the reason it may not."""
    parts = path.split(".")
    if not all(parts):
        return "not a dotted field path, e.g. optimizer.lr"
    if parts[0] in ("name", "sweep"):
        return f"'{parts[0]}' cannot be swept (trials are named <name>-NNN)"
    model: Any = JobSpec
    for i, part in enumerate(parts):
        field = field_named(model, part)
        if field is None:
            where = ".".join(parts[:i]) or "the top level"
            return f"unknown field '{part}' in {where}{did_you_mean_in(model, part)}"
        rest = parts[i + 1 :]
        if not rest:
            return None
        if get_origin(field.annotation) is dict:
            # free-form mappings: model.overrides (checked by the model registry), data.columns
            value_type = get_args(field.annotation)[1]
            return (
                None
                if value_type is Any or len(rest) == 1
                else f"'{'.'.join(parts[: i + 2])}' is not a section"
            )
        model = section_type(field.annotation)
        if model is None:
            return f"'{'.'.join(parts[: i + 1])}' is a value, not a section"
    return None


def validate_fields(raw: dict, source: str = "job spec") -> JobSpec:
    """The schema and the cross-field rules; a sweep's section, but not its trials."""
    try:
        spec = JobSpec.model_validate(raw)
    except ValidationError as err:
        raise SpecError(format_errors(err, raw), source) from None
    problems = cross_field_problems(spec)
    if problems:
        raise SpecError(problems, source)
    return spec
