"""The job spec: one YAML file describes a training job end to end.

Every section forbids unknown keys so that a typo is an error, never a silently
ignored setting, and every number has a range. `load_spec` turns a file plus `--set`
overrides into a validated `JobSpec`, or raises `SpecError` with one readable line per
problem, whatever the file holds (bytes that are not text, YAML bombs, duplicate keys).

This module owns the schema and its allowed values and imports nothing of the data plane
(`workers/`): the checks that need the model and data registries are in
`orchestrator/checks.py`.
"""

from __future__ import annotations

import difflib
import math
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo

NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,62}$"

# upper bounds: beyond what the runtime can hold or any job could use
MAX_STEPS = 10**9  # steps, step intervals, batches
MAX_EPOCHS = 10**6
MAX_BATCH = 2**20  # samples per optimizer step
MAX_SIZE = 2**20  # sequence lengths, vocabularies, classes
MAX_SAMPLES = 10**8  # generated items
MAX_WORKERS = 4096
MAX_SEED = 2**63 - 1  # what torch.manual_seed and numpy take
MAX_PATH = 4096  # characters of a path or URI
MAX_TRIALS = 1000  # trials of one sweep
MAX_SWEEP_PARAMETERS = 32


class Section(BaseModel):
    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, populate_by_name=True, allow_inf_nan=False
    )


class ModelSpec(Section):
    family: Literal["convnet", "resnet", "vit", "gpt"]
    preset: str = Field(..., max_length=64)
    overrides: dict[str, Any] = Field(default_factory=dict)


class AugmentSpec(Section):
    """Random image augmentation of the training set (never of the eval set)."""

    shift: int = Field(0, ge=0, le=64, description="move each image by up to N pixels (pad and crop)")
    horizontal_flip: bool = False


class DataSpec(Section):
    source: Literal["synthetic", "digits", "fashion-mnist", "text", "parquet"]
    path: str | None = Field(None, max_length=MAX_PATH)
    batch_size: int = Field(32, ge=1, le=MAX_BATCH, description="global batch per optimizer step")
    eval_batch_size: int | None = Field(None, ge=1, le=MAX_BATCH)
    loader_workers: int = Field(0, ge=0, le=64)
    eval_split: float = Field(0.1, ge=0.0, le=0.5)
    seq_len: int = Field(128, ge=1, le=MAX_SIZE)
    num_samples: int = Field(1024, ge=1, le=MAX_SAMPLES)
    kind: Literal["image", "tokens"] = "image"
    image_size: int = Field(32, ge=1, le=16384)
    in_channels: int = Field(3, ge=1, le=1024)
    num_classes: int = Field(10, ge=2, le=MAX_SIZE)
    vocab_size: int = Field(256, ge=2, le=MAX_SIZE)
    columns: dict[str, str] = Field(
        default_factory=lambda: {"image": "image", "label": "label", "tokens": "tokens"}
    )
    download: bool = False
    augment: AugmentSpec | None = None


class EarlyStoppingSpec(Section):
    patience: int = Field(..., ge=1, le=10**6, description="evaluations without improvement before stopping")
    min_delta: float = Field(0.0, ge=0.0, le=1e6)


class TrainSpec(Section):
    steps: int | None = Field(None, ge=1, le=MAX_STEPS)
    epochs: int | None = Field(None, ge=1, le=MAX_EPOCHS)
    grad_accum: int = Field(1, ge=1, le=4096)
    clip_grad_norm: float | None = Field(1.0, gt=0.0, le=1e6)
    label_smoothing: float = Field(0.0, ge=0.0, lt=1.0)
    eval_every: int | None = Field(None, ge=1, le=MAX_STEPS)
    eval_batches: int | None = Field(None, ge=1, le=MAX_STEPS)
    seed: int = Field(0, ge=0, le=MAX_SEED)
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
    weight_decay: float = Field(0.0, ge=0.0, le=10.0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0.0, le=1.0)
    momentum: float = Field(0.9, ge=0.0, lt=1.0)

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, betas):
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"each beta must be in [0, 1), got {list(betas)}")
        return betas


