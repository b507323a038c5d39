#!/usr/bin/env python
"""Benchmark the fused Triton kernels against torch eager, torch.compile and,
for attention, SDPA with each explicit backend (flash, cuDNN, efficient).

For every op at the shapes the project's models use (ViT-B/16, GPT-2 small)
and at larger hidden sizes, it times forward and forward+backward with
triton.testing.do_bench (median of fresh random bf16 inputs), records the
peak-memory delta of one step, prints a ratio table and writes
bench/results/kernels-<gpu>-<date>.{json,md} with provenance.  The numbers
feed the CUDA dispatch table, kernels/dispatch_table.json (``--write-table``).

    python bench/kernels.py [--quick] [--ops attention,layer_norm] [--dtype bf16]

The report (markdown, targets) is bench/kernels_report.py's; `--write-table` is
bench/kernels_table.py's.
"""

import argparse
import datetime as dt
import json
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# this file is named like the package it measures: drop bench/ from the path so that
# `import kernels` finds the package, not this script
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(REPO))

from bench.kernels_report import render_markdown, result_paths, speedups  # noqa: E402
from bench.kernels_table import write_table  # noqa: E402
from bench.provenance import git_commit  # noqa: E402  (after the path fix above)

NO_GPU_MESSAGE = "no CUDA device; kernel benchmarks need a GPU"
OPS = ("layer_norm", "attention", "cross_entropy", "fused_linear_cross_entropy", "bias_gelu")
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}

# (case label, shape parameters).  ViT-B/16: 197 tokens, dim 768, 12 heads of 64,
# MLP 3072; GPT-2 small: seq 1024, dim 768, vocab 50257; then dims 2048 / 4096.
CASES = {
    "layer_norm": [
        ("vit-b b64", dict(rows=64 * 197, dim=768)),
        ("gpt2-s b8", dict(rows=8 * 1024, dim=768)),
        ("dim2048", dict(rows=8 * 1024, dim=2048)),
        ("dim4096", dict(rows=8 * 1024, dim=4096)),
    ],
    "attention": [
        ("vit-b b64", dict(batch=64, heads=12, seq=197, head_dim=64, causal=False)),
        ("gpt2-s b8", dict(batch=8, heads=12, seq=1024, head_dim=64, causal=True)),
        ("b8 full", dict(batch=8, heads=12, seq=1024, head_dim=64, causal=False)),
        ("dim2048", dict(batch=4, heads=16, seq=2048, head_dim=128, causal=True)),
        ("dim4096", dict(batch=2, heads=32, seq=2048, head_dim=128, causal=True)),
    ],
    "cross_entropy": [
        ("vit-b head", dict(rows=64, vocab=1000)),
        ("gpt2-s b8", dict(rows=8 * 1024, vocab=50257)),
        ("gpt2-s b16", dict(rows=16 * 1024, vocab=50257)),
    ],
    "fused_linear_cross_entropy": [
        ("gpt2-s b8", dict(rows=8 * 1024, hidden=768, vocab=50257)),
        ("dim2048", dict(rows=8 * 1024, hidden=2048, vocab=50257)),
        ("dim4096", dict(rows=4 * 1024, hidden=4096, vocab=50257)),
    ],
    "bias_gelu": [
        ("vit-b b64", dict(rows=64 * 197, dim=3072)),
        ("gpt2-s b8", dict(rows=8 * 1024, dim=3072)),
        ("dim2048", dict(rows=8 * 1024, dim=8192)),
        ("dim4096", dict(rows=8 * 1024, dim=16384)),
    ],
}
QUICK_CASE = {
    "layer_norm": "gpt2-s b8",
    "attention": "gpt2-s b8",
    "cross_entropy": "gpt2-s b8",
    "fused_linear_cross_entropy": "gpt2-s b8",
    "bias_gelu": "gpt2-s b8",
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="Benchmark kernels/ (Triton) against torch eager, "
        "torch.compile and SDPA backends. Needs a CUDA GPU."
    )
    p.add_argument(
        "--quick", action="store_true", help="one shape per op (GPT-2 small) and fewer repetitions"
    )
    p.add_argument("--ops", default=",".join(OPS), help=f"comma-separated subset of {','.join(OPS)}")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    p.add_argument("--out-dir", type=Path, default=REPO / "bench" / "results")
    p.add_argument(
        "--write-table",
        nargs="+",
        type=Path,
        metavar="RESULTS_JSON",
        help="no benchmark: write kernels/dispatch_table.json from these results files",
    )
    p.add_argument(
        "--table",
        type=Path,
        default=REPO / "kernels" / "dispatch_table.json",
        help="where --write-table writes",
    )
    p.add_argument(
        "--render",
        type=Path,
        metavar="RESULTS_JSON",
        help="no benchmark: print the markdown report of a results file",
    )
    args = p.parse_args(argv)
    args.ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = sorted(set(args.ops) - set(OPS))
    if unknown:
        p.error(f"unknown ops {unknown}; choose from {OPS}")
    return args


