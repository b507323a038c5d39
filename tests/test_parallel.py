"""Data parallelism on CPU (gloo, 2 processes): FSDP2 and DDP against one process.

All 2-process runs come from one torchrun launch (tests/dist_suite.py). Same seed, no
dropout, and the loader gives the union of the workers' samples per step, so 2 workers
must reproduce one process with the combined batch.

Tolerances (relative, per logged step; measured deviations in docs/scaling.md):
- fp32: 1e-5. Only the summation order of the gradient reduction differs.
- bf16: 2e-2 against one process in bf16. DDP autocasts like the single process; FSDP2 casts
  parameters (MixedPrecisionPolicy) and runs norms and softmax in bf16 too, so its rounding
  differs from autocast's. bf16 keeps 8 bits of mantissa (relative step 2^-8 = 3.9e-3) and
  20 optimizer steps compound it.
"""

import pytest
import torch

from tests.dist_suite import STEPS, suite
from workers.parallel import parallelize

FP32_TOL, BF16_TOL = 1e-5, 2e-2


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return suite(tmp_path_factory.getbasetemp() / "dist_suite")


def max_rel(a: dict, b: dict, steps) -> float:
    return max(abs(a[s] - b[s]) / abs(b[s]) for s in steps)


def test_fsdp2_and_ddp_match_one_process_in_fp32(runs):
    one = runs["one"].losses
    assert sorted(one) == list(range(1, STEPS + 1))
    for name in ("fsdp2", "ddp"):  # fsdp2 also accumulates 2 micro-batches per step
        losses = runs[name].losses
        assert sorted(losses) == sorted(one), name
        assert max_rel(losses, one, one) <= FP32_TOL, name
        # the norm clipping computes: under FSDP2 each rank's partial norms are made whole
        norms = runs[name].grad_norms
        assert sorted(norms) == sorted(one), name
        assert max_rel(norms, runs["one"].grad_norms, one) <= FP32_TOL, name
        assert runs[name].summary["world_size"] == 2
    assert one[STEPS] < one[1] - 0.5  # and it learns


def test_bf16_stays_within_tolerance_of_one_process_in_bf16(runs):
    one_bf16, one = runs["one_bf16"].losses, runs["one"].losses
    for name in ("fsdp2_bf16", "ddp_bf16"):
        assert max_rel(runs[name].losses, one_bf16, one_bf16) <= BF16_TOL, name
    assert max_rel(one_bf16, one, one) <= BF16_TOL  # and bf16 itself stays near fp32


def test_fp16_under_fsdp2_scales_the_loss_with_the_sharded_grad_scaler(runs, tmp_path):
    run = runs["fsdp2_fp16"]
    losses, one = run.losses, runs["one"].losses
    assert all(torch.isfinite(torch.tensor(list(losses.values()))))
    assert losses[12] < losses[1] - 0.4
    # until the first overflow the fp16 run follows fp32 closely
    assert max_rel(losses, one, range(1, 6)) <= BF16_TOL
    state = torch.load(run.directory / "checkpoint_00000012/trainer.pt", weights_only=True)
    # the scale started at 2^16 and backed off: an overflow was found, on both ranks' shards,
    # and that step skipped (a rank-local check would leave the shards inconsistent)
    assert state["scaler"]["scale"] < 2.0**16


def test_float8_compile_and_activation_checkpointing_together_under_fsdp2_and_ddp(runs):
    gpt, vit = runs["gpt_fsdp2_fp8"], runs["vit_ddp_fp8"]
    # fp8 against the bf16 run of one process: the tolerance of tests/test_precision.py
    assert max_rel(gpt.losses, runs["gpt_bf16"].losses, gpt.losses) <= 5e-2
    assert max_rel(vit.losses, runs["one_bf16"].losses, vit.losses) <= 5e-2
    for run in (gpt, vit):
        assert run.summary["throughput"]["compile_s"] > 0  # reported apart from the step time
        assert run.summary["throughput"]["mfu"] is None  # no MFU for fp8 (nor on a CPU)


def test_parallelize_applies_fsdp2_per_block_and_at_the_root_in_one_process():
    """`run --local` of an fsdp2 job: a one-process group, the same per-block sharding."""
    from torch.distributed.fsdp import FSDPModule

    from core.spec import validate
    from workers import models

    spec = validate(
        {
            "name": "t",
            "model": {"family": "gpt", "preset": "gpt_nano"},
            "data": {"source": "synthetic", "kind": "tokens", "seq_len": 16},
            "train": {"steps": 1},
            "parallel": {"strategy": "fsdp2"},
            "precision": {"dtype": "bf16"},
        }
    )
    model = models.build(spec.model, None)
    try:
        wrapped = parallelize(model, spec)
        assert isinstance(wrapped, FSDPModule)
        assert all(isinstance(block, FSDPModule) for block in wrapped.blocks)
        logits = wrapped(torch.randint(0, 256, (2, 16)))
        assert logits.dtype == torch.bfloat16  # MixedPrecisionPolicy computes in bf16
        assert next(wrapped.parameters()).dtype == torch.float32  # and keeps fp32 parameters
    finally:
        torch.distributed.destroy_process_group()
