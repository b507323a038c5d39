"""`orchestrator goodput [--since 1h]`: where the jobs' time went, and the cluster's goodput.

Each job's time ledger (core/ledger.py) splits its wall time, from submission to its end (or
now), into buckets; goodput is the share of it spent on training steps that were kept. Reads
the service as `queue` does (its HTTP API when `up` recorded it here). A ledger is cumulative
since its job's submission: `--since` picks the jobs alive in the window, it does not cut
their ledgers (Prometheus' `orchestrator_job_time_seconds_total` does that, with `delta()`).
"""

from __future__ import annotations

import re
import sys
import time

from core.ledger import BUCKETS, Goodput
from orchestrator.commands.options import add_address
from orchestrator.commands.queue_views import BAR_MARKS, duration_text, percent, read_queue
from orchestrator.errors import UsageError

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def register(sub) -> None:
    parser = sub.add_parser("goodput", help="where the jobs' time went: queued, training, lost, ...; goodput")
    parser.add_argument(
        "--since", metavar="DURATION", help="only jobs alive in this window, e.g. 30m, 1h, 2d"
    )
    add_address(parser)
    parser.set_defaults(handler=handle)


def parse_duration(text: str) -> float:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", text or "")
    if not match:
        raise UsageError(f"--since {text!r}: expected a duration like 30m, 1h or 2d")
    return float(match[1]) * UNITS[match[2]]


def bar_legend() -> str:
    return "  ".join(f"{mark} {bucket}" for bucket, mark in BAR_MARKS.items())


def combined(jobs: list[dict]) -> Goodput:
    """The cluster's goodput over these jobs' ledgers, each weighted by its accelerators (GPUs,
    or workers for a CPU-only job), as the service's `cluster_goodput` does."""
    total = dict.fromkeys(BUCKETS, 0.0)
    for job in jobs:
        ledger = job["ledger"]
        wall = ledger.get("wall_s") or 0.0
        weight = ledger["gpu_seconds"] / wall if ledger.get("gpu_seconds") and wall else job.get("workers", 1)
        for bucket, value in ledger["buckets"].items():
            total[bucket] += value * weight
    return Goodput.of(total)


def handle(args) -> int:
    from rich.console import Console
    from rich.table import Table

    since = time.time() - parse_duration(args.since) if args.since else None
    jobs, _ = read_queue(args.address, include_finished=True)
    jobs = [
        job
        for job in jobs
        if job.get("ledger") and (since is None or (job.get("finished_at") or time.time()) >= since)
    ]
    if not jobs:
        print("no jobs with a time ledger" + (f" alive in the last {args.since}" if args.since else ""))
        return 0
    table = Table(box=None, header_style="bold")
    for column in ("ID", "STATE", "WALL", *(b.upper() for b in BUCKETS), "GOODPUT", "GPU-H"):
        table.add_column(column, no_wrap=True, justify="left" if column in ("ID", "STATE") else "right")
    for job in jobs:
        ledger = job["ledger"]
        wall = ledger["wall_s"] or 0.0
        shares = [percent(ledger["buckets"][b] / wall) if wall else "-" for b in BUCKETS]
        table.add_row(
            job["id"],
            job["state"],
            duration_text(wall),
            *shares,
            percent(ledger["goodput"]["time"]),
            f"{ledger['gpu_seconds'] / 3600:.2f}",
        )
    Console(width=None if sys.stdout.isatty() else 250).print(table)
    cluster = combined(jobs)
    print(
        f"cluster ({len(jobs)} jobs, weighted by accelerators): goodput {percent(cluster.time)} ="
        f" scheduling {percent(cluster.scheduling)} x runtime {percent(cluster.runtime)}"
    )
    return 0