# --- GPU part ----------------------------------------------------------------

# variants that overwrite their inputs get inputs of their own
MUTATES_INPUTS = {"triton-inplace"}


def _make_case(op: str, p: dict, dtype, device):
    """Returns (make_inputs, {variant: fn}); make_inputs() draws fresh random inputs."""
    import torch
    import torch.nn.functional as F

    import kernels

    def rnd(*shape, scale=1.0, grad=True):
        return (torch.randn(*shape, device=device, dtype=dtype) * scale).requires_grad_(grad)

    impls = ("triton", "torch")
    if op == "layer_norm":
        make = lambda: (rnd(p["rows"], p["dim"]), rnd(p["dim"]), rnd(p["dim"]))  # noqa: E731
        fns = {impl: (lambda x, w, b, impl=impl: kernels.layer_norm(x, w, b, impl=impl)) for impl in impls}
    elif op == "attention":
        shape = (p["batch"], p["heads"], p["seq"], p["head_dim"])
        make = lambda: (rnd(*shape), rnd(*shape), rnd(*shape))  # noqa: E731
        fns = {
            impl: (lambda q, k, v, impl=impl: kernels.attention(q, k, v, p["causal"], impl=impl))
            for impl in impls
        }
    elif op == "cross_entropy":
        target = torch.randint(0, p["vocab"], (p["rows"],), device=device)
        make = lambda: (rnd(p["rows"], p["vocab"], scale=2.0),)  # noqa: E731
        fns = {
            impl: (lambda x, impl=impl: kernels.cross_entropy(x, target, 0.1, impl=impl)) for impl in impls
        }
        # what the training loop runs: the gradient written into the logits in the forward
        fns["triton-inplace"] = lambda x: kernels.cross_entropy(
            x, target, 0.1, impl="triton", inplace_backward=True
        )
        # F.cross_entropy straight on 16-bit logits (outside autocast): less exact, less memory
        fns["eager-lowp"] = lambda x: F.cross_entropy(x, target, label_smoothing=0.1)
    elif op == "fused_linear_cross_entropy":
        target = torch.randint(0, p["vocab"], (p["rows"],), device=device)
        make = lambda: (
            rnd(p["rows"], p["hidden"]),  # noqa: E731
            rnd(p["vocab"], p["hidden"], scale=p["hidden"] ** -0.5),
        )
        fns = {
            impl: (lambda h, w, impl=impl: kernels.fused_linear_cross_entropy(h, w, target, impl=impl))
            for impl in impls
        }
    elif op == "bias_gelu":
        make = lambda: (rnd(p["rows"], p["dim"]), rnd(p["dim"]))  # noqa: E731
        fns = {impl: (lambda x, b, impl=impl: kernels.bias_gelu(x, b, impl=impl)) for impl in impls}
    else:
        raise ValueError(op)
    fns["eager"] = fns.pop("torch")
    if op == "attention":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        for name, backend in (
            ("sdpa-flash", SDPBackend.FLASH_ATTENTION),
            ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION),
            ("sdpa-efficient", SDPBackend.EFFICIENT_ATTENTION),
        ):

            def run(q, k, v, backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=p["causal"])

            fns[name] = run
    return make, fns


