"""Learning-rate schedules and early stopping."""

import pytest

from orchestrator.spec import SchedulerSpec
from tests.conftest import ROOT
from tests.test_training import VIT_DIGITS, local_train
from workers.optim import lr_factor


def factors(spec: SchedulerSpec, total: int) -> list[float]:
    return [lr_factor(spec, step, total) for step in range(total)]


def test_cosine_warms_up_then_decays_to_the_floor():
    f = factors(SchedulerSpec(name="cosine", warmup_steps=10, min_lr_ratio=0.1), 110)
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(f[10:], f[11:]))  # monotone decay after warm-up
    assert f[-1] == pytest.approx(0.1, abs=1e-3)


def test_onecycle_rises_to_the_peak_and_falls():
    f = factors(SchedulerSpec(name="onecycle", pct_start=0.25, min_lr_ratio=0.0), 100)
    peak = f.index(max(f))
    assert peak == 25 and f[peak] == pytest.approx(1.0)
    assert f[0] < 0.1 and f[-1] < 0.01


def test_constant_after_warmup():
    f = factors(SchedulerSpec(name="constant", warmup_steps=4), 20)
    assert f[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0]) and set(f[4:]) == {1.0}


def test_early_stopping_stops_after_patience_evaluations_without_improvement(tmp_path):
    # a learning rate too small to move the eval loss by min_delta: evaluations at steps 2
    # (first best), 4 and 6 (no improvement) -> stop at step 6 with a checkpoint there
    spec, summary = local_train(
        ROOT / "jobs/convnet.yaml",
        tmp_path,
        *VIT_DIGITS,
        "train.steps=40",
        "train.eval_every=2",
        "optimizer.lr=1e-9",
        "train.early_stopping={patience: 2, min_delta: 0.1}",
        "checkpoint.every_steps=null",
    )
    assert summary["status"] == "stopped_early" and summary["steps"] == 6
    assert summary["checkpoint"].endswith("checkpoint_00000006")
