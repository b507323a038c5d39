"""The job spec: every example is valid, and each bad field is named with the reason."""

import copy

import pytest
import yaml

from core.spec import JobSpec, SpecError, apply_overrides, load_spec, validate
from tests.conftest import ROOT
from workers.checks import job_problems

BASE = {
    "name": "spec-test",
    "model": {"family": "vit", "preset": "vit_micro"},
    "data": {"source": "digits", "batch_size": 32},
    "train": {"steps": 10},
}


def problems_for(mutate) -> list[str]:
    """What `validate` reports: the schema's problems, else the model and data registries'."""
    raw = copy.deepcopy(BASE)
    mutate(raw)
    try:
        spec = validate(raw)
    except SpecError as err:
        return err.problems
    problems = job_problems(spec)
    assert problems, "the spec was accepted"
    return problems


def groups(num_workers=2, strategy="ddp", batch_size=64):
    """A spec of two replica groups, less what the case changes."""
    fields = {
        "resources.num_workers": num_workers,
        "parallel.strategy": strategy,
        "data.batch_size": batch_size,
        "fault_tolerance.replica_groups": 2,
    }
    return lambda raw: [setter(path, value)(raw) for path, value in fields.items()]


def setter(path: str, value):
    def mutate(raw):
        node = raw
        *parents, last = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value

    return mutate


@pytest.mark.parametrize("spec", sorted((ROOT / "jobs").glob("*.yaml")), ids=lambda p: p.name)
def test_example_specs_are_valid(spec):
    job = load_spec(spec)
    assert isinstance(job, JobSpec)
    # executable: a sweep queues its trials, any other spec runs
    verb = "submit" if job.sweep is not None else "run"
    assert spec.read_text().startswith(f"#!/usr/bin/env -S orchestrator {verb}\n")


def test_defaults_fill_every_section():
    spec = validate(copy.deepcopy(BASE))
    assert spec.parallel.strategy == "none" and spec.precision.dtype == "fp32"
    assert spec.kernels.attention == "auto" and spec.checkpoint.resume == "auto"
    assert spec.micro_batch_size == 32


