"""`orchestrator status|list|logs|stop`: thin wrappers over the Ray Jobs API.

Every command takes `--address` (the dashboard, http://HEAD:8265, or the cluster address);
without it `$RAY_API_SERVER_ADDRESS` / `$RAY_ADDRESS` or a cluster on this machine is used.
Cluster problems print one line and exit 1; an unknown job id exits 2.
"""

from __future__ import annotations

import datetime
import sys
import time

from orchestrator.client import is_attempt_of
from orchestrator.commands.job_logs import handle_logs
from orchestrator.commands.jobs_api import call as _call
from orchestrator.commands.jobs_api import ray_job_ended
from orchestrator.commands.options import add_jobs_api_address, with_cluster_errors
from orchestrator.commands.queue_views import duration_text, ledger_lines, workers_text


def register(sub) -> None:
    status = sub.add_parser("status", help="status of a submitted job (default: the newest)")
    status.add_argument("job_id", nargs="?", metavar="ID")
    add_jobs_api_address(status)
    status.set_defaults(handler=handle_status)

    listing = sub.add_parser("list", help="list the jobs submitted to a Ray cluster")
    add_jobs_api_address(listing)
    listing.set_defaults(handler=handle_list)

    logs = sub.add_parser("logs", help="print a job's logs")
    logs.add_argument("job_id", metavar="ID")
    logs.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="keep streaming until the job ends, then exit with its status",
    )
    add_jobs_api_address(logs)
    logs.set_defaults(handler=handle_logs)

    stop = sub.add_parser("stop", help="stop a job: it checkpoints first (queued jobs just leave the queue)")
    stop.add_argument("job_id", metavar="ID")
    stop.add_argument("--now", action="store_true", help="kill it at once, without a checkpoint")
    add_jobs_api_address(stop)
    stop.set_defaults(handler=handle_stop)


def _time(ms) -> str:
    if not ms:
        return "-"
    return datetime.datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S")


def _duration(job) -> str:
    if not job.start_time:
        return "-"
    end = job.end_time or datetime.datetime.now().timestamp() * 1000
    seconds = int((end - job.start_time) / 1000)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _id(job) -> str:
    return job.submission_id or job.job_id or "-"


def _job_name(job) -> str:
    """The spec's job name for submitted jobs; the command for drivers started by hand."""
    name = (job.metadata or {}).get("orchestrator_job")
    if name:
        return name
    words = (job.entrypoint or "").split()
    for i, word in enumerate(words):  # `.../python .../orchestrator run SPEC ...` -> `run SPEC`
        if word.endswith("orchestrator") and i + 2 < len(words):
            return f"{words[i + 1]} {words[i + 2]}"
    return " ".join(words)


def print_queued_job(job: dict) -> None:
    import datetime

    def when(t):
        return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S") if t else "-"

    step = f"{job['step']}/{job['total_steps']}" if job.get("total_steps") else str(job.get("step"))
    from orchestrator.ray.cluster import read_state

    print(f"{job['id']}: {job['state']}")
    page = (read_state() or {}).get("status_page")
    if page:
        print(f"  page:       {page.rstrip('/')}/#/jobs/{job['id']}")
    print(
        f"  job:        {job['name']} (run {job['run']}), priority {job['priority']}, queue {job['queue']}"
        + (", preemptible" if job["preemptible"] else "")
    )
    print(
        f"  workers:    {workers_text(job)} x "
        + ", ".join(f"{v:g} {k}" for k, v in job["per_worker"].items())
    )
    print(
        f"  step:       {step}   attempts: {job['attempt']}   preemptions: {job['preemptions']}"
        f"   steps lost: {job['steps_lost']}"
        + (f"   resizes: {job['resizes']}" if job.get("resizes") else "")
    )
    if job.get("last_checkpoint"):
        print(f"  checkpoint: {job['last_checkpoint']}")
    runs = job.get("submission")
    if runs and is_attempt_of(runs, job["id"]):  # the attempt's controller, an actor on its node
        print(f"  controller: {runs} (attempt {job['attempt']}; `orchestrator logs {job['id']}`)")
    if job.get("came_in_by"):  # the `ray job submit` that queued it, and followed it
        print(f"  Ray Job:    {job['came_in_by']} (it came in by)")
    waited, eta = duration_text(job.get("waited_s")), duration_text(job.get("remaining_s"))
    print(f"  waited:     {waited} in the queue   ETA: {eta}")
    if job.get("ledger"):
        bar, spent = ledger_lines(job["ledger"])
        print(f"  time:       {bar}\n              {spent}")
    for line in replica_group_lines(job, time.time()):
        print(line)
    if job.get("note") or job.get("reason"):
        print(f"  note:       {job.get('note') or job.get('reason')}")
    if job.get("mlflow"):  # its MLflow run lacks records while the server does not answer
        print(f"  tracking:   {job['mlflow']}")
    if job.get("avoid_nodes"):  # stragglers' nodes it was restarted away from
        print(f"  avoiding:   node(s) {', '.join(job['avoid_nodes'])} (stragglers ran there)")
    for s in job.get("stragglers") or []:
        ip = f", {s['ip']}" if s.get("ip") else ""
        print(
            f"  WARNING:    straggler: rank {s['rank']} computes {s['ratio']:.2f}x the median rank's"
            f" (node {s['node']}{ip})"
        )
    print("  history:")
    for event in job.get("history", []):
        ranks = event.get("ranks") if event["event"] == "hung" else None
        hidden = ("time", "event", "ranks") if ranks else ("time", "event")
        shown = {k: v for k, v in event.items() if k not in hidden}
        detail = ", ".join(f"{k} {v}" for k, v in shown.items())
        print(f"    {when(event['time'])}  {event['event']}" + (f" ({detail})" if detail else ""))
        for rank, frame in sorted((ranks or {}).items(), key=lambda item: int(item[0])):
            print(f"        rank {rank} was in {frame or 'no frame of the training code'}")


