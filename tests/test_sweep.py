"""Sweeps: a spec's `sweep:` section expands into named, valid, reproducible trials; bad
parameters are named `sweep.parameters.<path>`; finished trials rank by their metric."""

import copy
import math

import pytest
import yaml

from core.spec import SpecError, load_spec, sweep, validate
from workers.checks import job_problems

BASE = {
    "name": "sw",
    "model": {"family": "vit", "preset": "vit_micro"},
    "data": {"source": "digits", "batch_size": 32},
    "train": {"steps": 10},
}


def with_sweep(**section) -> dict:
    raw = copy.deepcopy(BASE)
    raw["sweep"] = section
    return raw


def expand_problems(raw) -> list[str]:
    with pytest.raises(SpecError) as info:
        sweep.expand(raw)
    return info.value.problems


# --- expansion ------------------------------------------------------------------------------


def test_grid_expands_every_combination_in_sorted_path_order():
    raw = with_sweep(
        method="grid",
        parameters={
            "optimizer.lr": {"values": [0.001, 0.01, 0.1]},
            "data.batch_size": {"values": [16, 32]},  # sorts before optimizer.lr
        },
    )
    trials = sweep.expand(raw)
    assert [name for name, _ in trials] == [f"sw-{i:03d}" for i in range(6)]
    assert [(t["data"]["batch_size"], t["optimizer"]["lr"]) for _, t in trials] == [
        (16, 0.001),
        (16, 0.01),
        (16, 0.1),
        (32, 0.001),
        (32, 0.01),
        (32, 0.1),
    ]
    for name, trial in trials:
        assert trial["name"] == name and "sweep" not in trial
        assert validate(trial).name == name  # an ordinary, valid job spec
    assert raw["data"]["batch_size"] == 32 and "optimizer" not in raw  # the input is left alone


def test_random_is_reproducible_within_ranges_and_seeded():
    section = dict(
        method="random",
        num_samples=20,
        seed=7,
        parameters={
            "optimizer.lr": {"distribution": "log_uniform", "low": 1e-4, "high": 1e-1},
            "optimizer.weight_decay": {"distribution": "uniform", "low": 0.0, "high": 0.1},
            "train.steps": {"distribution": "int_uniform", "low": 5, "high": 8},
            "optimizer.name": {"values": ["adamw", "sgd"]},
        },
    )
    first = sweep.expand(with_sweep(**section))
    assert first == sweep.expand(with_sweep(**copy.deepcopy(section)))  # same spec, same trials
    assert [name for name, _ in first] == [f"sw-{i:03d}" for i in range(20)]
    lrs = [t["optimizer"]["lr"] for _, t in first]
    assert all(1e-4 <= lr <= 1e-1 for lr in lrs)
    # log-uniform: about as many draws below 1e-2.5 as above it, not bunched near the top
    assert 4 <= sum(lr < 10**-2.5 for lr in lrs) <= 16
    assert all(0.0 <= t["optimizer"]["weight_decay"] <= 0.1 for _, t in first)
    steps = [t["train"]["steps"] for _, t in first]
    assert set(steps) <= {5, 6, 7, 8} and len(set(steps)) >= 3 and all(type(s) is int for s in steps)
    assert {t["optimizer"]["name"] for _, t in first} == {"adamw", "sgd"}
    other = sweep.expand(with_sweep(**{**section, "seed": 8}))
    assert [t["optimizer"]["lr"] for _, t in other] != lrs


def test_random_draws_are_pinned():
    """The values come from Python's random() alone, whose sequence per seed never changes."""
    raw = with_sweep(
        method="random",
        num_samples=3,
        seed=0,
        parameters={"optimizer.lr": {"distribution": "uniform", "low": 0.0001, "high": 0.01}},
    )
    lrs = [t["optimizer"]["lr"] for _, t in sweep.expand(raw)]
    # random.Random(0).random() -> 0.8444218515250481, 0.7579544029403025, 0.420571580830845
    assert lrs == [0.00845978, 0.00760375, 0.00426366]


def test_params_of_names_each_trials_values():
    raw = with_sweep(
        method="grid",
        parameters={"optimizer.lr": {"values": [0.1, 0.2]}, "model.overrides.depth": {"values": [2]}},
    )
    trials = sweep.expand(raw)
    assert sweep.params_of(raw, trials[1][1]) == {"model.overrides.depth": 2, "optimizer.lr": 0.2}
    assert sweep.params_of(raw, trials[1]) == sweep.params_of(raw, trials[1][1])  # (name, spec) too


