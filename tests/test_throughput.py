"""Throughput accounting: FLOPs counted once, rates per worker and in total, MFU, and the GPU
training benchmark's CPU behaviour (it never writes numbers without a GPU)."""

import json
from types import SimpleNamespace

import pytest
import torch

from core.metrics_log import read_metrics
from tests.conftest import ROOT
from workers import throughput
from workers.data import DataInfo


def tokens_info(seq_len, vocab):
    return DataInfo.tokens(vocab, seq_len, train_size=1, eval_size=0)


def test_gpt2_small_flops_match_the_6n_plus_attention_formula():
    # PaLM's formula: 6 x (matmul parameters) per token + 12 x layers x seq x dim for attention
    # (causal attention counted in full, as FlopCounterMode and torchtitan do)
    L, d, V, T = 12, 768, 50257, 1024
    matmul_params = L * 12 * d * d + d * V  # qkv 3d^2, proj d^2, mlp 8d^2; the (tied) lm_head
    expected = T * (6 * matmul_params + 12 * L * T * d)
    model = SimpleNamespace(family="gpt", preset="gpt2_small", overrides={})
    assert throughput.train_flops_per_sample(model, tokens_info(T, V)) == expected


def test_vit_b16_flops_match_the_published_figure():
    # timm: 17.58 GMACs forward at 224px; training is ~3x the forward (the patch embedding
    # needs no input gradient, so slightly less)
    info = DataInfo.images(1000, 3, 224, train_size=1, eval_size=0)
    model = SimpleNamespace(family="vit", preset="vit_b16", overrides={})
    flops = throughput.train_flops_per_sample(model, info)
    assert flops == pytest.approx(3 * 2 * 17.58e9, rel=0.01)


@pytest.mark.parametrize(
    "name,peak",
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA A100-PCIE-40GB", 312.0),
        ("NVIDIA L40S", 362.0),
        ("NVIDIA B200", 2250.0),
        ("Tesla T4", None),
    ],
)
def test_peak_flops_by_device_name(name, peak):
    found = throughput.peak_tflops(name)
    assert (found[0] if found else None) == peak


def test_mfu_against_the_bf16_peak_and_never_for_fp8():
    value, note = throughput.mfu(494.5e12, "NVIDIA H100 80GB HBM3", "bf16")
    assert value == pytest.approx(0.5) and "989" in note
    assert throughput.mfu(494.5e12, "NVIDIA H100 80GB HBM3", "fp8") == (
        None,
        "no MFU for fp8: part of the model runs in bf16, so no single peak applies",
    )
    assert throughput.mfu(1e12, "Tesla T4", "bf16")[0] is None


def test_rates_per_worker_and_in_total(monkeypatch):
    meter = throughput.Meter(
        torch.device("cpu"),
        samples_per_step=32,
        tokens_per_sample=128,
        world_size=2,
        flops_per_sample=10**9,
        dtype="bf16",
    )
    rates = meter.rates(100.0)
    assert rates["samples_per_s_per_worker"] == 50.0 and rates["tokens_per_s"] == 12800.0
    assert rates["tokens_per_s_per_worker"] == 6400.0
    assert rates["tflops_per_worker"] == pytest.approx(0.05)
    assert rates["mfu"] is None and "CPU" in rates["mfu_note"]  # achieved FLOP/s only
    gpu = throughput.Meter(torch.device("cuda", 0), 32, 1, 2, 10**12, "bf16")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert gpu.rates(989.0 * 2)["mfu"] == pytest.approx(1.0)  # 989 samples/s/worker x 1 TFLOP


def test_the_trainer_reports_steady_state_throughput(tmp_path):
    from core.spec import load_spec
    from tests.dist_suite import GPT, GPT_JOB
    from workers.context import LocalContext
    from workers.run import train

    spec = load_spec(
        GPT_JOB,
        [
            *GPT,
            "train.steps=4",
            "data.eval_split=0",
            "parallel.strategy=none",
            f"checkpoint.storage={tmp_path}",
        ],
    )
    summary = train(spec, LocalContext(spec))
    rates = summary["throughput"]
    assert rates["steady_steps"] == 3  # the first step (warm-up) is left out
    assert rates["flops_per_step"] == 16 * throughput.train_flops_per_sample(spec.model, tokens_info(32, 256))
    assert rates["tokens_per_s"] == pytest.approx(32 * rates["samples_per_s"])
    assert rates["tflops_per_worker"] == pytest.approx(
        rates["flops_per_step"] / 1e12 / rates["step_time_s"], rel=1e-6
    )
    records = read_metrics(str(tmp_path / spec.name))
    assert all("tflops_per_worker" in r and "tokens_per_s" in r for r in records if "loss" in r)