def replica_group_lines(job: dict, now: float) -> list[str]:
    """A job of replica groups: how many train, and each group's start and heal, or its loss
    (the service's word: a group without nodes was lost, whatever its attempt last said)."""
    groups, placed = job.get("replica_groups") or {}, job.get("group_placements") or []
    if not placed:
        return []
    states = [groups.get(str(i), {}).get("state") if nodes else "lost" for i, nodes in enumerate(placed)]
    degraded = (job.get("ledger") or {}).get("degraded_s") or 0.0
    head = f"  groups:     {states.count('training')} of {len(placed)} training"
    lines = [head + (f", degraded {duration_text(degraded)}" if degraded else "")]
    for index, nodes in enumerate(placed):
        g = groups.get(str(index), {})
        if not nodes:
            lost_at = g.get("lost_at")
            ago = f" {duration_text(now - lost_at)} ago" if lost_at else ""
            lines.append(f"    group {index}: lost{ago}, waiting for nodes")
            continue
        where = ", ".join(n[:8] for n in sorted(nodes))
        text = f"    group {index}: {states[index] or 'starting'} on {where}"
        if g.get("joined_at") and g.get("started_at"):
            text += f", started in {g['joined_at'] - g['started_at']:.1f} s"
        if g.get("healed_at") and g.get("started_at"):
            text += f", healed from a peer at step {g['healed_step']}"
            text += f" ({g['healed_at'] - g['started_at']:.1f} s after its start)"
        lines.append(text)
    return lines


@with_cluster_errors
def handle_status(args) -> int:
    from orchestrator import client as service_client

    if args.job_id is not None:
        job = service_client.queued_job(args.address, "status", args.job_id)
        if job is not None:
            print_queued_job(job)
            return 0
    if args.job_id is None:
        _, jobs = _call(args, "list_jobs")
        if not jobs:
            print("no jobs on this cluster")
            return 0
        args.job_id = max(jobs, key=lambda j: j.start_time or 0).submission_id
    _, job = _call(args, "get_job_info", args.job_id)
    status = str(getattr(job.status, "value", job.status))
    print(f"{job.submission_id}: {status}")
    print(f"  job:        {_job_name(job)}")
    print(f"  entrypoint: {job.entrypoint}")
    print(
        f"  started:    {_time(job.start_time)}   ended: {_time(job.end_time)}   duration: {_duration(job)}"
    )
    if job.message:
        print(f"  message:    {job.message.strip().splitlines()[-1]}")
    return 0


@with_cluster_errors
def handle_list(args) -> int:
    from rich.console import Console
    from rich.table import Table

    _, jobs = _call(args, "list_jobs")
    if not jobs:
        print("no jobs on this cluster")
        return 0
    table = Table(box=None, header_style="bold")
    table.add_column("ID", no_wrap=True, min_width=max(len(_id(j)) for j in jobs))
    table.add_column("STATUS", no_wrap=True, min_width=9)
    table.add_column("JOB", no_wrap=True, overflow="ellipsis", max_width=40)
    table.add_column("STARTED", no_wrap=True, min_width=19)
    table.add_column("DURATION", no_wrap=True)
    table.add_column("MESSAGE", no_wrap=True, overflow="ellipsis", max_width=60)
    colors = {"SUCCEEDED": "green", "FAILED": "red", "RUNNING": "cyan", "STOPPED": "yellow"}
    for job in sorted(jobs, key=lambda j: j.start_time or 0):
        status = str(getattr(job.status, "value", job.status))
        message = (job.message or "").strip().splitlines()
        table.add_row(
            _id(job),
            f"[{colors.get(status, 'white')}]{status}[/]",
            _job_name(job),
            _time(job.start_time),
            _duration(job),
            message[-1] if message else "",
        )
    console = Console(width=None if sys.stdout.isatty() else 200)
    console.print(table)
    return 0


@with_cluster_errors
def handle_stop(args) -> int:
    import time

    from orchestrator import client as service_client

    stop_route = ("POST", service_client.job_path(args.job_id, "stop"), {"now": args.now})
    job = service_client.queued_job(
        args.address, "stop", args.job_id, args.now, service_client.caller_token(), http=stop_route
    )
    if job is not None:
        if job["state"] == "stopping":
            print(f"{job['id']}: stop requested; it checkpoints within a few seconds, then stops")
        else:
            print(f"{job['id']}: {job['state']}" + (f" ({job['reason']})" if job.get("reason") else ""))
        return 0
    # a Ray Job the service does not know: Ray's own stop (SIGTERM, then SIGKILL)
    client, stopped = _call(args, "stop_job", args.job_id)
    if not stopped:
        job = client.get_job_info(args.job_id)
        print(f"{args.job_id} has already ended: {getattr(job.status, 'value', job.status)}")
        return 0
    for _ in range(100):  # Ray sends SIGTERM, then SIGKILL after a grace period
        status = str(getattr(client.get_job_status(args.job_id), "value", ""))
        if ray_job_ended(status):
            print(f"{args.job_id}: {status}")
            return 0
        time.sleep(0.2)
    print(f"{args.job_id}: stop requested")
    return 0