class SchedulerSpec(Section):
    name: Literal["cosine", "onecycle", "constant"] = "cosine"
    warmup_steps: int = Field(0, ge=0, le=MAX_STEPS)
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0)
    pct_start: float = Field(0.3, gt=0.0, lt=1.0, description="onecycle: share of steps spent rising")


class ParallelSpec(Section):
    strategy: Literal["none", "ddp", "fsdp2"] = "none"
    activation_checkpointing: Literal["none", "full", "selective"] = "none"
    checkpoint_every: int = Field(2, ge=1, le=1024, description="selective: checkpoint every k-th block")
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
    num_workers: int = Field(1, ge=1, le=MAX_WORKERS)
    gpus_per_worker: float = Field(0.0, ge=0.0, le=64.0)
    cpus_per_worker: float = Field(1.0, gt=0.0, le=1024.0)
    # other Ray resources each worker needs, e.g. {"accelerator_type:H100": 0.001} or a custom
    # resource a node was started with
    custom_per_worker: dict[str, float] = Field(default_factory=dict, max_length=16)

    @field_validator("custom_per_worker")
    @classmethod
    def _custom_resources(cls, value: dict[str, float]):
        for name, amount in value.items():
            if name in ("CPU", "GPU") or not name or len(name) > 128:
                raise ValueError(
                    f"'{name}': use cpus_per_worker / gpus_per_worker for CPU and GPU"
                    if name in ("CPU", "GPU")
                    else f"'{name[:40]}' is not a resource name"
                )
            if not (math.isfinite(amount) and 0 < amount <= 1e6):
                raise ValueError(f"{name}: {amount} is out of range; allowed: above 0 up to 1000000")
        return value


class CheckpointSpec(Section):
    storage: str = Field("./runs", max_length=MAX_PATH)
    every_steps: int | None = Field(None, ge=1, le=MAX_STEPS)
    keep: int = Field(3, ge=1, le=1000)
    resume: str = Field("auto", max_length=MAX_PATH)
    async_save: bool = Field(False, alias="async")

    @field_validator("storage")
    @classmethod
    def _storage_not_empty(cls, value: str):
        if not value.strip():
            raise ValueError("must be a path or URI, got an empty string")
        return value


class FaultToleranceSpec(Section):
    max_failures: int = Field(0, ge=-1, le=1000, description="-1 retries forever")


class SchedulingSpec(Section):
    priority: int = Field(0, ge=0, le=1000, description="higher runs first")
    preemptible: bool = False
    queue: str = Field("default", pattern=NAME_PATTERN)
    preemption_grace_s: float = Field(
        60.0, ge=0.0, le=3600.0, description="a preempted job's time to checkpoint and stop"
    )


class MetricsSpec(Section):
    log_every: int = Field(10, ge=1, le=MAX_STEPS)
    tensorboard: bool = False


# --- sweeps: the schema (expansion and ranking: orchestrator/sweep.py) ---------------

METRICS = (
    "eval_loss",
    "eval_accuracy",
    "eval_perplexity",
    "final_train_loss",
    "samples_per_s",
    "tokens_per_s",
)
MAXIMIZED = ("eval_accuracy", "samples_per_s", "tokens_per_s")  # the default mode is max for these
SWEEP_BOUND = 1e18  # |low|, |high| of a distribution


class SweepParameter(Section):
    values: list[Any] | None = Field(None, min_length=1, max_length=MAX_TRIALS)
    distribution: Literal["uniform", "log_uniform", "int_uniform"] | None = None
    low: int | float | None = None
    high: int | float | None = None

    @model_validator(mode="after")
    def _values_or_distribution(self):
        if (self.values is None) == (self.distribution is None):
            raise ValueError("give either values: [...] or a distribution with low and high")
        if self.distribution is None:
            if self.low is not None or self.high is not None:
                raise ValueError("low and high go with a distribution, not with values")
            return self
        low, high = self.low, self.high
        if low is None or high is None:
            raise ValueError(f"distribution {self.distribution} needs low and high")
        if not (abs(low) <= SWEEP_BOUND and abs(high) <= SWEEP_BOUND):
            raise ValueError(f"low and high are out of range; allowed: -{SWEEP_BOUND:g} to {SWEEP_BOUND:g}")
        if not low < high:
            raise ValueError(f"low must be below high, got low {low} and high {high}")
        if self.distribution == "log_uniform" and low <= 0:
            raise ValueError(f"log_uniform needs low > 0, got {low}")
        if self.distribution == "int_uniform" and not (type(low) is int and type(high) is int):
            raise ValueError(f"int_uniform needs integer low and high, got {low} and {high}")
        return self


