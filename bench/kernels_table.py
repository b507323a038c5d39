"""The dispatch table that `impl="auto"` reads (kernels/dispatch_table.json), written from
bench/kernels.py results files (`python bench/kernels.py --write-table RESULTS.json ...`)."""

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


WIN_MARGIN = 0.95  # Triton must take at most 95% of the best built-in time, both ways timed


def _dims(op: str, params: dict) -> dict:
    if op in ("layer_norm", "bias_gelu"):
        return {"dim": params["dim"]}
    if op == "attention":
        return {"head_dim": params["head_dim"], "seq": params["seq"], "causal": params["causal"]}
    if op == "cross_entropy":
        return {"vocab": params["vocab"]}
    return {"vocab": params["vocab"], "hidden": params["hidden"]}


def dispatch_entries(report: dict, source: str) -> list:
    """One entry per (op, case) of a results file: "triton" where its fwd+bwd time, with
    host overhead (do_bench) and without (the kernels' own time), beat every built-in baseline."""
    sys.path.insert(0, str(REPO))
    from kernels import dispatch

    meta, entries = report["meta"], []
    for row in report["results"]:
        if row["mode"] != "fwd+bwd" or row["op"] not in (
            "layer_norm",
            "attention",
            "cross_entropy",
            "fused_linear_cross_entropy",
            "bias_gelu",
        ):
            continue
        baselines = [v for v in row["ms"] if not v.startswith("triton") and v != "eager-lowp"]
        won = True
        for timing in ("ms", "kernel_ms"):
            t = row.get(timing, {}).get("triton")
            best = [row.get(timing, {}).get(v) for v in baselines]
            best = [b for b in best if b is not None]
            won = won and t is not None and bool(best) and t <= WIN_MARGIN * min(best)
        dims = _dims(row["op"], row["params"])
        entries.append(
            {
                "gpu": meta["gpu"],
                "op": row["op"],
                "dtype": meta["dtype"],
                "bucket": dispatch.shape_bucket(row["op"], **dims),
                "dims": dims,
                "impl": "triton" if won else "torch",
                "case": row["case"],
                "ms": row["ms"],
                "kernel_ms": row.get("kernel_ms", {}),
                "source": source,
            }
        )
    return entries


def write_table(result_files: list, table_path: Path) -> dict:
    entries, sources = {}, []
    for path in result_files:
        report = json.loads(Path(path).read_text())
        source = (
            str(Path(path).resolve().relative_to(REPO))
            if Path(path).resolve().is_relative_to(REPO)
            else str(path)
        )
        sources.append({"file": source, "commit": report["meta"]["commit"], "date": report["meta"]["date"]})
        for e in dispatch_entries(report, source):
            key = (e["gpu"], e["op"], e["dtype"], e["bucket"])
            earlier = entries.get(key)
            if earlier is not None and earlier["source"] == source and earlier["impl"] == "torch":
                continue  # several cases in one bucket: Triton must win them all
            entries[key] = e  # a later results file replaces an earlier one
    table = {
        "note": "written by bench/kernels.py --write-table; impl='auto' runs Triton only "
        "where an entry says triton (fwd+bwd at most "
        f"{WIN_MARGIN:.0%} of the best built-in time, timed with and without host overhead)",
        "sources": sources,
        "entries": list(entries.values()),
    }
    table_path.write_text(json.dumps(table, indent=1) + "\n")
    return table