def test_gpu_benchmark_says_it_needs_a_gpu_and_writes_nothing_on_a_cpu():
    before = sorted((ROOT / "bench/results").iterdir())
    result = _python(str(ROOT / "bench/gpu_train.py"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "no CUDA device: GPU training benchmarks need a GPU"
    assert sorted((ROOT / "bench/results").iterdir()) == before


def test_gpu_benchmark_dry_run_covers_the_whole_path_on_tiny_shapes(tmp_path):
    """The script's whole path before GPU minutes are spent on it. Compiled modes trace with
    "aot_eager", as the other CPU tests of compile do: inductor's C++ build on a CPU (3.5 min
    here) is not the Triton code a GPU gets, which the GPU session itself checks."""
    result = _python(
        str(ROOT / "bench/gpu_train.py"),
        "--dry-run",
        "--out",
        str(tmp_path),
        env={"ORCHESTRATOR_COMPILE_BACKEND": "aot_eager"},
    )
    assert result.returncode == 0, result.stderr
    [report_file] = tmp_path.glob("gpu_train-*.json")
    report = json.loads(report_file.read_text())
    prov = report["provenance"]
    assert prov["dry_run"] is True and prov["torch"] == torch.__version__
    assert prov["compile_backend"] == "aot_eager"
    assert {"device", "triton", "commit", "date", "command"} <= set(prov)
    results = {(r["model"], r["mode"]): r for r in report["results"]}
    assert set(results) == {
        (m, mode)
        for m in ("vit_b16", "gpt2_small")
        for mode in ("eager", "compile", "compile+fp8", "compile+triton")
    }
    for (model, mode), r in results.items():
        assert r["samples_per_s"] > 0 and r["tflops"] > 0 and r["mfu"] is None
        assert r["kernels"] == (
            "auto"
            if mode != "compile+triton"
            else {op: "triton" for op in ("attention", "layer_norm", "cross_entropy", "bias_gelu")}
        )
        assert (r["compile_s"] is None) == (mode == "eager")
        assert (r["tokens_per_s"] is not None) == (model == "gpt2_small")
    assert "| vit_micro, depth=1 | compile+fp8 |" in report_file.with_suffix(".md").read_text()


def _python(*args, env=None):
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_phase_timer_gives_means_per_step_and_nothing_when_off(monkeypatch):
    clock = [0.0]  # a clock the test moves: each phase takes what the test says, on any machine
    monkeypatch.setattr("workers.throughput.time.perf_counter", lambda: clock[0])
    timer = throughput.PhaseTimer(torch.device("cpu"))
    for compute_s in (0.25, 0.75):
        with timer.host("data"):
            clock[0] += 0.125
        with timer.device("compute"):
            clock[0] += compute_s
        timer.step_done()
    assert timer.means() == {"data_s": 0.125, "compute_s": 0.5}
    assert timer.means() == {}  # reset by reading
    timer.enabled = False  # a rank nobody reads the split of
    with timer.host("data"), timer.device("compute"):
        pass
    timer.step_done()
    assert timer.means() == {}


def test_log_fields_scale_with_samples_per_second():
    meter = throughput.Meter(torch.device("cpu"), 64, 128, 2, flops_per_sample=10**9)
    one, two = meter.log_fields(100.0), meter.log_fields(200.0)
    assert set(one) == {"tokens_per_s", "tflops_per_worker"}  # no MFU on a CPU
    assert one["tokens_per_s"] == 100.0 * 128 and one["tflops_per_worker"] == 100.0 / 2 * 1e9 / 1e12
    assert two == {k: 2 * v for k, v in one.items()}