class SweepSpec(Section):
    method: Literal["grid", "random"]
    parameters: dict[str, SweepParameter] = Field(..., min_length=1, max_length=MAX_SWEEP_PARAMETERS)
    num_samples: int | None = Field(None, ge=1, le=MAX_TRIALS, description="random: trials to draw")
    max_concurrent: int | None = Field(None, ge=1, le=MAX_TRIALS, description="trials running at once")
    seed: int = Field(0, ge=0, le=MAX_SEED)
    metric: Literal[METRICS] = "eval_loss"
    mode: Literal["min", "max"] = "min"

    @model_validator(mode="before")
    @classmethod
    def _default_mode(cls, data):
        # unset: minimize losses, maximize accuracy and throughput
        if isinstance(data, dict) and data.get("mode") is None:
            data = {**data, "mode": "max" if data.get("metric") in MAXIMIZED else "min"}
        return data

    @model_validator(mode="after")
    def _method_fits(self):
        if self.method == "random" and self.num_samples is None:
            raise ValueError(f"method random needs num_samples (1 to {MAX_TRIALS})")
        if self.method == "grid":
            if self.num_samples is not None:
                raise ValueError("num_samples applies to method random; grid runs every combination")
            drawn = [path for path, p in self.parameters.items() if p.values is None]
            if drawn:
                raise ValueError(
                    f"grid needs values for every parameter; {', '.join(drawn)} has a distribution"
                    " (distributions are for method random)"
                )
            trials = math.prod(len(p.values) for p in self.parameters.values())
            if trials > MAX_TRIALS:
                raise ValueError(f"the grid has {trials} combinations; at most {MAX_TRIALS}")
        return self


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
    sweep: SweepSpec | None = None

    @property
    def micro_batch_size(self) -> int:
        """Samples per worker per forward pass."""
        return self.data.batch_size // (self.resources.num_workers * self.train.grad_accum)


# --- cross-field checks -------------------------------------------------------------


def cross_field_problems(spec: JobSpec) -> list[str]:
    """Rules that span fields and need nothing but the spec; each returns 'dotted.path: reason'."""
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
    if spec.sweep is not None:
        problems += _sweep_problems(spec)
    return problems


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
        field = _field_named(model, part)
        if field is None:
            where = ".".join(parts[:i]) or "the top level"
            return f"unknown field '{part}' in {where}{_did_you_mean_in(model, part)}"
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
        model = _section_type(field.annotation)
        if model is None:
            return f"'{'.'.join(parts[: i + 1])}' is a value, not a section"
    return None


# --- reading YAML: bounded in size, time and memory ---------------------------------

MAX_SPEC_BYTES = 256 * 1024  # a job spec is a few KiB; parsing 256 KiB takes at most ~0.3 s
MAX_DEPTH = 32  # nesting levels (a spec needs about 6)
MAX_ALIASES = 64  # *alias references in one document
MAX_VALUES = 10_000  # values in the document, once every alias is expanded
MAX_PROBLEMS = 50  # lines of one error report