def test_a_spec_file_with_a_sweep_loads_and_its_base_is_the_job(tmp_path):
    path = tmp_path / "sweep.yaml"
    raw = with_sweep(method="grid", metric="eval_accuracy", parameters={"train.seed": {"values": [0, 1, 2]}})
    path.write_text(yaml.safe_dump(raw))
    spec = load_spec(path)
    assert spec.name == "sw" and spec.sweep.method == "grid"
    assert spec.sweep.mode == "max"  # accuracy: higher is better unless the spec says otherwise
    assert with_sweep(method="grid", parameters={"train.seed": {"values": [0]}})["sweep"].get("mode") is None
    assert validate(with_sweep(method="grid", parameters={"train.seed": {"values": [0]}})).sweep.mode == "min"


# --- bad sweeps -------------------------------------------------------------------------------

BAD_SWEEPS = [
    # (sweep section, words one problem must contain)
    (
        dict(method="grid", parameters={"optimizer.lrr": {"values": [0.1]}}),
        "sweep.parameters.optimizer.lrr: unknown field 'lrr' in optimizer; did you mean 'lr'?",
    ),
    (
        dict(method="grid", parameters={"traing.steps": {"values": [1]}}),
        "sweep.parameters.traing.steps: unknown field 'traing' in the top level; did you mean 'train'?",
    ),
    (
        dict(method="grid", parameters={"train.steps.x": {"values": [1]}}),
        "sweep.parameters.train.steps.x: 'train.steps' is a value, not a section",
    ),
    (
        dict(method="grid", parameters={"name": {"values": ["a"]}}),
        "sweep.parameters.name: 'name' cannot be swept",
    ),
    (
        dict(method="grid", parameters={"optimizer.lr": {"values": [0.1, 20]}}),
        "sweep.parameters.optimizer.lr: 20 is out of range; allowed: > 0 and <= 10",
    ),
    (
        dict(method="grid", parameters={"precision.dtype": {"values": ["bf16", "int4"]}}),
        "sweep.parameters.precision.dtype: 'int4' is not allowed",
    ),
    (
        dict(
            method="random",
            num_samples=4,
            parameters={"optimizer.lr": {"distribution": "log_uniform", "low": 1e-3, "high": 50}},
        ),
        "sweep.parameters.optimizer.lr: 50 is out of range",  # an end of the range is checked
    ),
    (
        dict(
            method="grid", parameters={"optimizer.lr": {"distribution": "uniform", "low": 0.1, "high": 0.2}}
        ),
        "sweep: grid needs values for every parameter; optimizer.lr has a distribution",
    ),
    (
        dict(method="random", parameters={"optimizer.lr": {"values": [0.1]}}),
        "sweep: method random needs num_samples",
    ),
    (
        dict(method="grid", num_samples=3, parameters={"optimizer.lr": {"values": [0.1]}}),
        "sweep: num_samples applies to method random",
    ),
    (
        dict(method="random", num_samples=1001, parameters={"optimizer.lr": {"values": [0.1]}}),
        "sweep.num_samples: 1001 is out of range; allowed: 1 to 1000",
    ),
    (
        dict(method="grid", max_concurrent=0, parameters={"optimizer.lr": {"values": [0.1]}}),
        "sweep.max_concurrent: 0 is out of range",
    ),
    (dict(method="grid", parameters={}), "sweep.parameters: Dictionary should have at least 1 item"),
    (
        dict(method="bayes", parameters={"optimizer.lr": {"values": [0.1]}}),
        "sweep.method: 'bayes' is not allowed",
    ),
    (
        dict(method="grid", metric="eval_acc", parameters={"optimizer.lr": {"values": [0.1]}}),
        "sweep.metric: 'eval_acc' is not allowed; expected",
    ),
    (
        dict(method="grid", mode="lowest", parameters={"optimizer.lr": {"values": [0.1]}}),
        "sweep.mode: 'lowest'",
    ),
    (
        dict(method="grid", parameters={"optimizer.lr": {"values": []}}),
        "sweep.parameters.optimizer.lr.values",
    ),
    (
        dict(method="grid", parameters={"optimizer.lr": {"values": [1], "distribution": "uniform"}}),
        "sweep.parameters.optimizer.lr: give either values: [...] or a distribution",
    ),
    (
        dict(
            method="random", num_samples=2, parameters={"optimizer.lr": {"distribution": "uniform", "low": 1}}
        ),
        "sweep.parameters.optimizer.lr: distribution uniform needs low and high",
    ),
    (
        dict(
            method="random",
            num_samples=2,
            parameters={"optimizer.lr": {"distribution": "log_uniform", "low": 0, "high": 1}},
        ),
        "log_uniform needs low > 0",
    ),
    (
        dict(
            method="random",
            num_samples=2,
            parameters={"train.steps": {"distribution": "int_uniform", "low": 1.5, "high": 9}},
        ),
        "int_uniform needs integer low and high",
    ),
    (
        dict(
            method="random",
            num_samples=2,
            parameters={"optimizer.lr": {"distribution": "uniform", "low": 0.5, "high": 0.1}},
        ),
        "low must be below high",
    ),
    (
        dict(method="grid", parameters={f"train.seed{i}": {"values": [0]} for i in range(33)}),
        "sweep.parameters: Dictionary should have at most 32 items",
    ),
    (
        dict(
            method="grid",
            parameters={"train.seed": {"values": list(range(40))}, "optimizer.lr": {"values": [0.1] * 30}},
        ),
        "the grid has 1200 combinations; at most 1000",
    ),
]