BAD_FIELDS = [
    # (mutation, expected path prefix, words the message must contain)
    (setter("trian", {"steps": 1}), "trian", "did you mean 'train'"),
    (setter("train.stpes", 20), "train.stpes", "did you mean 'steps'"),
    (setter("model.famly", "vit"), "model.famly", "did you mean 'family'"),
    (setter("model.family", "transformer"), "model.family", "'transformer' is not allowed"),
    (setter("model.preset", "vit_hugee"), "model.preset", "unknown preset"),
    (setter("model.overrides", {"dept": 3}), "model.overrides.dept", "did you mean 'depth'"),
    (setter("model.overrides", {"depth": "deep"}), "model.overrides.depth", "integer"),
    (
        setter("model.overrides", {"patch_size": 3}),
        "model.overrides.patch_size",
        "image_size 8 is not divisible by patch_size 3",
    ),  # checked against the data's 8x8 images
    (setter("data.source", "imagenet"), "data.source", "'imagenet' is not allowed"),
    (setter("data.batch_size", 0), "data.batch_size", "0 is out of range; allowed: 1 to 1048576"),
    (setter("data.batch_size", "lots"), "data.batch_size", "integer"),
    (setter("data.eval_split", 0.9), "data.eval_split", "0.9 is out of range; allowed: 0 to 0.5"),
    (setter("data.loader_workers", 1.5), "data.loader_workers", "integer"),
    (setter("train.steps", -5), "train.steps", "-5 is out of range; allowed: 1 to 1000000000"),
    (setter("train.epochs", 3), "train", "exactly one of train.steps or train.epochs"),
    (setter("train.label_smoothing", 1.5), "train.label_smoothing", "allowed: >= 0 and < 1"),
    (
        setter("train.early_stopping", {"patience": 0}),
        "train.early_stopping.patience",
        "0 is out of range; allowed: 1 to 1000000",
    ),
    (setter("optimizer.name", "adam"), "optimizer.name", "did you mean 'adamw'"),
    (setter("optimizer.lr", 0), "optimizer.lr", "0 is out of range; allowed: > 0 and <= 10"),
    (setter("optimizer.betas", [0.9, 1.2]), "optimizer.betas", "each beta must be in [0, 1)"),
    (setter("scheduler.name", "linear"), "scheduler.name", "'linear' is not allowed"),
    (setter("parallel.strategy", "zero3"), "parallel.strategy", "'zero3' is not allowed"),
    (setter("precision.dtype", "int8"), "precision.dtype", "'int8' is not allowed"),
    (setter("precision.compile", "maybe"), "precision.compile", "boolean"),
    (setter("kernels.attention", "cuda"), "kernels.attention", "'cuda' is not allowed"),
    (setter("kernels.softmax", "triton"), "kernels.softmax", "unknown field"),
    (setter("resources.num_workers", 0), "resources.num_workers", "allowed: 1 to 4096"),
    (setter("resources.num_workers", "four"), "resources.num_workers", "a whole number, or {min: N, max: M}"),
    (setter("resources.num_workers", {"min": 4, "max": 2}), "resources.num_workers", "min 4 is above max 2"),
    (setter("resources.num_workers", {"min": 1}), "resources.num_workers", "exactly the keys min and max"),
    (setter("resources.num_workers", {"min": 0, "max": 2}), "resources.num_workers", "min 0 is out of range"),
    (
        lambda raw: (
            setter("resources.num_workers", {"min": 3, "max": 4})(raw),
            setter("parallel.strategy", "ddp")(raw),
            setter("data.batch_size", 32)(raw),
        ),
        "resources.num_workers",
        "splits evenly only at 4 workers; sizes that divide max x train.grad_accum = 4: 1, 2, 4",
    ),
    (setter("resources.gpus_per_worker", -1), "resources.gpus_per_worker", "allowed: 0 to 64"),
    (setter("checkpoint.keep", 0), "checkpoint.keep", "allowed: 1 to 1000"),
    (setter("checkpoint.every_steps", "often"), "checkpoint.every_steps", "integer"),
    (
        setter("fault_tolerance.max_failures", -3),
        "fault_tolerance.max_failures",
        "allowed: -1 to 1000",
    ),
    (setter("fault_tolerance.hang_timeout_s", 1), "fault_tolerance.hang_timeout_s", "allowed: 5 to"),
    (setter("fault_tolerance.on_straggler", "ignore"), "fault_tolerance.on_straggler", "'warn'"),
    (setter("fault_tolerance.replica_groups", 0), "fault_tolerance.replica_groups", "allowed: 1 to 64"),
    (groups(num_workers=3, batch_size=48), "fault_tolerance.replica_groups", "2 groups do not divide"),
    (groups(num_workers={"min": 2, "max": 4}), "fault_tolerance.replica_groups", "not with an elastic"),
    (setter("scheduling.priority", 5000), "scheduling.priority", "5000 is out of range; allowed: 0 to 1000"),
    (setter("metrics.prometheus_port", 9100), "metrics.prometheus_port", "unknown field"),  # removed
    (setter("scheduling.queue", "Fast Lane"), "scheduling.queue", "lowercase letters"),
    (setter("scheduling.preemption_grace_s", 7200), "scheduling.preemption_grace_s", "allowed: 0 to 3600"),
    (setter("scheduling.preemptible", "sometimes"), "scheduling.preemptible", "boolean"),
    (setter("metrics.tensorboard", "maybe"), "metrics.tensorboard", "boolean"),
    (setter("parallel.cpu_offload", True), "parallel.cpu_offload", "only applies to parallel.strategy"),
    (setter("data", {"source": "parquet"}), "data.path", "required for source 'parquet'"),
    (setter("model.overrides", {"depth": 10**30}), "model.overrides.depth", "must be 1 to 1048576"),
    (setter("model.overrides", {"dropout": float("nan")}), "model.overrides.dropout", "finite"),
    (
        setter("model", {"family": "convnet", "preset": "convnet", "overrides": {"kernels": {}}}),
        "model.overrides.kernels",
        "the convnet family has no ops with fused kernels",
    ),
    (setter("metrics.log_every", 0), "metrics.log_every", "allowed: 1 to 1000000000"),
    (setter("name", "My Job!"), "name", "lowercase"),
    (lambda raw: raw.pop("name"), "name", "required field is missing"),
    (lambda raw: raw.pop("model"), "model", "required field is missing"),
    (
        lambda raw: (
            setter("resources.num_workers", 4)(raw),
            setter("parallel.strategy", "ddp")(raw),
            setter("data.batch_size", 30)(raw),
        ),
        "data.batch_size",
        "divisible by resources.num_workers x train.grad_accum = 4 x 1",
    ),
    (
        lambda raw: (setter("data.batch_size", 32)(raw), setter("train.grad_accum", 3)(raw)),
        "data.batch_size",
        "divisible",
    ),
    (setter("resources.num_workers", 2), "parallel.strategy", "'none' trains on one worker"),
    (setter("model", {"family": "gpt", "preset": "gpt_nano"}), "model.family", "needs tokens data"),
    (setter("train.early_stopping", {"patience": 2}), "train.early_stopping", "needs train.eval_every"),
    (
        setter("data", {"source": "text", "augment": {"shift": 2}}),
        "data.augment",
        "applies to image data only",
    ),
    (setter("data.augment", {"shift": 100}), "data.augment.shift", "allowed: 0 to 64"),
    (setter("checkpoint.storage", "  "), "checkpoint.storage", "empty"),
    (
        lambda raw: (
            setter("precision.dtype", "fp8")(raw),
            setter("model", {"family": "convnet", "preset": "convnet_small"})(raw),
        ),
        "precision.dtype",
        "fp8 applies to Linear layers",
    ),
]


