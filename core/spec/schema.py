"""The job spec's schema: one YAML file describes a training job end to end.

Every section forbids unknown keys so that a typo is an error, never a silently ignored
setting, and every number has a range. Defaults live here and nowhere else: every process
(CLI, service, driver, workers) reads them from a `JobSpec`, never from a dict.

Reading a file is `core.spec.load`; the rules that span fields are `core.spec.checks`;
turning pydantic's errors into one readable line each is `core.spec.errors`.
"""

from __future__ import annotations

import math
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator
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


KERNEL_OPS = ("layer_norm", "attention", "cross_entropy", "bias_gelu")  # the spec's kernels section
KERNEL_IMPLS = ("auto", "triton", "torch")
KernelImpl = Literal["auto", "torch", "triton"]


class KernelsSpec(Section):
    attention: KernelImpl = "auto"
    layer_norm: KernelImpl = "auto"
    cross_entropy: KernelImpl = "auto"
    bias_gelu: KernelImpl = "auto"

    def as_dict(self) -> dict[str, str]:
        return self.model_dump()


class WorkerRange(Section):
    """An elastic job's size: the service runs it at any size from `min` to `max` workers."""

    min: int = Field(ge=1, le=MAX_WORKERS)
    max: int = Field(ge=1, le=MAX_WORKERS)


class ResourcesSpec(Section):
    # a number, or {min, max} for an elastic job (the global batch stays data.batch_size)
    num_workers: int | WorkerRange = 1
    gpus_per_worker: float = Field(0.0, ge=0.0, le=64.0)
    cpus_per_worker: float = Field(1.0, gt=0.0, le=1024.0)
    # other Ray resources each worker needs, e.g. {"accelerator_type:H100": 0.001} or a custom
    # resource a node was started with
    custom_per_worker: dict[str, float] = Field(default_factory=dict, max_length=16)

    @field_validator("num_workers", mode="before")
    @classmethod
    def _workers(cls, value: Any):
        if isinstance(value, dict):
            if set(value) != {"min", "max"}:
                raise ValueError(f"an elastic size takes exactly the keys min and max, got {sorted(value)}")
            low, high = (_worker_count(value[key], key) for key in ("min", "max"))
            if low > high:
                raise ValueError(f"min {low} is above max {high}")
            return WorkerRange(min=low, max=high)
        return value if isinstance(value, WorkerRange) else _worker_count(value, "")

    @property
    def elastic(self) -> bool:
        return isinstance(self.num_workers, WorkerRange)

    @property
    def max_workers(self) -> int:
        return self.num_workers.max if self.elastic else self.num_workers

    @property
    def min_workers(self) -> int:
        return self.num_workers.min if self.elastic else self.num_workers

    @property
    def size_text(self) -> str:
        """'4', or '2..8' for an elastic job (what the CLI shows)."""
        return f"{self.min_workers}..{self.max_workers}" if self.elastic else str(self.num_workers)

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
    # docs/cluster.md, "A node that dies": failures of the cluster, not of the job, under the service
    max_infrastructure_failures: int = Field(
        5,
        ge=-1,
        le=1000,
        description="times the service requeues a job whose collectives failed (a peer reset, a "
        "gloo or NCCL error, a rank gone) while every node answered, without spending "
        "max_failures; -1 forever",
    )
    hang_timeout_s: float | None = Field(
        None,
        ge=5.0,
        le=7 * 86400.0,
        description="no step progress for this long (outside checkpoints and evaluations), or no "
        "first step for this long after a worker group started, is a hang; None: max(120 s, 10 x "
        "the attempt's p95 time between logged steps), and max(600 s, that) before the first step",
    )
    # docs/cluster.md, "Replica groups"
    replica_groups: int = Field(
        1,
        ge=1,
        le=64,
        description="the workers in this many equal groups that train on through the loss of one "
        "(torchft): the others go on with the smaller quorum and a replacement group heals from a live "
        "peer; 1: one group, a lost worker restarts the job from its checkpoint",
    )
    # docs/monitoring.md, "Stragglers"
    on_straggler: Literal["warn", "restart_excluding_node"] = Field(
        "warn",
        description="what follows a rank whose compute is 20% over the median rank's: warn, or "
        "also checkpoint and restart the job on nodes other than the straggler's",
    )


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


class MlflowSpec(Section):
    """Where the job's MLflow run goes (`orchestrator/monitoring/mlflow_tracking.py`)."""

    uri: str = Field(..., min_length=1, max_length=MAX_PATH, description="the tracking server")
    experiment: str = Field("orchestrator", min_length=1, max_length=500)

    @field_validator("uri")
    @classmethod
    def _server(cls, uri: str) -> str:
        if not uri.startswith(("http://", "https://")) or not uri.split("://", 1)[1].strip("/"):
            raise ValueError(
                f"'{uri}' is not a tracking server's address; expected http://HOST:PORT or https://..."
            )
        return uri.rstrip("/")


class TrackingSpec(Section):
    mlflow: MlflowSpec | None = None


# --- sweeps: the schema (expansion and ranking: core/spec/sweep.py) ---------------

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
    tracking: TrackingSpec = Field(default_factory=TrackingSpec)
    sweep: SweepSpec | None = None
    _trials: list | None = PrivateAttr(default=None)  # a sweep's trials, once validated (sweep.py)

    @property
    def micro_batch_size(self) -> int:
        """Samples per worker per forward pass (an elastic job keeps the one of its largest size)."""
        return self.data.batch_size // (self.resources.max_workers * self.train.grad_accum)

    def worker_sizes(self) -> tuple[int, ...]:
        """The worker counts the job may run at, largest first. An elastic job keeps its global
        batch and its micro-batch (the memory a worker needs) at every size, so a size must
        split `max x grad_accum` micro-batches evenly: each worker accumulates more of them."""
        res, accum = self.resources, self.train.grad_accum
        return tuple(
            n for n in range(res.max_workers, res.min_workers - 1, -1) if res.max_workers * accum % n == 0
        )

    def at_size(self, workers: int) -> JobSpec:
        """This job run by `workers` workers: the same global batch and micro-batch, with the
        gradient accumulation that makes up the difference. The training curve is unchanged."""
        if workers not in self.worker_sizes():
            raise ValueError(f"resources.num_workers: {workers} is not one of {list(self.worker_sizes())}")
        sized = self.model_copy(deep=True)
        sized.train.grad_accum = self.train.grad_accum * self.resources.max_workers // workers
        sized.resources.num_workers = workers
        return sized


def _worker_count(value: Any, key: str) -> int:
    """A number of workers; `key` ("min", "max") names it inside an elastic size."""
    if isinstance(value, bool) or not isinstance(value, int):
        return _raise(
            f"{key}: expected a whole number" if key else "expected a whole number, or {min: N, max: M}"
        )
    if not 1 <= value <= MAX_WORKERS:
        _raise(f"{key} {value}" if key else str(value), f" is out of range; allowed: 1 to {MAX_WORKERS}")
    return value


def _raise(*parts: str):
    raise ValueError("".join(parts))


# --- reading the schema (for error messages and sweep paths) ------------------------


def field_named(model: Any, name: str) -> FieldInfo | None:
    fields = getattr(model, "model_fields", {})
    if name in fields:
        return fields[name]
    return next((f for f in fields.values() if f.alias == name), None)


def section_type(annotation):
    """The section (model) class an annotation holds: Section, Optional[Section],
    dict[str, Section]; None for plain values."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None