def _input_sets(make, l2_bytes: int, max_sets: int = 8) -> list:
    """Enough input sets that cycling through them overflows the L2 cache (3x its size),
    so a timed call never finds its inputs already cached by the previous one."""
    first = make()
    size = sum(t.numel() * t.element_size() for t in first)
    count = min(max_sets, max(1, -(-3 * l2_bytes // size)))
    return [first] + [make() for _ in range(count - 1)]


def _stepper(fn, sets, mode: str):
    import torch

    state = {"i": 0}
    grads = {}

    def step():
        inputs = sets[state["i"] % len(sets)]
        state["i"] += 1
        y = fn(*inputs)
        if mode == "fwd+bwd":
            if "grad" not in grads:  # a loss gets 1 (as in training), a tensor random values
                grads["grad"] = torch.ones_like(y) if y.dim() == 0 else torch.randn_like(y)
            leaves = [t for t in inputs if t.requires_grad]
            torch.autograd.grad(y, leaves, grads["grad"])
        return y

    return step


def _kernel_ms(step, calls: int) -> float:
    """GPU time per call: the summed durations of the kernels (and copies) that `calls`
    calls launch, read by the profiler. Host overhead (Python, dispatch, launch gaps) is
    left out: this is the kernels' own time, what a GPU-bound training step pays."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            step()
        torch.cuda.synchronize()
    total_us = sum(e.time_range.elapsed_us() for e in prof.events() if e.device_type == DeviceType.CUDA)
    return total_us / 1e3 / calls


def _measure(fn, sets, mode: str, quick: bool):
    """(do_bench median ms, kernel ms, peak MiB of one call, first output)."""
    import torch
    import triton

    step = _stepper(fn, sets, mode)
    out = step()  # compile / autotune outside the timed and measured region
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    ms = triton.testing.do_bench(
        step, warmup=5 if quick else 25, rep=20 if quick else 100, return_mode="median"
    )
    kernel_ms = _kernel_ms(step, calls=max(len(sets), 5))
    return ms, kernel_ms, peak, out


def autotune_choices() -> dict:
    """{kernel: {autotune key: chosen config}} for every autotuned kernel used so far."""
    import importlib

    import triton

    choices = {}
    for name in ("layer_norm", "attention", "cross_entropy", "mlp"):
        module = importlib.import_module(f"kernels.{name}")
        if module._triton_kernels.cache_info().currsize == 0:
            continue
        for kernel in vars(module._triton_kernels(False)).values():
            if isinstance(kernel, triton.runtime.Autotuner) and kernel.cache:
                choices[kernel.fn.__name__] = {str(k): str(c) for k, c in kernel.cache.items()}
    return choices


def run_benchmarks(args, save=lambda rows: None) -> list:
    import torch

    dtype = getattr(torch, DTYPES[args.dtype])
    device = torch.device("cuda")
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 * 2**20)
    rows = []
    for op in args.ops:
        for case, params in CASES[op]:
            if args.quick and case != QUICK_CASE[op]:
                continue
            torch.manual_seed(0)
            torch.compiler.reset()
            make, fns = _make_case(op, params, dtype, device)
            if not args.no_compile:  # one compiled function per case: fwd, then fwd+bwd
                fns["compile"] = torch.compile(fns["eager"], dynamic=False)
            shared = _input_sets(make, l2)
            for mode in ("fwd", "fwd+bwd"):
                row = {
                    "op": op,
                    "case": case,
                    "mode": mode,
                    "params": params,
                    "ms": {},
                    "kernel_ms": {},
                    "peak_mib": {},
                    "errors": {},
                    "input_sets": len(shared),
                }
                outs = {}
                for name, fn in fns.items():
                    sets = (
                        [tuple(t.detach().clone().requires_grad_(t.requires_grad) for t in s) for s in shared]
                        if name in MUTATES_INPUTS
                        else shared
                    )
                    try:
                        ms, kernel_ms, peak, outs[name] = _measure(fn, sets, mode, args.quick)
                        row["ms"][name], row["peak_mib"][name] = round(ms, 4), round(peak, 1)
                        row["kernel_ms"][name] = None if kernel_ms is None else round(kernel_ms, 4)
                    except Exception as exc:  # e.g. an SDPA backend that rejects the shape
                        row["ms"][name] = row["kernel_ms"][name] = None
                        row["errors"][name] = f"{type(exc).__name__}: {str(exc)[:200]}"
                    del sets
                if "triton" in outs and "eager" in outs:
                    row["max_abs_err"] = (outs["triton"].float() - outs["eager"].float()).abs().max().item()
                rows.append(row)
                sp = speedups(row)
                print(
                    f"{op:<27} {case:<11} {mode:<8} "
                    + " ".join(f"{k}={v:.3f}ms" for k, v in row["ms"].items() if v is not None)
                    + "  speedup "
                    + " ".join(f"{k}:{v:.2f}x" for k, v in sp.items()),
                    flush=True,
                )
                del outs
                save(rows)
            del shared, fns
            torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.render:
        report = json.loads(args.render.read_text())
        print(render_markdown(report["meta"], report["results"]))
        return 0
    if args.write_table:
        table = write_table(args.write_table, args.table)
        wins = [f"{e['op']} {e['dtype']} {e['bucket']}" for e in table["entries"] if e["impl"] == "triton"]
        print(f"wrote {args.table}: {len(table['entries'])} entries; Triton at: {', '.join(wins) or 'none'}")
        return 0
    import torch

    if not torch.cuda.is_available():
        print(NO_GPU_MESSAGE)
        return 0
    import triton

    now = dt.datetime.now(dt.timezone.utc)
    gpu = torch.cuda.get_device_name()
    meta = {
        "gpu": gpu,
        "date": now.isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "commit": git_commit(),
        "dtype": args.dtype,
        "command": shlex.join(["python"] + sys.argv),
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = result_paths(args.out_dir, gpu, now.strftime("%Y-%m-%d"))

    def save(rows):  # after every case, so a run cut short keeps what it measured
        try:
            choices = autotune_choices()
        except Exception as exc:  # the timings matter more than this record
            choices = {"error": f"{type(exc).__name__}: {exc}"}
        json_path.write_text(
            json.dumps({"meta": meta, "results": rows, "autotune": choices}, indent=2) + "\n"
        )
        md_path.write_text(render_markdown(meta, rows))

    rows = run_benchmarks(args, save)
    save(rows)
    markdown = render_markdown(meta, rows)
    print(markdown)
    print(f"wrote {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