@pytest.mark.parametrize(
    "mutate,path,words", BAD_FIELDS, ids=[f"{i:02d}-{c[1]}" for i, c in enumerate(BAD_FIELDS)]
)
def test_bad_field_is_named_with_reason(mutate, path, words):
    problems = problems_for(mutate)
    matching = [
        p
        for p in problems
        if p.startswith(path + ":") or p.startswith(path + " ") or p.startswith(path + ".")
    ]
    assert matching, f"no problem names {path!r}: {problems}"
    assert any(words in p for p in matching), f"{words!r} not in {matching}"


def test_replica_groups_take_ddp_or_fsdp2_inside_them():
    for strategy, workers in (("ddp", 2), ("fsdp2", 4)):  # FSDP2 inside, DDP across: HSDP
        raw = copy.deepcopy(BASE)
        groups(num_workers=workers, strategy=strategy, batch_size=64)(raw)
        spec = validate(raw)
        assert (spec.parallel.strategy, spec.fault_tolerance.replica_groups) == (strategy, 2)


def test_on_straggler_restart_excluding_node_is_accepted():
    assert validate(copy.deepcopy(BASE)).fault_tolerance.on_straggler == "warn"  # the default
    raw = copy.deepcopy(BASE)
    raw["fault_tolerance"] = {"on_straggler": "restart_excluding_node", "hang_timeout_s": 30}
    tolerance = validate(raw).fault_tolerance
    assert tolerance.on_straggler == "restart_excluding_node" and tolerance.hang_timeout_s == 30


def test_a_bad_on_straggler_names_the_field_and_exits_2(cli):
    spec = str(ROOT / "jobs/convnet.yaml")
    result = cli("validate", spec, "--set", "fault_tolerance.on_straggler=restart_elsewhere")
    assert result.returncode == 2 and "Traceback" not in result.stdout + result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line == (
        f"error: {spec}: fault_tolerance.on_straggler: 'restart_elsewhere' is not allowed;"
        " expected 'warn' or 'restart_excluding_node'"
    )