class YAMLRefused(Exception):
    """YAML that parses but is refused (duplicate keys, limits); `line` is 1-based."""

    def __init__(self, message: str, line: int | None = None):
        self.line = line
        super().__init__(f"line {line}: {message}" if line else message)


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses deep nesting and alias bombs while composing and names bad values'
    lines while constructing."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0
        self._nodes = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                line = self.peek_event().start_mark.line + 1
                raise YAMLRefused(f"more than {MAX_ALIASES} aliases (*name); a job spec needs a few", line)
            return super().compose_node(parent, index)
        self._depth += 1
        self._nodes += 1
        if self._depth > MAX_DEPTH:
            line = self.peek_event().start_mark.line + 1
            raise YAMLRefused(f"nested more than {MAX_DEPTH} levels deep", line)
        if self._nodes > MAX_VALUES:  # stop early: pure-Python parsing costs ~20 us a value
            line = self.peek_event().start_mark.line + 1
            raise YAMLRefused(f"more than {MAX_VALUES} values; a job spec has a few hundred", line)
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, OverflowError) as err:  # e.g. a date 2026-02-30, a 5,000-digit integer
            reason = "too many digits" if "integer string conversion" in str(err) else str(err)
            raise YAMLRefused(
                f"cannot read the value {_short(node.value)}: {reason}", node.start_mark.line + 1
            ) from None


def _children(node) -> list:
    if isinstance(node, yaml.SequenceNode):
        return node.value
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _check_graph(root, loader: _Loader) -> None:
    """Refuse recursive aliases, alias chains nested too deep, documents that expand to too
    many values, and duplicate keys; visits each node once (iteratively: no recursion limit)."""
    size: dict[int, int] = {}  # id(node) -> values once expanded
    depth: dict[int, int] = {}
    open_nodes: set[int] = set()  # the path from the root to the node being visited
    stack = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            children = _children(node)
            size[key] = 1 + sum(size[id(c)] for c in children)
            depth[key] = 1 + max((depth[id(c)] for c in children), default=0)
            open_nodes.discard(key)
            line = node.start_mark.line + 1
            if size[key] > MAX_VALUES:
                raise YAMLRefused(
                    f"the document expands to more than {MAX_VALUES} values through anchors and"
                    " aliases; a job spec has a few hundred",
                    line,
                )
            if depth[key] > MAX_DEPTH:
                raise YAMLRefused(f"nested more than {MAX_DEPTH} levels deep (through aliases)", line)
            continue
        if key in size:
            continue
        if key in open_nodes:
            raise YAMLRefused(
                "an alias refers to a node that contains it (a recursive structure)", node.start_mark.line + 1
            )
        open_nodes.add(key)
        if isinstance(node, yaml.MappingNode):
            _check_duplicate_keys(node, loader)
        stack.append((node, True))
        stack += [(child, False) for child in _children(node)]


def _check_duplicate_keys(node, loader: _Loader) -> None:
    first_line: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
            continue  # merged keys may be overridden; complex keys are refused by the constructor
        key = loader.construct_object(key_node)
        line = key_node.start_mark.line + 1
        try:
            earlier = first_line.get(key)
        except TypeError:  # unhashable: the constructor says so
            continue
        if earlier is not None:
            raise YAMLRefused(
                f"duplicate key '{_short(key, 60, quote=False)}' (first at line {earlier}, again at line"
                f" {line}); each key may appear once per mapping",
                line,
            )
        first_line[key] = line


