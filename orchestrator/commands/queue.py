"""`orchestrator queue | preempt ID | sweep NAME`: the orchestrator service's queue.

They talk to the service on the cluster that `orchestrator up` recorded (or --address, a
cluster address such as HOST:6379). `status ID` and `stop ID` (in jobs.py) use the service
too when it knows the job.
"""

from __future__ import annotations

import shutil
import sys
import time
import urllib.parse

from core.jobs import PENDING_VALUES
from core.queue_orders import DEFAULT_ORDER
from orchestrator.commands import text_table
from orchestrator.commands.options import add_address, with_cluster_errors
from orchestrator.commands.queue_views import duration_text, read_queue, workers_text
from orchestrator.errors import UsageError

WAITING_SHOWN = 50  # waiting jobs `queue` lists: a screen or two, not a queue of thousands


def register(sub) -> None:
    queue = sub.add_parser(
        "queue",
        help="the orchestrator service's queue: running jobs, then waiting jobs in the order of admission",
    )
    queue.add_argument("--all", action="store_true", help="include finished jobs")
    queue.add_argument(
        "--waiting",
        type=int,
        default=WAITING_SHOWN,
        metavar="N",
        help=f"show the first N waiting jobs, the next admitted first (default {WAITING_SHOWN}; 0: all)",
    )
    add_address(queue)
    queue.set_defaults(handler=with_cluster_errors(handle_queue))

    preempt = sub.add_parser("preempt", help="checkpoint a running job and put it back in the queue")
    preempt.add_argument("job_id", metavar="ID")
    add_address(preempt)
    preempt.set_defaults(handler=with_cluster_errors(handle_preempt))

    sweep = sub.add_parser("sweep", help="the trials of a sweep, ranked by its metric")
    sweep.add_argument("name", metavar="NAME", help="the sweep's job name")
    add_address(sweep)
    sweep.set_defaults(handler=with_cluster_errors(handle_sweep))


def _ago(t: float | None) -> str:
    return duration_text(time.time() - t) if t else "-"


def _eta(job: dict) -> str:
    return duration_text(job.get("remaining_s"))


def _resources(job: dict) -> str:
    per = job["per_worker"]
    held = sum(job["placement"].values()) or job["workers"]
    extra = [f"{v * held:g} {k}" for k, v in per.items() if k != "CPU"]
    return (
        f"{workers_text(job)} x "
        + ", ".join(f"{v:g} {k}" for k, v in per.items())
        + (f" ({', '.join(extra)})" if extra else "")
    )


QUEUE_COLUMNS = ("ID", "NAME", "PRIORITY", "STATE", "WORKERS", "WAITED", "STEP", "ETA", "NOTE")
STATE_COLORS = {
    "running": "cyan",
    "admitted": "cyan",
    "stopping": "yellow",
    "preempted": "yellow",
    "succeeded": "green",
    "failed": "red",
    "stopped": "yellow",
}


def handle_queue(args) -> int:
    jobs, info = read_queue(args.address, args.all, args.waiting or None)
    print(cluster_line(info))
    for line in queue_lines(info.get("queues")):
        print(line)
    if not jobs:
        print("the queue is empty" + ("" if args.all else " (--all lists finished jobs)"))
        return 0
    tty = sys.stdout.isatty()
    width = shutil.get_terminal_size().columns if tty else 200
    print(text_table.render(QUEUE_COLUMNS, [queue_row(job) for job in jobs], width, tty))
    hidden = waiting_count(info) - sum(1 for job in jobs if job["state"] in PENDING_VALUES)
    if args.waiting and hidden > 0:
        print(f"... and {hidden} more waiting (--waiting 0 lists every one)")
    return 0


def queue_row(job: dict) -> list[text_table.Cell]:
    step = f"{job['step']}/{job['total_steps']}" if job.get("total_steps") else str(job.get("step") or 0)
    state = job["state"]
    return [
        job["id"],
        job["name"],
        str(job["priority"]),
        (state, STATE_COLORS.get(state, "white")),
        _resources(job),
        duration_text(job.get("waited_s")),
        step,
        _eta(job),
        job.get("note") or job.get("reason") or "",
    ]