def test_every_problem_is_reported_not_just_the_first():
    raw = copy.deepcopy(BASE)
    raw["train"]["stpes"] = 3
    raw["optimizer"] = {"lr": -1}
    with pytest.raises(SpecError) as info:
        validate(raw)
    text = "\n".join(info.value.problems)
    assert "train.stpes" in text and "optimizer.lr" in text


def write(tmp_path, text: str):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


def test_yaml_syntax_error_names_line_and_column(tmp_path):
    path = write(tmp_path, "name: x\nmodel:\n  family: vit\n  preset: [vit_micro\ndata: {}\n")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert "YAML syntax error at line" in str(info.value) and "column" in str(info.value)


def test_empty_file_and_non_mapping_are_errors(tmp_path):
    with pytest.raises(SpecError, match="empty"):
        load_spec(write(tmp_path, ""))
    with pytest.raises(SpecError, match="expected a mapping"):
        load_spec(write(tmp_path, "- a\n- b\n"))
    with pytest.raises(SpecError, match="no such file"):
        load_spec(tmp_path / "missing.yaml")


def test_overrides_are_typed_by_the_schema(tmp_path):
    path = write(tmp_path, yaml.safe_dump(BASE))
    spec = load_spec(
        path,
        ["train.steps=20", "precision.dtype=bf16", "optimizer.betas=[0.8, 0.9]", "model.overrides.depth=2"],
    )
    assert spec.train.steps == 20 and spec.precision.dtype == "bf16"
    assert spec.optimizer.betas == (0.8, 0.9) and spec.model.overrides == {"depth": 2}


@pytest.mark.parametrize(
    "override,words",
    [
        ("train.steps=abc", "train.steps: Input should be a valid integer"),
        ("train.steps=1e12", "train.steps: Input should be a valid integer"),  # YAML 1.1: a string
        ("train.steps=1000000000000", "train.steps: 1000000000000 is out of range"),
        ("optimizer.lr=.inf", "optimizer.lr: must be a finite number (got inf)"),
        ("train.stpes=3", "train.stpes: unknown field; did you mean 'steps'"),
        ("precision.dtype=fp64", "precision.dtype: 'fp64' is not allowed"),
        ("train.steps", "expected KEY=VALUE"),
        ("name.first=x", "'name' is not a section"),
    ],
)
def test_bad_overrides_are_named(tmp_path, override, words):
    path = write(tmp_path, yaml.safe_dump(BASE))
    with pytest.raises(SpecError) as info:
        load_spec(path, [override])
    assert words in str(info.value)


def test_apply_overrides_creates_missing_sections():
    raw = apply_overrides({"name": "x"}, ["precision.compile=true"])
    assert raw["precision"] == {"compile": True}


def test_new_scheduling_and_metrics_fields_have_defaults():
    spec = validate(copy.deepcopy(BASE))
    assert spec.scheduling.queue == "default" and spec.scheduling.preemption_grace_s == 60.0
    assert spec.scheduling.priority == 0 and spec.scheduling.preemptible is False
    assert spec.metrics.tensorboard is False and spec.sweep is None
    spec = validate(
        {
            **copy.deepcopy(BASE),
            "scheduling": {"priority": 1000, "preemptible": True, "queue": "gpu-a", "preemption_grace_s": 0},
            "metrics": {"tensorboard": True},
        }
    )
    assert (spec.scheduling.queue, spec.scheduling.preemption_grace_s) == ("gpu-a", 0.0)
    assert job_problems(spec) == []  # priorities and preemption are real settings now


def _numeric_fields():
    """(section, field, FieldInfo) of every int or float field reachable from JobSpec."""
    import typing

    from pydantic import BaseModel

    seen, todo, fields = set(), [JobSpec], []
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        for name, field in model.model_fields.items():
            args = typing.get_args(field.annotation) or (field.annotation,)
            for arg in [*args, *(a for t in args for a in typing.get_args(t))]:
                if isinstance(arg, type) and issubclass(arg, BaseModel):
                    todo.append(arg)
            numeric = {int, float} & set(args) and bool not in args
            if numeric and model.__name__ != "SweepParameter":  # low/high: checked against the field
                fields.append((model.__name__, name, field))
    return fields


