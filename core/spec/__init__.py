"""The job spec: what a user writes, and the one typed contract every process passes on.

    schema.py       the sections and `JobSpec` (every default lives here)
    yaml_reader.py  reading a file: bounded YAML, one line per failure
    errors.py       `SpecError` and pydantic's errors as 'dotted.path: reason' lines
    checks.py       rules that span fields; `validate_fields`
    sweep.py        a spec with `sweep:` as its trials; ranking finished trials
    load.py         file + `--set` overrides -> validated `JobSpec` (`load_spec`)

Nothing here imports torch, Ray or the rest of the project.
"""

from core.spec.checks import cross_field_problems, sweepable, validate_fields
from core.spec.errors import SpecError, format_errors
from core.spec.load import apply_overrides, load_spec, load_spec_text, load_stored, parse_override, validate
from core.spec.schema import (
    AugmentSpec,
    CheckpointSpec,
    DataSpec,
    EarlyStoppingSpec,
    FaultToleranceSpec,
    JobSpec,
    KernelsSpec,
    MetricsSpec,
    ModelSpec,
    OptimizerSpec,
    ParallelSpec,
    PrecisionSpec,
    ResourcesSpec,
    SchedulerSpec,
    SchedulingSpec,
    SweepParameter,
    SweepSpec,
    TrainSpec,
)
from core.spec.yaml_reader import MAX_SPEC_BYTES, YAMLRefused, parse_yaml, read_yaml

__all__ = [
    "MAX_SPEC_BYTES",
    "AugmentSpec",
    "CheckpointSpec",
    "DataSpec",
    "EarlyStoppingSpec",
    "FaultToleranceSpec",
    "JobSpec",
    "KernelsSpec",
    "MetricsSpec",
    "ModelSpec",
    "OptimizerSpec",
    "ParallelSpec",
    "PrecisionSpec",
    "ResourcesSpec",
    "SchedulerSpec",
    "SchedulingSpec",
    "SpecError",
    "SweepParameter",
    "SweepSpec",
    "TrainSpec",
    "YAMLRefused",
    "apply_overrides",
    "cross_field_problems",
    "format_errors",
    "load_spec",
    "load_spec_text",
    "load_stored",
    "parse_override",
    "parse_yaml",
    "read_yaml",
    "sweepable",
    "validate",
    "validate_fields",
]
