"""The job spec: one YAML file describes a training job end to end.

Every section forbids unknown keys so that a typo is an error, never a silently
ignored setting. `load_spec` turns a file plus `--set` overrides into a validated
`JobSpec`, or raises `SpecError` with one readable line per problem.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,62}$"


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)


class ModelSpec(Section):
    family: Literal["convnet", "resnet", "vit", "gpt"]
    preset: str
    overrides: dict[str, Any] = Field(default_factory=dict)


class DataSpec(Section):
    source: Literal["synthetic", "digits", "fashion-mnist", "text", "parquet"]
    path: str | None = None
    batch_size: int = Field(32, ge=1, description="global batch per optimizer step, across workers")
    eval_batch_size: int | None = Field(None, ge=1)
    loader_workers: int = Field(0, ge=0, le=64)
    eval_split: float = Field(0.1, ge=0.0, le=0.5)
    seq_len: int = Field(128, ge=1)
    num_samples: int = Field(1024, ge=1)
    kind: Literal["image", "tokens"] = "image"
    image_size: int = Field(32, ge=1)
    in_channels: int = Field(3, ge=1)
    num_classes: int = Field(10, ge=2)
    vocab_size: int = Field(256, ge=2)
    columns: dict[str, str] = Field(
        default_factory=lambda: {"image": "image", "label": "label", "tokens": "tokens"}
    )
    download: bool = False


class EarlyStoppingSpec(Section):
    patience: int = Field(..., ge=1, description="evaluations without improvement before stopping")
    min_delta: float = Field(0.0, ge=0.0)


class TrainSpec(Section):
    steps: int | None = Field(None, ge=1)
    epochs: int | None = Field(None, ge=1)
    grad_accum: int = Field(1, ge=1)
    clip_grad_norm: float | None = Field(1.0, gt=0.0)
    label_smoothing: float = Field(0.0, ge=0.0, lt=1.0)
    eval_every: int | None = Field(None, ge=1)
    eval_batches: int | None = Field(None, ge=1)
    seed: int = Field(0, ge=0)
    early_stopping: EarlyStoppingSpec | None = None

    @model_validator(mode="after")
    def _one_length(self):
        if (self.steps is None) == (self.epochs is None):
            raise ValueError(
                "set exactly one of train.steps or train.epochs"
                " (null unsets one, e.g. --set train.epochs=null)"
            )
        return self


class OptimizerSpec(Section):
    name: Literal["adamw", "sgd"] = "adamw"
    lr: float = Field(1e-3, gt=0.0, le=10.0)
    weight_decay: float = Field(0.0, ge=0.0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0.0)
    momentum: float = Field(0.9, ge=0.0, lt=1.0)

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, betas):
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"each beta must be in [0, 1), got {list(betas)}")
        return betas


class SchedulerSpec(Section):
    name: Literal["cosine", "onecycle", "constant"] = "cosine"
    warmup_steps: int = Field(0, ge=0)
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0)
    pct_start: float = Field(0.3, gt=0.0, lt=1.0, description="onecycle: share of steps spent rising")


class ParallelSpec(Section):
    strategy: Literal["none", "ddp", "fsdp2"] = "none"
    activation_checkpointing: Literal["none", "full", "selective"] = "none"
    checkpoint_every: int = Field(2, ge=1, description="selective: checkpoint every k-th block")
    selective_policy: Literal["blocks", "ops"] = Field(
        "blocks",
        description="selective: every k-th block ('blocks'), or every block saving only"
        " matmul and attention outputs ('ops')",
    )
    reshard_after_forward: bool = True
    cpu_offload: bool = False


class PrecisionSpec(Section):
    dtype: Literal["fp32", "bf16", "fp16", "fp8"] = "fp32"
    compile: bool = False
    fp8_recipe: Literal["tensorwise", "rowwise"] = "tensorwise"


KernelImpl = Literal["auto", "torch", "triton"]


class KernelsSpec(Section):
    attention: KernelImpl = "auto"
    layer_norm: KernelImpl = "auto"
    cross_entropy: KernelImpl = "auto"
    bias_gelu: KernelImpl = "auto"

    def as_dict(self) -> dict[str, str]:
        return self.model_dump()


class ResourcesSpec(Section):
    num_workers: int = Field(1, ge=1)
    gpus_per_worker: float = Field(0.0, ge=0.0)
    cpus_per_worker: float = Field(1.0, gt=0.0)


class CheckpointSpec(Section):
    storage: str = "./runs"
    every_steps: int | None = Field(None, ge=1)
    keep: int = Field(3, ge=1)
    resume: str = "auto"
    async_save: bool = Field(False, alias="async")

    @field_validator("storage")
    @classmethod
    def _storage_not_empty(cls, value: str):
        if not value.strip():
            raise ValueError("must be a path or URI, got an empty string")
        return value


class FaultToleranceSpec(Section):
    max_failures: int = Field(0, ge=-1, description="-1 retries forever")


class SchedulingSpec(Section):
    priority: int = Field(0, ge=0, le=1000)
    preemptible: bool = False


class MetricsSpec(Section):
    log_every: int = Field(10, ge=1)
    prometheus_port: int | None = Field(None, ge=1, le=65535)


class JobSpec(Section):
    name: str = Field(..., pattern=NAME_PATTERN)
    model: ModelSpec
    data: DataSpec
    train: TrainSpec
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    scheduler: SchedulerSpec = Field(default_factory=SchedulerSpec)
    parallel: ParallelSpec = Field(default_factory=ParallelSpec)
    precision: PrecisionSpec = Field(default_factory=PrecisionSpec)
    kernels: KernelsSpec = Field(default_factory=KernelsSpec)
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    fault_tolerance: FaultToleranceSpec = Field(default_factory=FaultToleranceSpec)
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec)
    metrics: MetricsSpec = Field(default_factory=MetricsSpec)

    @property
    def micro_batch_size(self) -> int:
        """Samples per worker per forward pass."""
        return self.data.batch_size // (self.resources.num_workers * self.train.grad_accum)


# --- cross-field checks -------------------------------------------------------------


def cross_field_problems(spec: JobSpec) -> list[str]:
    """Checks that span sections; each returns 'dotted.path: reason'."""
    problems = []
    workers, accum, batch = spec.resources.num_workers, spec.train.grad_accum, spec.data.batch_size
    if batch % (workers * accum):
        problems.append(
            f"data.batch_size: {batch} must be divisible by resources.num_workers x train.grad_accum"
            f" = {workers} x {accum} = {workers * accum}"
        )
    if spec.parallel.strategy == "none" and workers > 1:
        problems.append(
            f"parallel.strategy: 'none' trains on one worker, but resources.num_workers is {workers};"
            " use 'ddp' or 'fsdp2'"
        )
    if spec.precision.dtype == "fp16" and spec.parallel.strategy == "fsdp2":
        from workers import parallel  # lazy: the data plane says what it supports

        if not getattr(parallel, "SHARDED_GRAD_SCALER", False):
            problems.append(
                "precision.dtype: fp16 with parallel.strategy 'fsdp2' needs a sharded grad scaler; use bf16"
            )
    if spec.precision.dtype == "fp8" and spec.model.family not in {"vit", "gpt"}:
        problems.append(
            f"precision.dtype: fp8 applies to Linear layers of vit and gpt models, not '{spec.model.family}'"
        )
    if spec.checkpoint.async_save and spec.checkpoint.every_steps is None:
        problems.append("checkpoint.async: needs checkpoint.every_steps")
    if spec.train.eval_every is None and spec.train.early_stopping is not None:
        problems.append("train.early_stopping: needs train.eval_every")
    problems += _model_and_data_problems(spec)
    return problems


def _model_and_data_problems(spec: JobSpec) -> list[str]:
    from workers import data, models  # lazy: keeps `import orchestrator.spec` light

    problems = [f"data.{path}: {msg}" for path, msg in data.check(spec.data)]
    # with valid data, model constraints are checked on the shapes the data gives (28px, ...)
    data_info = None if problems else data.describe(spec.data)
    problems += [
        f"model.{path}: {msg}"
        for path, msg in models.check(spec.model.family, spec.model.preset, spec.model.overrides, data_info)
    ]
    return problems


# --- loading, overrides and error reporting -----------------------------------------


class SpecError(Exception):
    """A job spec that cannot run; `problems` holds one 'path: reason' line each."""

    def __init__(self, problems: list[str], source: str = "job spec"):
        self.problems = problems
        self.source = source
        super().__init__("\n".join(f"{source}: {p}" for p in problems))


def parse_override(text: str) -> tuple[list[str], Any]:
    """'train.steps=20' -> (['train', 'steps'], 20); values are YAML, typed later by the schema."""
    if "=" not in text:
        raise SpecError([f"--set {text}: expected KEY=VALUE, e.g. train.steps=20"], "--set")
    key, raw = text.split("=", 1)
    path = [part for part in key.strip().split(".")]
    if not all(path):
        raise SpecError([f"--set {text}: '{key}' is not a dotted field path"], "--set")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
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


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise SpecError(["no such file"], str(path)) from None
    except OSError as err:
        raise SpecError([f"cannot read: {err.strerror}"], str(path)) from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        reason = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise SpecError([f"YAML syntax error at {where}{reason}"], str(path)) from None
    if raw is None:
        raise SpecError(["the file is empty"], str(path))
    if not isinstance(raw, dict):
        raise SpecError(
            [f"expected a mapping of sections at the top level, got {type(raw).__name__}"], str(path)
        )
    return raw


def validate(raw: dict, source: str = "job spec") -> JobSpec:
    try:
        spec = JobSpec.model_validate(raw)
    except ValidationError as err:
        raise SpecError(_format_errors(err, raw), source) from None
    problems = cross_field_problems(spec)
    if problems:
        raise SpecError(problems, source)
    return spec


def load_spec(path: str | Path, overrides: list[str] | None = None) -> JobSpec:
    raw = read_yaml(path)
    raw = apply_overrides(raw, overrides or [])
    return validate(raw, str(path))


def _format_errors(err: ValidationError, raw: dict) -> list[str]:
    lines = []
    for e in err.errors(include_url=False):
        loc = [str(p) for p in e["loc"]]
        path = ".".join(loc) or "(top level)"
        kind, msg = e["type"], e["msg"]
        if kind == "extra_forbidden":
            lines.append(f"{path}: unknown field{_did_you_mean(loc)}")
            continue
        if kind == "missing":
            lines.append(f"{path}: required field is missing")
            continue
        got = _value_at(raw, e["loc"])
        if kind == "literal_error":
            allowed = e.get("ctx", {}).get("expected", "")
            lines.append(f"{path}: {got!r} is not allowed; expected {allowed}{_close_literal(got, allowed)}")
            continue
        if kind == "string_pattern_mismatch" and loc == ["name"]:
            msg = "must be lowercase letters, digits, '-', '_' or '.', starting with a letter or digit"
        elif kind == "value_error":
            msg = msg.removeprefix("Value error, ")
        # a whole section as "got" would bury the message: only show plain values
        plain = got is not _MISSING and not isinstance(got, (dict, list))
        lines.append(f"{path}: {msg} (got {got!r})" if plain else f"{path}: {msg}")
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


def _did_you_mean(loc: list[str]) -> str:
    """Suggest the closest allowed key for an unknown field."""
    model: Any = JobSpec
    for part in loc[:-1]:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return ""
        model = _section_type(field.annotation)
        if model is None:
            return ""
    names = []
    for name, field in model.model_fields.items():
        names += [name] + ([field.alias] if field.alias else [])
    close = difflib.get_close_matches(loc[-1], names, n=1, cutoff=0.6)
    if close:
        return f"; did you mean '{close[0]}'?"
    return f"; allowed: {', '.join(sorted(names))}"


def _section_type(annotation):
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):  # Optional[Section]
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def _close_literal(got: Any, allowed: str) -> str:
    options = [o.strip().strip("'") for o in allowed.replace(" or ", ", ").split(",")]
    close = difflib.get_close_matches(str(got), options, n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


# --- features the spec accepts but this build does not run yet -------------------------


def unimplemented(spec: JobSpec) -> list[str]:
    """Settings that validate but are not wired up yet: running them must fail loudly."""
    from workers import parallel, precision

    problems = []
    if spec.parallel.strategy not in parallel.STRATEGIES:
        problems.append(f"parallel.strategy: '{spec.parallel.strategy}' is not implemented yet")
    if spec.parallel.activation_checkpointing != "none" and not parallel.ACTIVATION_CHECKPOINTING:
        problems.append("parallel.activation_checkpointing: is not implemented yet")
    if spec.parallel.cpu_offload and spec.parallel.strategy != "fsdp2":
        problems.append("parallel.cpu_offload: only applies to parallel.strategy 'fsdp2'")
    if spec.precision.dtype not in precision.DTYPES:
        problems.append(f"precision.dtype: '{spec.precision.dtype}' is not implemented yet")
    if spec.precision.compile and not precision.COMPILE:
        problems.append("precision.compile: is not implemented yet")
    if spec.checkpoint.async_save and not getattr(parallel, "ASYNC_CHECKPOINT", False):
        problems.append("checkpoint.async: is not implemented yet")
    if spec.scheduling.priority != 0 or spec.scheduling.preemptible:
        problems.append(
            "scheduling: priorities and preemption are not implemented yet; leave scheduling at its defaults"
        )
    if spec.metrics.prometheus_port is not None:
        problems.append("metrics.prometheus_port: the Prometheus exporter is not implemented yet")
    return problems
