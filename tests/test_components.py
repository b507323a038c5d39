"""The training loop's components each own their cadence: saves, logged steps, evaluations."""

from types import SimpleNamespace

import torch

from core.spec import load_spec
from tests.conftest import ROOT
from workers import data
from workers.checkpointer import Checkpointer, TrainState
from workers.context import RunContext
from workers.evaluator import Evaluator
from workers.metrics_ab import MetricsAB
from workers.metrics_processor import MetricsProcessor


def components(*overrides):
    """The three components of a convnet run of 50 steps, on a stand-in for the trainer."""
    spec = load_spec(ROOT / "jobs/convnet.yaml", ["train.steps=50", *overrides])
    trainer = SimpleNamespace(
        device=torch.device("cpu"),
        info=data.describe(spec.data),
        is_lm=False,
        total_steps=spec.train.steps,
        state=TrainState(),
    )
    ctx = RunContext()
    return (
        Checkpointer(spec, ctx, trainer),
        MetricsProcessor(spec, ctx, trainer),
        Evaluator(spec, ctx, trainer),
    )


def steps_where(predicate) -> list[int]:
    return [step for step in range(1, 51) if predicate(step)]


def test_checkpointer_saves_every_n_steps_and_never_without_a_cadence():
    checkpointer, _, _ = components("checkpoint.every_steps=20")
    assert steps_where(checkpointer.should_save) == [20, 40]
    checkpointer, _, _ = components("checkpoint.every_steps=null")
    assert steps_where(checkpointer.should_save) == []


def test_metrics_log_every_n_steps_and_always_the_last():
    _, metrics, _ = components("metrics.log_every=15")
    assert steps_where(metrics.should_log) == [15, 30, 45, 50]
    _, metrics, _ = components("metrics.log_every=1")
    assert steps_where(metrics.should_log) == list(range(1, 51))


def test_a_logging_gate_vetoes_steps_but_not_the_last():
    _, metrics, _ = components("metrics.log_every=1")
    ab = MetricsAB(block=10)  # a warm-up block, then on, off, off, on, on
    metrics.logging_gates.append(ab.logging_on)
    assert steps_where(metrics.should_log) == [*range(1, 20), *range(40, 51)]


def test_evaluator_evaluates_every_n_steps_but_leaves_the_last_to_the_final_evaluation():
    _, _, evaluator = components("train.eval_every=10")
    assert steps_where(evaluator.should_evaluate) == [10, 20, 30, 40]
    _, _, evaluator = components("train.eval_every=null")
    assert steps_where(evaluator.should_evaluate) == []
