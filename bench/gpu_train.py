#!/usr/bin/env python
"""Training throughput and MFU of the orchestrator's own training step on one GPU.

ViT-B/16 (224px, 1000 classes) in images/s and GPT-2 small (seq 1024, vocab 50257) in
tokens/s, each in four modes: eager bf16, torch.compile (per block, and the loss) bf16,
compile + float8 (the block Linears that torchao's filter keeps), and compile + every
Triton kernel (kernels: triton). What is timed is `Trainer.step`, the step a job runs:
the model after `parallelize`, the loss, the optimizer, clipping and the schedule. Only the
data is synthetic and already on the GPU, so the numbers are the step's; `--loader` also
times the data loader alone, to show whether it could keep up.

Per configuration: the first step (compilation, autotuning) is timed alone and reported
as `compile_s`; then warm-up steps; then `--steps` steps with a CUDA event at each step's
start and no host sync in between, so the step time is the GPU's period between steps
(host overhead that the GPU waits for is in it; overhead hidden behind GPU work is not).
The median of those periods is the step time. FLOPs per step come from
workers/throughput.py (FlopCounterMode, counted once on the meta device); MFU is against
the device's dense bf16 peak from the same module, and not reported for fp8.
`--legacy-loop` also times each mode with the loop as it was before the GPU measurements
(for-each AdamW, an fp32 copy of the logits, an uncompiled loss): before and after, same run.
Results go to bench/results/gpu_train-<gpu>-<date>.{json,md} with provenance.

    python bench/gpu_train.py                      # or: torchrun --nproc_per_node=1 bench/gpu_train.py
    python bench/gpu_train.py --models gpt2_small --modes compile --steps 50
    python bench/gpu_train.py --dry-run --out /tmp/x   # CPU smoke test on tiny shapes

The modes and workloads are bench/gpu_train_workloads.py's; the report, bench/gpu_train_report.py's.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# the repository first: this script's own directory holds bench/kernels.py, which would
# otherwise shadow the `kernels` package
sys.path.insert(0, str(REPO))

from bench.gpu_train_report import markdown, provenance  # noqa: E402  (after the path fix above)
from bench.gpu_train_workloads import (  # noqa: E402
    MODES,
    TARGETS,
    TINY,
    WORKLOADS,
    make_spec,
    synthetic_batch,
    use_legacy_loop,
)

NO_GPU_MESSAGE = "no CUDA device: GPU training benchmarks need a GPU"


def time_steps(step, device, steps: int) -> tuple[list[float], float]:
    """(GPU period of each step in seconds, wall seconds for all of them): an event at each
    step's start and one after the last; no host sync in between."""
    import torch

    from workers import throughput

    if device.type != "cuda":  # CPU dry run: the host clock is the device clock
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        return times, sum(times)
    events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
    throughput.synchronize(device)
    wall = time.perf_counter()
    for i in range(steps):
        events[i].record()
        step()
    events[steps].record()
    throughput.synchronize(device)
    wall = time.perf_counter() - wall
    return [a.elapsed_time(b) / 1e3 for a, b in zip(events, events[1:])], wall


