"""Sweeps: a spec with a `sweep:` section stands for several ordinary job specs, its trials.

    sweep:
      method: grid                 # or random
      parameters:
        optimizer.lr: {values: [0.001, 0.003]}
        optimizer.weight_decay: {distribution: log_uniform, low: 0.0001, high: 0.1}
      num_samples: 8               # random only
      metric: eval_loss            # how `rank` orders finished trials
      mode: min

Trials are named <name>-000, <name>-001, ... in a fixed order: the grid's combinations with the
parameters in sorted path order (the last one varies fastest), or `num_samples` draws from a
generator seeded with `sweep.seed`. The same spec always expands into the same trials, on any
Python version.
The schema of the section is in core/spec/schema.py. A spec validated by `core.spec.load`
keeps its trials, validated once: `trials(spec)`.
"""

from __future__ import annotations

import copy
import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from core.spec.checks import validate_fields
from core.spec.errors import SpecError
from core.spec.schema import JobSpec, SweepParameter, SweepSpec

Check = Callable[[dict], list[str]]  # a trial's raw spec -> 'dotted.path: reason' lines


@dataclass
class Trial:
    name: str  # <sweep name>-NNN: also the trial's job id in the queue
    spec: JobSpec  # validated
    params: dict[str, Any]  # this trial's value of each swept parameter, {dotted.path: value}


def expand(raw: dict, into: JobSpec | None = None) -> list[tuple[str, dict]]:
    """The trials of a spec with a sweep: (name, raw spec without the sweep section), each one valid.

    Raises SpecError naming `sweep.parameters.<path>` for a path the schema does not have or a
    value its field rejects (and the trial, for combinations that fail together). With `into`
    (the spec `raw` validated to), its trials are kept on it, validated: `trials(into)`.
    """
    spec = into if into is not None else validate_fields(raw)  # the base spec and the sweep section
    if spec.sweep is None:
        raise SpecError(["sweep: the spec has no sweep section"])
    trials = _trials(raw, spec.sweep)
    validated: dict[str, JobSpec] = {}  # trial name -> its spec, from the check below

    def check(trial: dict) -> list[str]:
        try:
            trial_spec = validate_fields(trial)
        except SpecError as err:
            return err.problems
        validated[trial_spec.name] = trial_spec
        return []

    problems = trial_problems(raw, check)
    if problems:
        raise SpecError(problems)
    if into is not None:
        into._trials = [Trial(name, validated[name], params_of(raw, trial)) for name, trial in trials]
    return trials


def trials(spec: JobSpec) -> list[Trial]:
    """The trials of a validated sweep spec, validated once (when the spec was)."""
    if spec._trials is None:
        expand(spec.model_dump(mode="json", by_alias=True, exclude_unset=True), into=spec)
    return spec._trials


def trial_problems(raw: dict, check: Check) -> list[str]:
    """`check` applied to each parameter's values alone (on the base spec), then, if those pass, to
    every trial; problems are named after the parameter, or the trial for combinations."""
    sweep = SweepSpec.model_validate(raw["sweep"])
    base = _base(raw)
    known = set(check(base))  # the base's own problems are reported as such, not here
    problems = []
    for path in sorted(sweep.parameters):
        for value in _candidates(sweep.parameters[path]):
            problems += [_named(path, value, p) for p in check(_with(base, {path: value})) if p not in known]
    if not problems:
        for name, values in _trials_values(raw, sweep):
            settings = ", ".join(f"{k}={_short(v)}" for k, v in values.items())
            problems += [
                f"sweep.parameters: trial {name} ({settings}): {p}"
                for p in check(_with(base, values, name))
                if p not in known
            ]
    return list(dict.fromkeys(problems))


def params_of(raw: dict, trial: dict | tuple[str, dict]) -> dict[str, Any]:
    """A trial's value of each swept parameter, {dotted.path: value}; `trial` is a trial's raw spec
    or the (name, raw spec) pair `expand` gives."""
    if isinstance(trial, tuple):
        trial = trial[1]
    return {path: _get(trial, path) for path in sorted(raw["sweep"]["parameters"])}


def rank(results: list[dict], metric: str, mode: str) -> list[dict]:
    """Finished trials, best first by `metric` ('min' or 'max'); trials without it (or with a
    value that is not a finite number) come last, in their given order.

    The metric is looked up in each result, then in its `eval`, `summary` and `summary.eval`.
    """
    if mode not in ("min", "max"):
        raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
    sign = 1.0 if mode == "min" else -1.0

    def key(item: tuple[int, dict]):
        value = metric_of(item[1], metric)
        return (0, sign * value, item[0]) if value is not None else (1, 0.0, item[0])

    return [result for _, result in sorted(enumerate(results), key=key)]


def metric_of(result: dict, metric: str) -> float | None:
    summary = result.get("summary") if isinstance(result.get("summary"), dict) else {}
    for place in (result, result.get("eval"), summary, summary.get("eval")):
        if isinstance(place, dict) and metric in place:
            value = place[metric]
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                return float(value)
            return None
    return None


# --- trials -----------------------------------------------------------------------------


def _trials(raw: dict, sweep: SweepSpec) -> list[tuple[str, dict]]:
    base = _base(raw)
    return [(name, _with(base, values, name)) for name, values in _trials_values(raw, sweep)]


def _trials_values(raw: dict, sweep: SweepSpec) -> list[tuple[str, dict[str, Any]]]:
    paths = sorted(sweep.parameters)
    if sweep.method == "grid":
        draws = [
            dict(zip(paths, combo))
            for combo in itertools.product(*(sweep.parameters[p].values for p in paths))
        ]
    else:
        rng = random.Random(sweep.seed)
        draws = [{p: _draw(sweep.parameters[p], rng) for p in paths} for _ in range(sweep.num_samples)]
    return [(f"{raw['name']}-{i:03d}", values) for i, values in enumerate(draws)]


def _draw(param: SweepParameter, rng: random.Random) -> Any:
    # only rng.random(): Python keeps its sequence for a seed across versions (randint and choice
    # may change), so a sweep expands the same everywhere
    u = rng.random()
    if param.values is not None:
        return param.values[min(int(u * len(param.values)), len(param.values) - 1)]
    low, high = param.low, param.high
    if param.distribution == "int_uniform":
        return min(low + int(u * (high - low + 1)), high)
    if param.distribution == "uniform":
        value = low + u * (high - low)
    else:  # log_uniform
        value = math.exp(math.log(low) + u * (math.log(high) - math.log(low)))
    # 6 significant digits read well in names and tables; rounding must not leave [low, high]
    return min(max(float(f"{value:.6g}"), low), high)


def _candidates(param: SweepParameter) -> list[Any]:
    """The values to check one parameter with: all of its values, or its distribution's ends."""
    return list(param.values) if param.values is not None else [param.low, param.high]


def _base(raw: dict) -> dict:
    return {key: value for key, value in raw.items() if key != "sweep"}


def _with(base: dict, values: dict[str, Any], name: str | None = None) -> dict:
    trial = copy.deepcopy(base)
    if name is not None:
        trial["name"] = name
    for path, value in values.items():
        *parents, last = path.split(".")
        node = trial
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[last] = copy.deepcopy(value)
    return trial


def _get(raw: dict, path: str) -> Any:
    node: Any = raw
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _named(path: str, value: Any, problem: str) -> str:
    if problem.startswith((f"{path}:", f"{path}.")):  # the field's own message shows the value
        return f"sweep.parameters.{problem}"
    return f"sweep.parameters.{path}: with {_short(value)}: {problem}"


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