def parse_yaml(text: str) -> Any:
    """One YAML document, or None if there is none; raises yaml.YAMLError or YAMLRefused."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_graph(node, loader)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _yaml_problem(err: yaml.YAMLError, text: str) -> str:
    """One line for a YAML error, with its line (and column)."""
    if isinstance(err, yaml.reader.ReaderError):
        line = text.count("\n", 0, err.position) + 1
        code = ord(err.character) if isinstance(err.character, str) else err.character
        return f"line {line}: unacceptable character #x{code:04x}; YAML allows no control characters"
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    if mark is None:
        return f"YAML syntax error: {problem}"
    lines = text.splitlines()
    source_line = lines[mark.line] if mark.line < len(lines) else ""
    indent = source_line[: len(source_line) - len(source_line.lstrip(" \t"))]
    if "\t" in indent:
        return f"line {mark.line + 1}: a tab character indents this line; YAML indents with spaces only"
    if "'\\t'" in problem:
        return (
            f"line {mark.line + 1}, column {mark.column + 1}: a tab character; YAML separates values"
            " with spaces (tabs may appear only inside quoted strings and comments)"
        )
    context = getattr(err, "context", None)
    context_mark = getattr(err, "context_mark", None)
    if context and context_mark is not None and context_mark.line != mark.line:
        problem += f" ({context} at line {context_mark.line + 1})"
    return f"YAML syntax error at line {mark.line + 1}, column {mark.column + 1}: {problem}"


def _read_bytes(path: Path) -> bytes:
    source = str(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SPEC_BYTES + 1)
    except FileNotFoundError:
        raise SpecError(["no such file"], source) from None
    except IsADirectoryError:
        raise SpecError(["is a directory, not a job spec file"], source) from None
    except OSError as err:
        raise SpecError([f"cannot read: {err.strerror or err}"], source) from None
    except ValueError as err:  # e.g. a NUL byte in the path
        raise SpecError([f"not a usable file path: {err}"], source) from None
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError([f"larger than {MAX_SPEC_BYTES // 1024} KiB; a job spec is a few KiB"], source)
    return data


def _decode(data: bytes, source: str) -> str:
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise SpecError(
            [f"not UTF-8 text: byte 0x{data[err.start]:02x} at offset {err.start} (line {line})"], source
        ) from None


def read_yaml(path: str | Path) -> dict:
    """The top-level mapping of a spec file; SpecError with one line for anything else."""
    path = Path(path)
    source = str(path)
    text = _decode(_read_bytes(path), source)
    try:
        raw = parse_yaml(text)
    except yaml.YAMLError as err:
        raise SpecError([_yaml_problem(err, text)], source) from None
    except YAMLRefused as err:
        raise SpecError([str(err)], source) from None
    if raw is None:
        detail = "" if not text.strip() else " (nothing but comments and blank lines)"
        raise SpecError([f"the file is empty{detail}"], source)
    if not isinstance(raw, dict):
        raise SpecError([f"expected a mapping of sections at the top level, got {_kind(raw)}"], source)
    return raw


# --- loading, overrides and error reporting -----------------------------------------


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


def parse_override(text: str) -> tuple[list[str], Any]:
    """'train.steps=20' -> (['train', 'steps'], 20); values are YAML, typed later by the schema."""
    if "=" not in text:
        raise SpecError(
            [f"--set {_short(text, quote=False)}: expected KEY=VALUE, e.g. train.steps=20"], "--set"
        )
    key, raw = text.split("=", 1)
    path = [part for part in key.strip().split(".")]
    if not all(path):
        raise SpecError([f"--set {_short(text, quote=False)}: '{key}' is not a dotted field path"], "--set")
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


def validate(raw: dict, source: str = "job spec") -> JobSpec:
    """A validated JobSpec; with a sweep, every trial it expands into must validate too."""
    spec = validate_fields(raw, source)
    if spec.sweep is not None:
        from orchestrator import sweep  # built on this module; it never imports the data plane

        try:
            sweep.expand(raw)
        except SpecError as err:
            raise SpecError(err.problems, source) from None
    return spec


def load_spec(path: str | Path, overrides: list[str] | None = None) -> JobSpec:
    raw = read_yaml(path)
    raw = apply_overrides(raw, overrides or [])
    return validate(raw, str(path))


def format_errors(err: ValidationError, raw: Any, prefix: tuple = ()) -> list[str]:
    """pydantic's errors as 'dotted.path: reason' lines; `prefix` places `raw` inside a spec."""
    lines = []
    for e in err.errors(include_url=False):
        loc = [*prefix, *e["loc"]]
        path = ".".join(str(p) for p in loc) or "(top level)"
        kind, msg = e["type"], e["msg"]
        got = _value_at(raw, e["loc"])
        if kind == "extra_forbidden":
            lines.append(f"{path}: unknown field{_did_you_mean([str(p) for p in loc])}")
        elif kind == "missing":
            lines.append(f"{path}: required field is missing")
        elif kind == "invalid_key":
            parent = ".".join(str(p) for p in loc[:-1]) or "(top level)"
            lines.append(f"{parent}: the key {_short(loc[-1])} is not a field name (field names are text)")
        elif kind == "literal_error":
            allowed = e.get("ctx", {}).get("expected", "")
            lines.append(
                f"{path}: {_short(got)} is not allowed; expected {allowed}{_close_literal(got, allowed)}"
            )
        elif kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal") or (
            kind == "float_type" and type(got) is int
        ):
            lines.append(f"{path}: {_short(got)} is out of range; allowed: {_allowed_range(loc)}")
        elif kind == "finite_number":
            lines.append(f"{path}: must be a finite number (got {_short(got)})")
        elif kind in ("model_type", "model_attributes_type", "dict_type"):
            lines.append(f"{path}: expected a mapping of fields (a section), got {_kind(got)}")
        elif kind in ("list_type", "tuple_type"):
            lines.append(f"{path}: expected a list, got {_kind(got)}")
        else:
            if kind == "string_pattern_mismatch" and loc[-1] in ("name", "queue"):
                msg = "must be lowercase letters, digits, '-', '_' or '.', starting with a letter or digit"
            elif kind == "value_error":
                msg = msg.removeprefix("Value error, ")
            if got is _MISSING or kind in ("too_short", "too_long"):
                lines.append(f"{path}: {msg}")
            else:
                lines.append(f"{path}: {msg} (got {_short(got) if _is_plain(got) else _kind(got)})")
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


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    if value is None:
        return "null"
    return f"{type(value).__name__} {_short(value)}"


