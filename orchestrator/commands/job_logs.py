"""`orchestrator logs ID [--follow]`: a job's logs, every attempt's, oldest first.

Each attempt of a queued job ran in its attempt controller, an actor named `<id>-a<attempt>`
whose log Ray keeps on its node (Ray's state API reads it); a job that came in by `ray job
submit` has that Ray Job's driver log first. Any other id is a Ray Job's own (`orchestrator
submit` to a cluster without a service): its driver's log, from Ray Jobs.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from orchestrator.client import is_attempt_of
from orchestrator.commands.jobs_api import call, ray_job_ended
from orchestrator.commands.options import with_cluster_errors

CONTROLLER = "AttemptController"  # the class of the attempt controllers, in Ray's actor table
POLL_S = 2.0
RAY_MARKERS = (":job_id:", ":actor_name:", ":task_name:")  # Ray's own lines in a worker's log


class LogMissing(Exception):
    """The log cannot be read (yet): its process has not started, or its node is gone."""


@dataclass
class LogSource:
    """One process that ran (a part of) the job, and how to read its log."""

    name: str
    kind: str  # "controller" or "ray job"
    header: str  # what it was: "attempt 2, controller running", "the driver it came in by, ..."
    ended: bool
    succeeded: bool
    order: int  # 0: the Ray Job it came in by (first); n: its attempt n
    read: Callable[[], str]  # its whole log so far


@with_cluster_errors
def handle_logs(args) -> int:
    client, ray_jobs = call(args, "list_jobs")
    known = queued_record(args)
    if any(j.submission_id == args.job_id for j in ray_jobs) or known is None:
        client, text = call(args, "get_job_logs", args.job_id)  # a Ray Job's own id
        if not args.follow:
            sys.stdout.write(text)
            return 0
        return follow_ray_job(client, args.job_id)
    if not args.follow and not sources_of(args, client, known):
        print(never_ran(known), file=sys.stderr)  # queued, and nothing has run it yet
        return 0
    return queued_job_logs(args, client, known)


def queued_record(args) -> dict | None:
    """The service's record of the job, or None (no service, or not a job of its)."""
    from orchestrator import client as service_client

    return service_client.queued_job(args.address, "status", args.job_id)


def never_ran(job: dict) -> str:
    """Why a job the service knows has no logs: nothing ran it yet (and why, if its attempt
    could not be started)."""
    failed = [e for e in job.get("history", []) if e["event"] == "launch-failed"]
    why = f"; its attempt could not be started: {failed[-1].get('error')}" if failed else ""
    return f"{job['id']} is {job['state']}: nothing has run it yet, so it has no logs{why}"


def sources_of(args, client, known: dict) -> list[LogSource]:
    """What ran the job, oldest first: the Ray Job it came in by, then its attempts."""
    sources = []
    came_by = known.get("came_in_by")
    for ray_job in client.list_jobs():
        if came_by and ray_job.submission_id == came_by:
            sources.append(ray_job_source(client, ray_job))
    sources += controller_sources(client.get_address(), known["id"])
    return sorted(sources, key=lambda s: s.order)


def ray_job_source(client, ray_job) -> LogSource:
    sid, status = ray_job.submission_id, str(getattr(ray_job.status, "value", ray_job.status))
    return LogSource(
        name=sid,
        kind="ray job",
        header=f"the driver it came in by, Ray Job {status.lower()}",
        ended=ray_job_ended(status),
        succeeded=status == "SUCCEEDED",
        order=0,
        read=lambda: client.get_job_logs(sid),
    )


def controller_sources(dashboard: str, job_id: str) -> list[LogSource]:
    """The job's attempt controllers, from Ray's actor table (the dead ones too)."""
    from ray.util.state import list_actors

    actors = list_actors(
        address=dashboard, filters=[("class_name", "=", CONTROLLER)], limit=10_000, detail=True
    )
    found = []
    for actor in actors:
        if not actor.name or not is_attempt_of(actor.name, job_id):
            continue

        def read(actor_id=actor.actor_id) -> str:
            return actor_log(dashboard, actor_id)

        ended = actor.state == "DEAD"
        attempt = actor.name.rpartition("-a")[2]
        found.append(
            LogSource(
                name=actor.name,
                kind="controller",
                header=f"attempt {attempt}, controller {'ended' if ended else 'running'}",
                ended=ended,
                succeeded=ended and "INTENDED_USER_EXIT" in str(actor.death_cause or ""),
                order=int(attempt),
                read=read,
            )
        )
    return found