def profile_steps(step, device, steps: int, path: Path) -> str:
    """The GPU kernels of `steps` steps, by total time (torch.profiler), written to `path`."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize(device) if device.type == "cuda" else None
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort, row_limit=40, max_name_column_width=90)
    path.write_text(table)
    return table


def bench_one(
    name: str,
    mode: str,
    workload,
    device,
    steps: int,
    warmup: int,
    legacy: bool,
    profile_dir: Path | None = None,
    profile: int = 0,
) -> dict:
    import torch

    from workers import throughput
    from workers.context import LocalContext
    from workers.trainer import Trainer

    model_section, data_section, batch = workload
    dtype, compile_, kernel_impls = MODES[mode]
    torch.compiler.reset()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="gpu-train-") as storage:
        spec = make_spec(model_section, data_section, batch, mode, storage)
        trainer = Trainer(spec, LocalContext(spec))
        if legacy:
            use_legacy_loop(trainer)
        info = trainer.info
        x, y = synthetic_batch(info, device, batch)
        losses = []

        def step():
            losses.append(trainer.step([(x, y)]))

        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        throughput.synchronize(device)
        start = time.perf_counter()
        step()  # compiles every graph of the step, autotunes every Triton kernel
        throughput.synchronize(device)
        first = time.perf_counter() - start
        time_steps(step, device, warmup)
        times, wall = time_steps(step, device, steps)
        if profile and profile_dir is not None:
            table = profile_steps(
                step, device, profile, profile_dir / f"profile-{name}-{mode}{'-legacy' if legacy else ''}.txt"
            )
            print("\n".join(table.splitlines()[:25]), flush=True)
        if not all(torch.isfinite(torch.stack(losses)).tolist()):
            raise RuntimeError(f"{name} {mode}: loss is not finite")
        max_memory = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    step_s = statistics.median(times)
    flops_per_step = throughput.train_flops_per_sample(spec.model, info) * batch
    achieved = flops_per_step / step_s
    mfu, mfu_note = (
        throughput.mfu(achieved, throughput.device_name(device), dtype)
        if device.type == "cuda"
        else (None, "no MFU on a CPU")
    )
    tokens = info.seq_len if info.kind == "tokens" else 1
    result = {
        "model": name,
        "preset": spec.model.preset,
        "mode": mode,
        "loop": "legacy" if legacy else "current",
        "dtype": dtype,
        "compile": compile_,
        "kernels": kernel_impls or "auto",
        "batch": batch,
        "input": list(x.shape),
        "step_s_median": step_s,
        "step_s_min": min(times),
        "step_s_max": max(times),
        "step_s_wall_mean": wall / steps,
        "timed_steps": steps,
        "warmup_steps": warmup,
        "compile_s": max(first - step_s, 0.0) if compile_ else None,
        "first_step_s": first,
        "samples_per_s": batch / step_s,
        "tokens_per_s": batch * tokens / step_s if tokens > 1 else None,
        "flops_per_step": flops_per_step,
        "tflops": achieved / 1e12,
        "mfu": mfu,
        "mfu_note": mfu_note,
        "max_memory_gib": max_memory,
        "final_loss": float(losses[-1]),
        "model_overrides": model_section.get("overrides", {}),
    }
    unit, target = TARGETS[name]
    result["target"] = (
        {"metric": unit, "figure": target, "ratio": result[unit] / target}
        if result[unit] is not None
        else None
    )
    return result


def loader_rate(name: str, workload, device, workers: int, batches: int) -> dict:
    """Samples/s that the job's own loader (synthetic source, `workers` processes, pinned
    memory) delivers to the GPU alone, for comparison with the step's samples/s."""
    import torch

    from workers.context import LocalContext
    from workers.trainer import Trainer

    model_section, data_section, batch = workload
    with tempfile.TemporaryDirectory(prefix="gpu-train-") as storage:
        spec = make_spec(model_section, data_section, batch, "eager", storage, loader_workers=workers)
        trainer = Trainer(spec, LocalContext(spec))
        it = trainer.batches.iterate(0)
        next(it)  # worker start-up
        start = time.perf_counter()
        for _ in range(batches):
            for x, y in next(it):
                x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
        del it, trainer
    return {
        "model": name,
        "loader_workers": workers,
        "batch": batch,
        "batches": batches,
        "samples_per_s": batches * batch / seconds,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument(
        "--batch", nargs="+", default=[], metavar="MODEL=N", help="batch size per model, e.g. gpt2_small=32"
    )
    parser.add_argument("--steps", type=int, default=30, help="timed steady-state steps")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps after the first")
    parser.add_argument(
        "--legacy-loop",
        action="store_true",
        help="also time every mode with the loop as it was before (see the docstring)",
    )
    parser.add_argument(
        "--loader",
        type=int,
        default=0,
        metavar="WORKERS",
        help="also time the data loader alone with this many worker processes",
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="STEPS",
        help="also profile this many steps per configuration (profile-*.txt beside the results)",
    )
    parser.add_argument(
        "--override",
        nargs="+",
        default=[],
        metavar="MODEL.KEY=VALUE",
        help="model config override, e.g. gpt2_small.vocab_multiple=64",
    )
    parser.add_argument("--out", help="results directory (default bench/results; a temp dir for --dry-run)")
    parser.add_argument(
        "--dry-run", action="store_true", help="smoke test on tiny shapes, on the CPU when there is no GPU"
    )
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
            os.environ.setdefault("TRITON_INTERPRET", "1")  # the Triton kernels on a CPU
        args.steps, args.warmup = min(args.steps, 2), 0
    device = (
        torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        if torch.cuda.is_available()
        else torch.device("cpu")
    )
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    workloads = {name: tuple(w) for name, w in (TINY if args.dry_run else WORKLOADS).items()}
    for item in args.batch:
        name, _, size = item.partition("=")
        if name not in workloads or not size.isdigit():
            parser.error(f"--batch {item}: expected MODEL=N with MODEL one of {', '.join(workloads)}")
        workloads[name] = (*workloads[name][:2], int(size))
    for item in args.override:
        target, _, value = item.partition("=")
        name, _, key = target.partition(".")
        if name not in workloads or not key or not value:
            parser.error(
                f"--override {item}: expected MODEL.KEY=VALUE with MODEL one of {', '.join(workloads)}"
            )
        model = {**workloads[name][0]}
        model["overrides"] = {**model.get("overrides", {}), key: json.loads(value)}
        workloads[name] = (model, *workloads[name][1:])
    report = {"provenance": provenance(device, args.dry_run), "results": [], "loader": []}
    out = (
        Path(args.out)
        if args.out
        else (Path(tempfile.mkdtemp(prefix="gpu-train-dry-run-")) if args.dry_run else REPO / "bench/results")
    )
    out.mkdir(parents=True, exist_ok=True)
    gpu = "".join(c if c.isalnum() else "-" for c in report["provenance"]["device"]).strip("-").lower()
    stem = out / f"gpu_train-{gpu}-{dt.date.today().isoformat()}"

    def save():  # after every configuration, so a run cut short keeps what it measured
        stem.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
        stem.with_suffix(".md").write_text(markdown(report))

    loops = (False, True) if args.legacy_loop else (False,)
    for name in args.models:
        for mode in args.modes:
            for legacy in loops:
                try:
                    result = bench_one(
                        name,
                        mode,
                        workloads[name],
                        device,
                        args.steps,
                        args.warmup,
                        legacy,
                        out,
                        args.profile,
                    )
                except torch.cuda.OutOfMemoryError:
                    result = {
                        "model": name,
                        "mode": mode,
                        "loop": "legacy" if legacy else "current",
                        "error": "out of memory",
                    }
                report["results"].append(result)
                print(json.dumps(result), flush=True)
                save()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        if args.loader:
            report["loader"].append(loader_rate(name, workloads[name], device, args.loader, 10))
            print(json.dumps(report["loader"][-1]), flush=True)
            save()
    print(markdown(report))
    print(f"wrote {stem}.json and {stem}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
