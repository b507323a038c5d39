"""Scheduling policies replayed on Microsoft's Philly job log, one VC at a time (issue 34).

    python bench/philly.py pcs PCS_CHECKOUT /tmp/philly-vcs   # or: log cluster_job_log /tmp/philly-vcs
    python bench/scheduler_philly.py /tmp/philly-vcs [--vcs 2869ce,e13805] [--out DIR] [--order las-share]
    python bench/scheduler_philly.py /tmp/philly-vcs --sweep [--orders default] [--jobs 2] [--reuse FILE]
        [--no-replay]

Every VC with at least 500 jobs (`philly.MIN_JOBS`), on its cluster (`philly.cluster_nodes`:
the fewest 8-GPU nodes that hold its largest job at an offered load of at most 0.8), under
`fifo`, `sjf-oracle` (exact durations: the bound for ordering alone) and `las` (no durations,
the default LAS settings of `core.queues.LasSettings`; `--order las-share`: the tuned LAS of
`orchestrator/policy/las.py` instead). Writes `<out>/scheduler_philly.json` and `.md` (with
another order: `scheduler_philly-<order>.*`) with provenance and issue 34's targets per VC;
a VC's table is written as soon as it is done, so a long run can be cut short and still
leave what it has.

`--sweep` (issue 51): every VC of 1,000+ jobs at offered loads 0.5-0.9, with issue 51's
targets and the tuning/held-out split (`scheduler_philly_sweep.py`); writes
`<out>/scheduler_philly_sweep.json` and `.md` (`--stem` names them otherwise).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from philly import cluster_nodes, load_vcs, offered_load  # noqa: E402  (bench/ is on sys.path)
from provenance import git_commit  # noqa: E402
from scheduler_philly_sweep import LOADS, load_reuse, points, render_sweep, run_sweep  # noqa: E402
from trace_sim import SimConfig, replay  # noqa: E402

ORDERS = ("las", "las-share")  # the orders measured against fifo and sjf-oracle (no durations)


def targets(table: dict, order: str = "las") -> dict:
    """Issue 34's targets for the LAS `order` (no durations) on one VC (keys name it `las`)."""
    las, fifo, sjf = table[order], table["fifo"], table["sjf-oracle"]
    out = {
        "avg_jct_fifo_over_las": fifo["avg_jct_s"] / las["avg_jct_s"],  # >= 2
        "avg_jct_las_over_sjf": las["avg_jct_s"] / sjf["avg_jct_s"],  # <= 1.3
        "p99_jct_las_over_fifo": las["p99_jct_s"] / fifo["p99_jct_s"],  # <= 1.5
        "preemptions_per_job": las["preemptions_per_job"],  # <= 2
    }
    limits = (2.0, 1.3, 1.5, 2.0)
    met = [
        out["avg_jct_fifo_over_las"] >= limits[0],
        out["avg_jct_las_over_sjf"] <= limits[1],
        out["p99_jct_las_over_fifo"] <= limits[2],
        out["preemptions_per_job"] <= limits[3],
    ]
    out["met"] = all(met)
    return out


