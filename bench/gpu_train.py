#!/usr/bin/env python
"""Training throughput and MFU of the orchestrator's own training step on one GPU.

ViT-B/16 (224px, 1000 classes) in images/s and GPT-2 small (seq 1024, vocab 50257) in
tokens/s, each in three modes: eager bf16, torch.compile (per block) bf16, and
compile + float8 (the block Linears that torchao's filter keeps). The model, the
`parallelize` step (float8, compile), the optimizer and the autocast are the ones a job
gets; only the data is synthetic, already on the GPU, so the numbers are the model's.

Per configuration: the first step (compilation) is timed alone as `compile_s`, then
warm-up steps, then the median of the timed steady-state steps. FLOPs per step come from
workers/throughput.py (FlopCounterMode, counted once on the meta device); MFU is against
the device's dense bf16 peak from the same module, and not reported for fp8.
Results go to bench/results/gpu_train-<gpu>-<date>.{json,md} with provenance.

    python bench/gpu_train.py                      # or: torchrun --nproc_per_node=1 bench/gpu_train.py
    python bench/gpu_train.py --models gpt2_small --modes compile --steps 50
    python bench/gpu_train.py --dry-run --out /tmp/x   # CPU smoke test on tiny shapes
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# the repository first: this script's own directory holds bench/kernels.py, which would
# otherwise shadow the `kernels` package
sys.path.insert(0, str(REPO))

NO_GPU_MESSAGE = "no CUDA device: GPU training benchmarks need a GPU"
MODES = {"eager": ("bf16", False), "compile": ("bf16", True), "compile+fp8": ("fp8", True)}

# model -> (spec model section, data section, batch size); the shapes the issue names
WORKLOADS = {
    "vit_b16": ({"family": "vit", "preset": "vit_b16"},
                {"source": "synthetic", "kind": "image", "image_size": 224, "in_channels": 3,
                 "num_classes": 1000}, 256),
    "gpt2_small": ({"family": "gpt", "preset": "gpt2_small"},
                   {"source": "synthetic", "kind": "tokens", "seq_len": 1024, "vocab_size": 50257},
                   16),
}
# --dry-run: the same code path on shapes a CPU runs in seconds
TINY = {
    "vit_b16": ({"family": "vit", "preset": "vit_micro", "overrides": {"depth": 1}},
                {"source": "synthetic", "kind": "image", "image_size": 28, "in_channels": 1,
                 "num_classes": 10}, 8),
    "gpt2_small": ({"family": "gpt", "preset": "gpt_nano", "overrides": {"n_layer": 1}},
                   {"source": "synthetic", "kind": "tokens", "seq_len": 32, "vocab_size": 256}, 4),
}


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                             timeout=10)
        return out.stdout.strip() if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def make_spec(model: dict, data: dict, batch: int, dtype: str, compile_: bool):
    from orchestrator.spec import validate

    return validate({
        "name": "bench", "model": model, "data": {**data, "batch_size": batch, "eval_split": 0.0},
        "train": {"steps": 1, "clip_grad_norm": 1.0},
        "optimizer": {"name": "adamw", "lr": 1e-4, "weight_decay": 0.1},
        "parallel": {"strategy": "none"}, "precision": {"dtype": dtype, "compile": compile_}})


def synthetic_batch(spec, info, device, batch: int):
    import torch

    if info.kind == "tokens":
        x = torch.randint(0, info.vocab_size, (batch, info.seq_len), device=device)
        return x, torch.roll(x, -1, dims=1)
    x = torch.randn(batch, info.in_channels, info.image_size, info.image_size, device=device)
    return x, torch.randint(0, info.num_classes, (batch,), device=device)


def bench_one(name: str, mode: str, workload, device, steps: int, warmup: int) -> dict:
    import torch

    import kernels
    from workers import data, models, throughput
    from workers.optim import build_optimizer
    from workers.parallel import parallelize
    from workers.precision import Precision

    model_section, data_section, batch = workload
    dtype, compile_ = MODES[mode]
    spec = make_spec(model_section, data_section, batch, dtype, compile_)
    info = data.describe(spec.data)
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = parallelize(models.build(spec.model, info).to(device), spec)
    optimizer = build_optimizer(model, spec.optimizer)
    precision = Precision(spec.precision, device)
    x, y = synthetic_batch(spec, info, device, batch)

    def step():
        with precision.autocast():
            logits = model(x)
        loss = kernels.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.train.clip_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    def timed() -> float:
        throughput.synchronize(device)
        start = time.perf_counter()
        loss = step()
        throughput.synchronize(device)
        if not torch.isfinite(loss):
            raise RuntimeError(f"{name} {mode}: loss is not finite")
        return time.perf_counter() - start

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    first = timed()  # compiles every graph of the step
    for _ in range(warmup):
        timed()
    times = [timed() for _ in range(steps)]
    step_s = statistics.median(times)
    flops_per_step = throughput.train_flops_per_sample(spec.model, info) * batch
    achieved = flops_per_step / step_s
    mfu, mfu_note = throughput.mfu(achieved, throughput.device_name(device), dtype) \
        if device.type == "cuda" else (None, "no MFU on a CPU")
    tokens = info.seq_len if info.kind == "tokens" else 1
    return {
        "model": name, "preset": spec.model.preset, "mode": mode, "dtype": dtype,
        "compile": compile_, "batch": batch, "input": list(x.shape),
        "step_s_median": step_s, "step_s_min": min(times), "step_s_max": max(times),
        "timed_steps": steps, "warmup_steps": warmup,
        "compile_s": max(first - step_s, 0.0) if compile_ else None, "first_step_s": first,
        "samples_per_s": batch / step_s, "tokens_per_s": batch * tokens / step_s if tokens > 1 else None,
        "flops_per_step": flops_per_step, "tflops": achieved / 1e12, "mfu": mfu, "mfu_note": mfu_note,
        "max_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
    }


def provenance(device, dry_run: bool) -> dict:
    import torch
    import triton

    from workers import throughput

    return {
        "device": throughput.device_name(device), "torch": torch.__version__,
        "triton": triton.__version__, "cuda": torch.version.cuda, "commit": git_commit(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable, *sys.argv]), "dry_run": dry_run,
        "compile_backend": os.environ.get("ORCHESTRATOR_COMPILE_BACKEND", "inductor"),
    }


def markdown(report: dict) -> str:
    p = report["provenance"]
    lines = [f"# Training throughput on {p['device']}" + (" (dry run on tiny shapes)" if p["dry_run"] else ""),
             "", f"- torch {p['torch']}, triton {p['triton']}, CUDA {p['cuda']}, commit `{p['commit']}`",
             f"- {p['date']}; command: `{p['command']}`",
             f"- median of the timed steady-state steps; compile time apart; FLOPs: FlopCounterMode "
             f"(2 per MAC, forward + backward); MFU against the dense bf16 peak, none for fp8", "",
             "| model | mode | batch | step ms | samples/s | tokens/s | TFLOP/s | MFU | compile s | memory GiB |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in report["results"]:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['mode']} | | {r['error']} | | | | | | |")
            continue
        fmt = lambda v, f: "" if v is None else format(v, f)  # noqa: E731
        lines.append(f"| {r['preset']} | {r['mode']} | {r['batch']} | {r['step_s_median'] * 1e3:.1f} | "
                     f"{r['samples_per_s']:,.0f} | {fmt(r['tokens_per_s'], ',.0f')} | {r['tflops']:.3g} | "
                     f"{fmt(r['mfu'] and 100 * r['mfu'], '.1f')}{'%' if r['mfu'] else ''} | "
                     f"{fmt(r['compile_s'], '.1f')} | {fmt(r['max_memory_gib'], '.1f')} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--steps", type=int, default=30, help="timed steady-state steps")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps after the first")
    parser.add_argument("--out", help="results directory (default bench/results; a temp dir for --dry-run)")
    parser.add_argument("--dry-run", action="store_true",
                        help="smoke test on tiny shapes, on the CPU when there is no GPU")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available() and not args.dry_run:
        print(NO_GPU_MESSAGE)
        return 0
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        print("error: this benchmark measures one GPU; use torchrun --nproc_per_node=1", file=sys.stderr)
        return 2
    if args.dry_run:
        if not torch.cuda.is_available():  # inductor's C++ build takes minutes on a small CPU
            os.environ.setdefault("ORCHESTRATOR_COMPILE_BACKEND", "aot_eager")
        args.steps, args.warmup = min(args.steps, 3), min(args.warmup, 1)
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if torch.cuda.is_available() \
        else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    workloads = TINY if args.dry_run else WORKLOADS
    report = {"provenance": provenance(device, args.dry_run), "results": []}
    for name in args.models:
        for mode in args.modes:
            try:
                result = bench_one(name, mode, workloads[name], device, args.steps, args.warmup)
            except torch.cuda.OutOfMemoryError:
                result = {"model": name, "mode": mode, "error": "out of memory"}
            report["results"].append(result)
            print(json.dumps(result), flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()

    out = Path(args.out) if args.out else (
        Path(tempfile.mkdtemp(prefix="gpu-train-dry-run-")) if args.dry_run else REPO / "bench/results")
    out.mkdir(parents=True, exist_ok=True)
    gpu = "".join(c if c.isalnum() else "-" for c in report["provenance"]["device"]).strip("-").lower()
    stem = out / f"gpu_train-{gpu}-{dt.date.today().isoformat()}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    stem.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))
    print(f"wrote {stem}.json and {stem}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