def waiting_count(info: dict) -> int:
    """The jobs waiting in the queue, from the service's counts by state."""
    return sum(info.get("jobs", {}).get(state, 0) for state in PENDING_VALUES)


def cluster_line(info: dict) -> str:
    """The cluster in one line: its nodes, those draining, and the newest node events."""
    total = info["resources"]["total"]
    shown = ", ".join(
        f"{total[k]:g} {k}" for k in sorted(total) if k not in ("memory", "object_store_memory")
    )
    line = f"cluster: {info['nodes']} node(s), {shown}"
    scaler = info.get("autoscaler")
    if scaler:
        room = ", ".join(f"{n} {name}" for name, n in scaler["may_add"].items() if n) or "none"
        line += f"; autoscaler may add: {room}"
    if info.get("draining"):
        line += f"; draining: {', '.join(n[:8] for n in info['draining'])}"
    if info.get("unreachable"):  # no job is placed there
        line += f"; not answering: {', '.join(n[:8] for n in info['unreachable'])}"
    recent = [e for e in info.get("node_events", []) if time.time() - e["time"] < 3600][-3:]
    if recent:
        line += "; " + ", ".join(f"{e['node'][:8]} {e['event']} {_ago(e['time'])} ago" for e in recent)
    return line


def queue_lines(queues: dict | None) -> list[str]:
    """A line per configured queue (`orchestrator queues apply`): its use against its nominal
    quota, what it borrows or lends within its cohort, and its order unless it is the default."""
    if not queues:
        return []
    lines = []
    for name, q in sorted(queues["use"].items()):
        where = f"cohort {q['cohort']}" if q["cohort"] else "cap" if q["nominal"] else ""
        kind = ", ".join(filter(None, [where, q["order"] if q["order"] != DEFAULT_ORDER else ""]))
        use = ", ".join(f"{q['used'][r]:g}/{n:g} {r}" for r, n in q["nominal"].items()) or "no quota"
        extra = [f"borrows {v:g} {r}" for r, v in q["borrowed"].items() if v > 0]
        extra += [f"lends {v:g} {r}" for r, v in q["lent"].items() if v > 0]
        head = f"queue {name} ({kind})" if kind else f"queue {name}"
        lines.append(f"{head}: {use}" + (f"; {', '.join(extra)}" if extra else ""))
    return lines


def handle_preempt(args) -> int:
    from orchestrator import client

    route = ("POST", client.job_path(args.job_id, "preempt"))
    job = client.through_service(args.address, route, "preempt", args.job_id, client.caller_token())
    print(
        f"{job['id']}: preemption requested; it checkpoints within a few seconds and goes back to the queue"
    )
    return 0


def handle_sweep(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from core.spec import sweep as sweeps
    from orchestrator import client

    route = ("GET", f"sweeps/{urllib.parse.quote(args.name, safe='')}")
    trials = client.through_service(args.address, route, "sweep", args.name, client.caller_token())
    if not trials:
        raise UsageError(f"no sweep named '{args.name}' in the queue")
    metric, mode = trials[0].get("sweep_metric") or "eval_loss", trials[0].get("sweep_mode") or "min"
    rows = []
    for t in trials:
        summary = t.get("summary") or {}
        rows.append(
            {
                "name": t["id"],
                **(summary.get("eval") or {}),
                **summary,
                "state": t["state"],
                "params": t.get("sweep_params") or {},
            }
        )
    ranked = sweeps.rank(rows, metric, mode)
    table = Table(box=None, header_style="bold", title=f"sweep {args.name}: by {metric} ({mode})")
    for column in ("RANK", "TRIAL", "STATE", metric.upper(), "PARAMETERS"):
        table.add_column(column, no_wrap=column != "PARAMETERS")
    for i, row in enumerate(ranked, 1):
        value = row.get(metric)
        table.add_row(
            str(i),
            row["name"],
            row["state"],
            "-" if value is None else f"{value:.4f}",
            ", ".join(f"{k}={v}" for k, v in row["params"].items()),
        )
    Console(width=None if sys.stdout.isatty() else 200).print(table)
    return 0
