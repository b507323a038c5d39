#!/usr/bin/env python
"""Benchmark the fused Triton kernels against torch eager, torch.compile and,
for attention, SDPA with each explicit backend (flash, cuDNN, efficient).

For every op at the shapes the project's models use (ViT-B/16, GPT-2 small)
and at larger hidden sizes, it times forward and forward+backward with
triton.testing.do_bench (median of fresh random bf16 inputs), records the
peak-memory delta of one step, prints a ratio table and writes
bench/results/kernels-<gpu>-<date>.{json,md} with provenance.  The numbers
feed the CUDA dispatch table ``kernels._CUDA_TRITON_WINS``.

    python bench/kernels.py [--quick] [--ops attention,layer_norm] [--dtype bf16]
"""
import argparse
import datetime as dt
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# this file is named like the package it measures: drop bench/ from the path so that
# `import kernels` finds the package, not this script
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(REPO))

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
QUICK_CASE = {"layer_norm": "gpt2-s b8", "attention": "gpt2-s b8", "cross_entropy": "gpt2-s b8",
              "fused_linear_cross_entropy": "gpt2-s b8", "bias_gelu": "gpt2-s b8"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Benchmark kernels/ (Triton) against torch eager, "
                                            "torch.compile and SDPA backends. Needs a CUDA GPU.")
    p.add_argument("--quick", action="store_true",
                   help="one shape per op (GPT-2 small) and fewer repetitions")
    p.add_argument("--ops", default=",".join(OPS), help=f"comma-separated subset of {','.join(OPS)}")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    p.add_argument("--out-dir", type=Path, default=REPO / "bench" / "results")
    args = p.parse_args(argv)
    args.ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = sorted(set(args.ops) - set(OPS))
    if unknown:
        p.error(f"unknown ops {unknown}; choose from {OPS}")
    return args


# --- pure helpers (no GPU needed; tested) -----------------------------------

def gpu_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def result_paths(out_dir: Path, gpu_name: str, date: str):
    stem = f"kernels-{gpu_slug(gpu_name)}-{date}"
    return out_dir / f"{stem}.json", out_dir / f"{stem}.md"


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "uncommitted"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "uncommitted"


def speedups(row: dict) -> dict:
    """baseline time / triton time for each baseline (>1: Triton is faster)."""
    t = row["ms"].get("triton")
    return {k: round(v / t, 3) for k, v in row["ms"].items()
            if k != "triton" and v is not None and t}


def render_markdown(meta: dict, rows: list) -> str:
    variants = []
    for r in rows:
        variants += [v for v in r["ms"] if v not in variants]
    lines = [f"# Kernel benchmarks: {meta['gpu']}", ""]
    lines += [f"- {k}: `{meta[k]}`" for k in ("date", "torch", "triton", "cuda", "commit",
                                               "dtype", "command")]
    lines += ["", "Times are medians in ms (triton.testing.do_bench); `x` columns are "
              "baseline / triton (> 1 means the Triton kernel is faster); memory is the "
              "peak-allocation delta of one step in MiB.", ""]
    head = ["op", "case", "mode"] + [f"{v} ms" for v in variants]
    head += [f"x {v}" for v in variants if v != "triton"] + ["triton MiB", "eager MiB", "max err"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        sp = speedups(r)
        cells = [r["op"], r["case"], r["mode"]]
        cells += [_fmt(r["ms"].get(v)) for v in variants]
        cells += [_fmt(sp.get(v)) for v in variants if v != "triton"]
        cells += [_fmt(r["peak_mib"].get("triton")), _fmt(r["peak_mib"].get("eager")),
                  _fmt(r.get("max_abs_err"), ".2e")]
        lines.append("| " + " | ".join(cells) + " |")
    wins = [f"{r['op']} / {r['case']}" for r in rows
            if r["mode"] == "fwd+bwd" and speedups(r) and min(speedups(r).values()) > 1.0]
    lines += ["", "Triton beats every baseline (fwd+bwd) at: " + (", ".join(wins) or "none"), ""]
    return "\n".join(lines)


def _fmt(v, spec=".3f"):
    return "-" if v is None else format(v, spec)


# --- GPU part ----------------------------------------------------------------

def _make_case(op: str, p: dict, dtype, device):
    """Returns (inputs, {variant: fn}) with fresh random inputs."""
    import torch
    import torch.nn.functional as F

    import kernels

    def rnd(*shape, scale=1.0, grad=True):
        return (torch.randn(*shape, device=device, dtype=dtype) * scale).requires_grad_(grad)

    if op == "layer_norm":
        inputs = (rnd(p["rows"], p["dim"]), rnd(p["dim"]), rnd(p["dim"]))
        fns = {impl: (lambda x, w, b, impl=impl: kernels.layer_norm(x, w, b, impl=impl))
               for impl in ("triton", "torch")}
    elif op == "attention":
        shape = (p["batch"], p["heads"], p["seq"], p["head_dim"])
        inputs = (rnd(*shape), rnd(*shape), rnd(*shape))
        fns = {impl: (lambda q, k, v, impl=impl: kernels.attention(q, k, v, p["causal"], impl=impl))
               for impl in ("triton", "torch")}
    elif op == "cross_entropy":
        target = torch.randint(0, p["vocab"], (p["rows"],), device=device)
        inputs = (rnd(p["rows"], p["vocab"]),)
        fns = {impl: (lambda x, impl=impl: kernels.cross_entropy(x, target, 0.1, impl=impl))
               for impl in ("triton", "torch")}
    elif op == "fused_linear_cross_entropy":
        target = torch.randint(0, p["vocab"], (p["rows"],), device=device)
        inputs = (rnd(p["rows"], p["hidden"]), rnd(p["vocab"], p["hidden"], scale=p["hidden"] ** -0.5))
        fns = {impl: (lambda h, w, impl=impl: kernels.fused_linear_cross_entropy(h, w, target, impl=impl))
               for impl in ("triton", "torch")}
    elif op == "bias_gelu":
        inputs = (rnd(p["rows"], p["dim"]), rnd(p["dim"]))
        fns = {impl: (lambda x, b, impl=impl: kernels.bias_gelu(x, b, impl=impl))
               for impl in ("triton", "torch")}
    else:
        raise ValueError(op)
    fns["eager"] = fns.pop("torch")
    if op == "attention":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        for name, backend in (("sdpa-flash", SDPBackend.FLASH_ATTENTION),
                              ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION),
                              ("sdpa-efficient", SDPBackend.EFFICIENT_ATTENTION)):
            def run(q, k, v, backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=p["causal"])
            fns[name] = run
    return inputs, fns


