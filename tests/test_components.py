"""The training loop's components each own their cadence: saves, logged steps, evaluations."""

import torch

from core.spec import load_spec
from tests.conftest import ROOT
from workers import data
from workers.checkpointer import Checkpointer
from workers.context import RunContext
from workers.evaluator import Evaluator
from workers.metrics_ab import MetricsAB
from workers.metrics_processor import MetricsProcessor
from workers.train_state import TrainState


def components(*overrides):
    """The three components of a convnet run of 50 steps, each handed stand-ins for its parts."""
    spec = load_spec(ROOT / "jobs/convnet.yaml", ["train.steps=50", *overrides])
    ctx, state, total_steps = RunContext(), TrainState(), spec.train.steps
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return (
        Checkpointer(spec, ctx, state, model=model, optimizer=optimizer, scheduler=scheduler, scaler=None),
        MetricsProcessor(
            spec,
            ctx,
            state,
            info=data.describe(spec.data),
            total_steps=total_steps,
            steps_per_epoch=1,
            timer=None,
            scheduler=scheduler,
            save_fields=dict,
        ),
        Evaluator(
            spec,
            ctx,
            state,
            datasets=None,
            model=model,
            loss=None,
            precision=None,
            micro_batch=1,
            total_steps=total_steps,
            message=print,
            log_record=print,
        ),
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