def render(record: dict) -> str:
    order = record.get("order", "las")
    policies = ("fifo", "sjf-oracle", order)
    lines = [
        "# Scheduling policies on the Philly job log, per VC (issue 34)",
        "",
        f"- {record['date']}; commit `{record['commit']}`; command: `{record['command']}`",
        f"- traces: {record['traces']}; Python {record['machine']['python']},"
        f" {record['machine']['cpus']} CPU(s)",
        f"- JCT in hours; `sjf-oracle` gets exact durations, `fifo` and `{order}` none;"
        " preemption costs 60 s",
        f"- targets ({order}): avg JCT >= 2x better than fifo, <= 1.3x sjf-oracle's; p99 <= 1.5x fifo's;"
        " <= 2 preemptions per job",
        "",
        f"| VC | jobs | nodes x 8 | load | fifo avg / p99 | sjf-oracle avg / p99 | {order} avg / p99"
        f" | fifo/{order} | {order}/sjf | {order} p99/fifo p99 | preempt./job | met |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for vc, row in record["vcs"].items():
        t, r = row["targets"], row["tables"]
        cells = " | ".join(
            f"{r[p]['avg_jct_s'] / 3600:.1f} / {r[p]['p99_jct_s'] / 3600:.0f}" for p in policies
        )
        lines.append(
            f"| {vc} | {row['jobs']} | {row['nodes']} | {row['load']:.2f} | {cells}"
            f" | {t['avg_jct_fifo_over_las']:.2f} | {t['avg_jct_las_over_sjf']:.2f}"
            f" | {t['p99_jct_las_over_fifo']:.2f} | {t['preemptions_per_job']:.2f}"
            f" | {'yes' if t['met'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", help="the folder `bench/philly.py` wrote")
    parser.add_argument("--vcs", default="", help="comma-separated VCs (default: every VC of 500+ jobs)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    parser.add_argument("--order", default="las", choices=ORDERS, help="the LAS order to measure")
    parser.add_argument("--sweep", action="store_true", help="issue 51's sweep of load (module docstring)")
    parser.add_argument("--orders", default="default", help="--sweep: comma-separated orders to measure")
    parser.add_argument("--loads", default=",".join(map(str, LOADS)), help="--sweep: offered loads")
    parser.add_argument("--jobs", type=int, default=1, help="--sweep: points replayed at once")
    parser.add_argument("--reuse", default=None, help="--sweep: an earlier sweep's JSON to take results from")
    parser.add_argument("--no-replay", action="store_true", help="--sweep: only what --reuse holds")
    parser.add_argument("--stem", default="scheduler_philly_sweep", help="--sweep: the result files' name")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = _record(args, argv)
    if args.sweep:
        return _sweep(args, record, out)
    policies = ("fifo", "sjf-oracle", args.order)
    stem = "scheduler_philly" if args.order == "las" else f"scheduler_philly-{args.order}"
    vcs = load_vcs(args.traces)
    if args.vcs:
        vcs = {vc: vcs[vc] for vc in args.vcs.split(",")}
    record |= {"what": "scheduling policies replayed on the Philly job log, per VC (issue 34)",
               "order": args.order, "vcs": {}}  # fmt: skip
    for vc, jobs in sorted(vcs.items(), key=lambda item: len(item[1])):  # the quick ones first
        nodes = cluster_nodes(jobs)
        print(f"== VC {vc}: {len(jobs)} jobs on {nodes} nodes x 8 GPUs", flush=True)
        started = time.perf_counter()
        tables = replay(jobs, SimConfig(nodes, 8), policies, log=lambda line: print(line, flush=True))
        record["vcs"][vc] = {
            "jobs": len(jobs),
            "nodes": nodes,
            "load": offered_load(jobs, nodes),
            "tables": tables,
            "targets": targets(tables, args.order),
            "wall_s": time.perf_counter() - started,
        }
        (out / f"{stem}.json").write_text(json.dumps(record, indent=2) + "\n")
        (out / f"{stem}.md").write_text(render(record))
    print(render(record))
    return 0


def _record(args: argparse.Namespace, argv: list[str] | None) -> dict:
    """What every result file says of where it came from."""
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "command": " ".join(
            ["python", "bench/scheduler_philly.py", *(sys.argv[1:] if argv is None else argv)]
        ),
        "traces": _provenance(Path(args.traces)),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
    }


def _sweep(args: argparse.Namespace, record: dict, out: Path) -> int:
    orders = tuple(args.orders.split(","))
    loads = tuple(float(load) for load in args.loads.split(","))
    todo = points(args.traces, args.vcs.split(",") if args.vcs else None, loads)
    record |= {"what": "scheduling orders over a sweep of load on the Philly job log (issue 51)",
               "orders": list(orders), "reused_from": args.reuse, "points": {}}  # fmt: skip

    def save() -> None:
        (out / f"{args.stem}.json").write_text(json.dumps(record, indent=2) + "\n")
        (out / f"{args.stem}.md").write_text(render_sweep(record))

    started = time.perf_counter()
    run_sweep(record, args.traces, todo, orders, load_reuse(args.reuse), args.jobs, save, not args.no_replay)
    record["wall_s"] = time.perf_counter() - started
    save()
    print(render_sweep(record))
    return 0


def _provenance(folder: Path) -> str:
    """Where the converted traces came from: the first comment line of one, less its VC."""
    path = sorted(folder.glob("philly-vc-*.csv"))[0]
    vc = path.stem.removeprefix("philly-vc-")
    source = path.read_text().splitlines()[0].split("; ", 1)[-1]
    return f"{folder}/philly-vc-{{vc}}.csv, {source.replace(vc, '{vc}')}"


if __name__ == "__main__":
    sys.exit(main())
