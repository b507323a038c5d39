"""Learning-rate schedules and early stopping."""

import pytest
import torch
from torch import nn

from core.spec import SchedulerSpec
from tests.conftest import ROOT
from tests.test_training import VIT_DIGITS, local_train
from workers.optim import clip_grad_norm_, lr_factor


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


def test_clip_grad_norm_returns_the_norm_before_clipping_and_clips_like_torch():
    torch.manual_seed(0)
    model, reference = nn.Linear(8, 4), nn.Linear(8, 4)
    reference.load_state_dict(model.state_dict())
    x = torch.randn(16, 8)
    for m in (model, reference):
        (m(x) ** 2).sum().mul(100).backward()
    norm = clip_grad_norm_(model, 1.0)
    expected = nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
    assert norm.dim() == 0 and float(norm) > 1.0  # large enough to be clipped
    assert torch.equal(norm, expected)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)
    clipped = torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(p.grad) for p in model.parameters()])
    )
    assert abs(float(clipped) - 1.0) < 1e-4
