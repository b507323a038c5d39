"""The report of bench/gpu_train.py: the run's provenance and its markdown table."""

from __future__ import annotations

import datetime as dt
import os
import shlex
import sys

from bench.provenance import git_commit


def provenance(device, dry_run: bool) -> dict:
    import torch
    import triton

    from workers import throughput

    return {
        "device": throughput.device_name(device),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "commit": git_commit(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable, *sys.argv]),
        "dry_run": dry_run,
        "compile_backend": os.environ.get("ORCHESTRATOR_COMPILE_BACKEND", "inductor"),
    }


def markdown(report: dict) -> str:
    p = report["provenance"]
    lines = [
        f"# Training throughput on {p['device']}" + (" (dry run on tiny shapes)" if p["dry_run"] else ""),
        "",
        f"- torch {p['torch']}, triton {p['triton']}, CUDA {p['cuda']}, commit `{p['commit']}`",
        f"- {p['date']}; command: `{p['command']}`",
        "- step time: median GPU period between consecutive steps of `Trainer.step` (no host "
        "sync in between); compile time apart; FLOPs: FlopCounterMode (2 per MAC, forward + "
        "backward); MFU against the dense bf16 peak, none for fp8",
        "- target: ViT-B/16 4,000 images/s, GPT-2 small 500k tokens/s (one H100); `x target` is "
        "the measured rate over it; `x eager` is over the eager mode of the same loop, this run",
        "",
        "| model | mode | loop | batch | step ms | samples/s | tokens/s | TFLOP/s | MFU | x target "
        "| x eager | compile s | memory GiB |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    eager = {
        (r["model"], r.get("loop")): r
        for r in report["results"]
        if r.get("mode") == "eager" and "error" not in r
    }
    for r in report["results"]:
        if "error" in r:
            lines.append(
                f"| {r['model']} | {r['mode']} | {r.get('loop', '')} | | {r['error']} | | | | | | | | |"
            )
            continue
        fmt = lambda v, f: "" if v is None else format(v, f)  # noqa: E731
        base = eager.get((r["model"], "current"))
        vs_eager = r["samples_per_s"] / base["samples_per_s"] if base else None
        target = r["target"]["ratio"] if r.get("target") else None
        preset = r["preset"] + "".join(f", {k}={v}" for k, v in r.get("model_overrides", {}).items())
        lines.append(
            f"| {preset} | {r['mode']} | {r['loop']} | {r['batch']} | "
            f"{r['step_s_median'] * 1e3:.1f} | {r['samples_per_s']:,.0f} | "
            f"{fmt(r['tokens_per_s'], ',.0f')} | {r['tflops']:.3g} | "
            f"{fmt(r['mfu'] and 100 * r['mfu'], '.1f')}{'%' if r['mfu'] else ''} | "
            f"{fmt(target, '.2f')} | {fmt(vs_eager, '.2f')} | "
            f"{fmt(r['compile_s'], '.1f')} | {fmt(r['max_memory_gib'], '.1f')} |"
        )
    if report.get("loader"):
        lines += [
            "",
            "Data loader alone (synthetic source, pinned memory, copy to the GPU):",
            "",
            "| model | loader workers | batch | samples/s |",
            "|---|---:|---:|---:|",
        ]
        lines += [
            f"| {r['model']} | {r['loader_workers']} | {r['batch']} | {r['samples_per_s']:,.0f} |"
            for r in report["loader"]
        ]
    return "\n".join(lines) + "\n"