def _short(value: Any, limit: int = 80, quote: bool = True) -> str:
    """repr (or str) of a value a user wrote, cut to `limit` characters."""
    try:
        text = repr(value) if quote else str(value)
    except ValueError:  # an integer too long to print
        text = f"<an integer of about {int(value.bit_length() * 0.30103)} digits>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _field_named(model: Any, name: str) -> FieldInfo | None:
    fields = getattr(model, "model_fields", {})
    if name in fields:
        return fields[name]
    return next((f for f in fields.values() if f.alias == name), None)


def _field_at(loc: list) -> FieldInfo | None:
    """The schema field a validation error's location points at (dict keys are skipped)."""
    model: Any = JobSpec
    field = None
    i = 0
    while i < len(loc):
        field = _field_named(model, str(loc[i]))
        if field is None:
            return None
        i += 1
        if i == len(loc):
            return field
        if get_origin(field.annotation) is dict:
            i += 1  # the key of a mapping such as sweep.parameters
        model = _section_type(field.annotation)
        if model is None:
            return None
    return field


def _allowed_range(loc: list) -> str:
    field = _field_at([p for p in loc if not isinstance(p, int)])
    bounds = {}
    for item in getattr(field, "metadata", []):
        for name in ("ge", "gt", "le", "lt"):
            if getattr(item, name, None) is not None:
                bounds[name] = getattr(item, name)
    if "ge" in bounds and "le" in bounds:
        return f"{_number(bounds['ge'])} to {_number(bounds['le'])}"
    words = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    return " and ".join(f"{words[k]} {_number(v)}" for k, v in bounds.items()) or "see the README"


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def _did_you_mean(loc: list[str]) -> str:
    """Suggest the closest allowed key for an unknown field."""
    parent = _field_at(loc[:-1]) if len(loc) > 1 else None
    model = JobSpec if len(loc) == 1 else _section_type(parent.annotation) if parent else None
    if model is None:
        return ""
    return _did_you_mean_in(model, loc[-1])


def _did_you_mean_in(model: Any, word: str) -> str:
    names = []
    for name, field in model.model_fields.items():
        names += [name] + ([field.alias] if field.alias else [])
    close = difflib.get_close_matches(word, names, n=1, cutoff=0.6)
    if close:
        return f"; did you mean '{close[0]}'?"
    return f"; allowed: {', '.join(sorted(names))}"


def _section_type(annotation):
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):  # Optional[Section], dict[str, Section]
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def _close_literal(got: Any, allowed: str) -> str:
    options = [o.strip().strip("'") for o in allowed.replace(" or ", ", ").split(",")]
    close = difflib.get_close_matches(_short(got, quote=False), options, n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""
