"""The report of bench/kernels.py: result file names, speedups, the issue's targets and the
markdown table of a run. Pure helpers, no GPU needed (tests/test_kernels.py tests them through
bench/kernels.py, which imports them)."""

import re
from pathlib import Path


def gpu_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def result_paths(out_dir: Path, gpu_name: str, date: str):
    stem = f"kernels-{gpu_slug(gpu_name)}-{date}"
    return out_dir / f"{stem}.json", out_dir / f"{stem}.md"


def speedups(row: dict, timing: str = "ms") -> dict:
    """baseline time / triton time for each baseline (>1: Triton is faster)."""
    times = row.get(timing) or {}
    t = times.get("triton")
    return {
        k: round(v / t, 3) for k, v in times.items() if not k.startswith("triton") and v is not None and t
    }


def render_markdown(meta: dict, rows: list) -> str:
    variants = []
    for r in rows:
        variants += [v for v in r["ms"] if v not in variants]
    lines = [f"# Kernel benchmarks: {meta['gpu']}", ""]
    lines += [
        f"- {k}: `{meta[k]}`" for k in ("date", "torch", "triton", "cuda", "commit", "dtype", "command")
    ]
    lines += [
        "",
        "Times are medians in ms (triton.testing.do_bench); `x` columns are "
        "baseline / triton (> 1 means the Triton kernel is faster); memory is the "
        "peak-allocation delta of one step in MiB.",
        "",
    ]
    head = ["op", "case", "mode"] + [f"{v} ms" for v in variants]
    head += [f"x {v}" for v in variants if not v.startswith("triton")]
    head += [f"{v} MiB" for v in variants if v.startswith("triton") or v == "eager"] + ["max err"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        sp = speedups(r)
        cells = [r["op"], r["case"], r["mode"]]
        cells += [_fmt(r["ms"].get(v)) for v in variants]
        cells += [_fmt(sp.get(v)) for v in variants if not v.startswith("triton")]
        cells += [_fmt(r["peak_mib"].get(v)) for v in variants if v.startswith("triton") or v == "eager"]
        cells += [_fmt(r.get("max_abs_err"), ".2e")]
        lines.append("| " + " | ".join(cells) + " |")
    wins = [
        f"{r['op']} / {r['case']}"
        for r in rows
        if r["mode"] == "fwd+bwd" and speedups(r) and min(speedups(r).values()) > 1.0
    ]
    lines += ["", "Triton beats every baseline (fwd+bwd) at: " + (", ".join(wins) or "none"), ""]
    checks = target_rows(rows)
    if checks:
        lines += [
            "## Targets",
            "",
            "fwd+bwd, Triton against the built-in baselines of the same run; "
            "`host` includes host overhead (do_bench), `GPU` is the kernels' time alone.",
            "",
            "| op | case | measure | target | host | GPU |",
            "|---|---|---|---|---|---|",
        ]
        for op, case, what, target, host, gpu in checks:
            mark = lambda v, target=target: (
                "-" if v is None else f"{v:.2f} {'ok' if v >= target else 'missed'}"
            )
            lines.append(f"| {op} | {case} | {what} | >= {target:g} | {mark(host)} | {mark(gpu)} |")
        lines.append("")
    if any(r.get("kernel_ms") for r in rows):
        lines += [
            "## GPU time alone (the kernels' summed durations, no host overhead)",
            "",
            "The same calls under the profiler: the summed durations of the kernels each "
            "call launches, which is what a GPU-bound training step pays.",
            "",
        ]
        head = ["op", "case", "mode"] + [f"{v} ms" for v in variants]
        head += [f"x {v}" for v in variants if not v.startswith("triton")]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in rows:
            sp = speedups(r, "kernel_ms")
            cells = [r["op"], r["case"], r["mode"]] + [
                _fmt((r.get("kernel_ms") or {}).get(v)) for v in variants
            ]
            cells += [_fmt(sp.get(v)) for v in variants if not v.startswith("triton")]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


# The targets: (op, case, what, figure); checked on fwd+bwd rows.
TARGETS = [
    ("layer_norm", None, "x eager", 1.2),
    ("layer_norm", None, "x compile", 1.0),
    ("cross_entropy", "gpt2-s b8", "x eager", 2.0),
    ("cross_entropy", "gpt2-s b8", "memory / eager", 4.0),
    ("attention", "gpt2-s b8", "x fastest SDPA", 0.9),
    ("attention", "b8 full", "x fastest SDPA", 0.9),
]


def target_rows(rows: list) -> list:
    """[(op, case, what, target, measured with host overhead, measured GPU time)]."""
    out = []
    for op, case, what, target in TARGETS:
        for r in rows:
            if r["op"] != op or r["mode"] != "fwd+bwd" or (case and r["case"] != case):
                continue
            figures = []
            for timing in ("ms", "kernel_ms"):
                times = r.get(timing) or {}
                t = times.get("triton")
                if what == "memory / eager":
                    mem = r["peak_mib"]
                    value = mem.get("eager") / mem["triton"] if mem.get("triton") else None
                elif what == "x fastest SDPA":
                    sdpa = [v for k, v in times.items() if k.startswith("sdpa") and v]
                    value = min(sdpa) / t if sdpa and t else None
                else:
                    base = times.get(what.split()[-1])
                    value = base / t if base and t else None
                figures.append(value)
            out.append((op, r["case"], what, target, *figures))
    return out


def _fmt(v, spec=".3f"):
    return "-" if v is None else format(v, spec)