def test_every_number_in_the_schema_has_both_bounds():
    fields = _numeric_fields()
    assert len(fields) > 40
    for section, name, field in fields:
        if (section, name) in (
            ("OptimizerSpec", "betas"),
            ("ResourcesSpec", "custom_per_worker"),
            ("ResourcesSpec", "num_workers"),
        ):
            continue  # a pair, a mapping, a number or range: their validators bound each value
        kinds = {type(m).__name__ for m in field.metadata}
        assert kinds & {"Ge", "Gt"} and kinds & {"Le", "Lt"}, f"{section}.{name}: {kinds}"


@pytest.mark.parametrize(
    "module", sorted(str(p.relative_to(ROOT)) for p in (ROOT / "core" / "spec").glob("*.py"))
)
def test_the_spec_imports_nothing_of_the_data_plane(module):
    """The schema is the contract both sides import: it must not import workers (or kernels),
    not even inside a function, or the two packages depend on each other."""
    import ast

    tree = ast.parse((ROOT / module).read_text())
    imported = []
    for node in ast.walk(tree):  # every import, at any depth
        if isinstance(node, ast.Import):
            imported += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            imported.append("." * node.level + (node.module or ""))
    assert imported, "the walk found no imports at all"
    bad = [
        name
        for name in imported
        if name.split(".")[0] in ("workers", "kernels", "orchestrator", "torch", "ray")
        or name.startswith(".")
    ]
    assert bad == [], f"{module} imports {bad}"


def test_validating_a_sweep_loads_no_data_plane_module(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "job.yaml"
    raw = {
        **copy.deepcopy(BASE),
        "sweep": {"method": "grid", "parameters": {"train.seed": {"values": [0, 1]}}},
    }
    path.write_text(yaml.safe_dump(raw))
    code = (
        "import sys; from core.spec import load_spec; load_spec(sys.argv[1]);"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'workers', 'kernels', 'torch'}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(path)], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_the_readme_shows_the_main_job_as_it_is():
    """The README's abridged jobs/vit.yaml must not drift from the file (epochs, model, ...)."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("# jobs/vit.yaml (abridged)\n", 1)[1].split("```", 1)[0]
    shown = yaml.safe_load(block)
    actual = yaml.safe_load((ROOT / "jobs/vit.yaml").read_text())

    def check(part, whole, where):
        for key, value in part.items():
            if isinstance(value, dict):
                check(value, whole[key], f"{where}{key}.")
            else:
                assert whole[key] == value, f"README: {where}{key}: {value}, jobs/vit.yaml: {whole[key]}"

    check(shown, actual, "")


def test_an_elastic_job_keeps_its_global_batch_and_micro_batch_at_every_size():
    raw = yaml.safe_load((ROOT / "jobs" / "vit.yaml").read_text())
    raw["resources"]["num_workers"] = {"min": 2, "max": 8}
    raw["parallel"] = {"strategy": "ddp"}
    raw["data"]["batch_size"], raw["train"]["grad_accum"] = 96, 3
    spec = validate(raw)
    assert spec.resources.elastic and spec.resources.size_text == "2..8"
    assert spec.worker_sizes() == (8, 6, 4, 3, 2)  # the sizes that divide 8 x 3 micro-batches
    for size in spec.worker_sizes():
        sized = spec.at_size(size)
        assert sized.resources.num_workers == size and not sized.resources.elastic
        assert sized.data.batch_size == 96 and sized.micro_batch_size == spec.micro_batch_size == 4
        assert size * sized.train.grad_accum * sized.micro_batch_size == 96
    assert spec.resources.num_workers.max == 8  # sizing copies: the spec itself is unchanged
    with pytest.raises(ValueError, match="5 is not one of"):
        spec.at_size(5)