def actor_log(dashboard: str, actor_id: str) -> str:
    """An actor's whole stdout, read by the dashboard from its node: Ray's state API over HTTP,
    with this machine's Ray token (`ray.util.state.get_log` takes only a cluster address)."""
    import urllib.error
    import urllib.parse
    import urllib.request

    from orchestrator.ray.cluster import read_token

    query = urllib.parse.urlencode({"actor_id": actor_id, "lines": -1, "suffix": "out"})
    request = urllib.request.Request(f"{dashboard.rstrip('/')}/api/v0/logs/file?{query}")
    token = read_token()
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            text = reply.read().decode(errors="replace")
    except urllib.error.HTTPError as err:  # no worker yet, or its node is gone
        raise LogMissing(f"Ray's dashboard answered {err.code}") from None
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith(RAY_MARKERS))


def queued_job_logs(args, client, known: dict) -> int:
    """The log of everything that ran the job, oldest first, each under a header; with
    --follow, the newest as it runs, then the next ones, until the job ends."""
    shown: set[str] = set()
    waiting_said, last = False, 1
    while True:
        for source in [s for s in sources_of(args, client, known) if s.name not in shown]:
            print(f"==> {source.name} ({source.header}) <==", flush=True)
            shown.add(source.name)
            if args.follow and not source.ended:
                last = follow_source(source, client)
                waiting_said = False
            else:
                sys.stdout.write(readable(source))
                last = 0 if source.succeeded else 1
        if not args.follow:
            return 0
        job = queued_record(args)
        if job is None:  # no service to ask: the newest outcome is the job's
            return last
        known, state = job, job["state"]
        if state in ("succeeded", "failed", "stopped"):
            reason = f": {job['reason']}" if job.get("reason") else ""
            print(f"job {args.job_id} {state}{reason}", file=sys.stderr)
            return 0 if state == "succeeded" else 1
        if not waiting_said:
            print(f"--- {args.job_id} is {state}; waiting for its next attempt", file=sys.stderr)
            waiting_said = True
        time.sleep(POLL_S)


def readable(source: LogSource) -> str:
    try:
        return source.read()
    except LogMissing as err:
        return f"(its log cannot be read: {err})\n"


def follow_source(source: LogSource, client) -> int:
    """Print `source`'s log as it grows, until it ends; 0 if it succeeded, else 1."""
    if source.kind == "ray job":
        return follow_ray_job(client, source.name, verdict=False)
    from ray.util.state import list_actors

    printed = 0
    while True:
        # asked before the read: the last read comes after the controller ended
        named = list_actors(address=client.get_address(), filters=[("name", "=", source.name)])
        ended = all(a.state == "DEAD" for a in named)
        try:
            text = source.read()
        except LogMissing:  # not started yet: its log comes with its process
            text = readable(source) if ended else ""
        if len(text) > printed:
            sys.stdout.write(text[printed:])
            sys.stdout.flush()
            printed = len(text)
        if ended:
            return 0
        time.sleep(POLL_S)


def follow_ray_job(client, job_id: str, verdict: bool = True) -> int:
    """Stream a Ray Job's logs until it ends; exit 0 if it succeeded, 1 otherwise (and, with
    `verdict`, say so)."""
    import asyncio  # here: asyncio is 0.03 s of every command's start on a quiet machine

    async def stream():
        async for lines in client.tail_job_logs(job_id):
            sys.stdout.write(lines)
            sys.stdout.flush()

    asyncio.run(stream())
    job = client.get_job_info(job_id)
    status = str(getattr(job.status, "value", job.status))
    for _ in range(50):  # the log stream can close a moment before the status flips
        if ray_job_ended(status):
            break
        time.sleep(0.2)
        job = client.get_job_info(job_id)
        status = str(getattr(job.status, "value", job.status))
    if status == "SUCCEEDED":
        if verdict:
            print(f"job {job_id} succeeded", file=sys.stderr)
        return 0
    message = (job.message or "").strip().splitlines()
    if verdict:
        print(
            f"error: job {job_id} {status.lower()}" + (f": {message[-1]}" if message else ""), file=sys.stderr
        )
    return 1