def _measure(fn, inputs, mode: str, quick: bool):
    import torch
    import triton

    leaves = [t for t in inputs if t.requires_grad]
    out = fn(*inputs)
    grad = torch.randn_like(out)

    def step():
        y = fn(*inputs)
        if mode == "fwd+bwd":
            y.backward(grad)
        return y

    step()  # compile / autotune outside the timed and measured region
    for t in leaves:
        t.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    for t in leaves:
        t.grad = None
    ms = triton.testing.do_bench(step, warmup=5 if quick else 25, rep=20 if quick else 100,
                                 grad_to_none=leaves, return_mode="median")
    return ms, peak, out


def run_benchmarks(args) -> list:
    import torch

    dtype = getattr(torch, DTYPES[args.dtype])
    device = torch.device("cuda")
    rows = []
    for op in args.ops:
        for case, params in CASES[op]:
            if args.quick and case != QUICK_CASE[op]:
                continue
            for mode in ("fwd", "fwd+bwd"):
                torch.manual_seed(0)
                inputs, fns = _make_case(op, params, dtype, device)
                if not args.no_compile:
                    fns["compile"] = torch.compile(fns["eager"])
                row = {"op": op, "case": case, "mode": mode, "params": params, "ms": {},
                       "peak_mib": {}, "errors": {}}
                outs = {}
                for name, fn in fns.items():
                    try:
                        ms, peak, outs[name] = _measure(fn, inputs, mode, args.quick)
                        row["ms"][name], row["peak_mib"][name] = round(ms, 4), round(peak, 1)
                    except Exception as exc:  # e.g. an SDPA backend that rejects the shape
                        row["ms"][name] = None
                        row["errors"][name] = f"{type(exc).__name__}: {str(exc)[:200]}"
                if "triton" in outs and "eager" in outs:
                    row["max_abs_err"] = (outs["triton"].float() - outs["eager"].float()).abs().max().item()
                rows.append(row)
                sp = speedups(row)
                print(f"{op:<27} {case:<11} {mode:<8} "
                      + " ".join(f"{k}={v:.3f}ms" for k, v in row["ms"].items() if v is not None)
                      + "  speedup " + " ".join(f"{k}:{v:.2f}x" for k, v in sp.items()), flush=True)
                del inputs, fns, outs
                torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print(NO_GPU_MESSAGE)
        return 0
    import triton

    now = dt.datetime.now(dt.timezone.utc)
    gpu = torch.cuda.get_device_name()
    meta = {"gpu": gpu, "date": now.isoformat(timespec="seconds"), "torch": torch.__version__,
            "triton": triton.__version__, "cuda": torch.version.cuda, "commit": git_commit(),
            "dtype": args.dtype, "command": shlex.join(["python"] + sys.argv)}
    rows = run_benchmarks(args)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = result_paths(args.out_dir, gpu, now.strftime("%Y-%m-%d"))
    json_path.write_text(json.dumps({"meta": meta, "results": rows}, indent=2) + "\n")
    markdown = render_markdown(meta, rows)
    md_path.write_text(markdown)
    print(markdown)
    print(f"wrote {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