@pytest.mark.parametrize("section,words", BAD_SWEEPS, ids=[f"{i:02d}" for i in range(len(BAD_SWEEPS))])
def test_bad_sweep_is_a_spec_error_naming_the_parameter(section, words):
    raw = with_sweep(**section)
    with pytest.raises(SpecError) as info:
        validate(raw)  # what load_spec runs
    assert any(words in p for p in info.value.problems), info.value.problems


def test_combination_problem_names_the_trial():
    raw = with_sweep(
        method="grid",
        parameters={"data.batch_size": {"values": [32, 30]}, "resources.num_workers": {"values": [1, 4]}},
    )
    raw["parallel"] = {"strategy": "ddp"}
    problems = expand_problems(raw)
    # each value is fine alone; 30 samples do not split over 4 workers (trial 3 in sorted order)
    assert problems == [
        "sweep.parameters: trial sw-003 (data.batch_size=30, resources.num_workers=4): data.batch_size: 30"
        " must be divisible by resources.num_workers x train.grad_accum = 4 x 1 = 4"
    ]


def test_a_sweep_name_leaves_room_for_trial_numbers():
    raw = with_sweep(method="grid", parameters={"train.seed": {"values": [0]}})
    raw["name"] = "n" * 60
    assert any("at most 59 characters" in p for p in expand_problems(raw))
    raw["name"] = "n" * 59
    assert sweep.expand(raw)[0][0] == "n" * 59 + "-000"


def test_registry_checks_each_swept_model_value():
    raw = with_sweep(
        method="grid",
        parameters={
            "model.overrides.depth": {"values": [2, 0]},
            "model.overrides.patch_size": {"values": [4]},
        },
    )
    spec = validate(raw)  # the schema takes any overrides; the model registry judges them
    assert job_problems(spec) == ["sweep.parameters.model.overrides.depth: must be 1 to 1048576, got 0"]
    raw["sweep"]["parameters"] = {"model.overrides.patch_size": {"values": [4, 3]}}  # 8px digits
    assert job_problems(validate(raw)) == [
        "sweep.parameters.model.overrides.patch_size: image_size 8 is not divisible by patch_size 3"
    ]
    raw["sweep"]["parameters"] = {"model.overrides.depth": {"values": [1, 2]}}
    assert job_problems(validate(raw)) == []


def test_expand_needs_a_sweep():
    assert expand_problems(copy.deepcopy(BASE)) == ["sweep: the spec has no sweep section"]


# --- ranking ------------------------------------------------------------------------------------


RESULTS = [
    {"name": "a", "eval_loss": 0.5},
    {"name": "b"},  # failed before any evaluation
    {"name": "c", "eval": {"eval_loss": 0.2, "eval_accuracy": 0.9}},
    {"name": "d", "summary": {"final_train_loss": 0.1, "eval": {"eval_loss": 0.3}}},
    {"name": "e", "eval_loss": float("nan")},
    {"name": "f", "eval_loss": 0.2},  # ties keep their order
]


def test_rank_orders_by_metric_with_missing_last():
    assert [r["name"] for r in sweep.rank(RESULTS, "eval_loss", "min")] == ["c", "f", "d", "a", "b", "e"]
    assert [r["name"] for r in sweep.rank(RESULTS, "eval_loss", "max")] == ["a", "d", "c", "f", "b", "e"]
    assert [r["name"] for r in sweep.rank(RESULTS, "eval_accuracy", "max")][0] == "c"
    assert [r["name"] for r in sweep.rank(RESULTS, "final_train_loss", "min")][0] == "d"
    assert sweep.rank([], "eval_loss", "min") == []
    assert sweep.rank(RESULTS, "eval_loss", "min")[0] is RESULTS[2]  # the same dicts, reordered


def test_rank_rejects_an_unknown_mode():
    with pytest.raises(ValueError, match="mode must be 'min' or 'max'"):
        sweep.rank(RESULTS, "eval_loss", "lowest")


def test_metric_of_ignores_values_that_are_not_numbers():
    assert sweep.metric_of({"eval_loss": "0.1"}, "eval_loss") is None
    assert sweep.metric_of({"eval_loss": True}, "eval_loss") is None
    assert sweep.metric_of({"eval_loss": math.inf}, "eval_loss") is None
    assert sweep.metric_of({"eval_loss": 1}, "eval_loss") == 1.0
