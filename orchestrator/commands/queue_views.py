"""The service's queue as the commands read it and show it: its jobs and info (from the
service's HTTP API when `orchestrator up` recorded it here, else from the service itself), and
the text of their durations, sizes and time ledgers (core/ledger.py).

`queue`, `queues`, `status` and `goodput` share these; they live here, not in one of those
commands, so that no command module imports another one back.
"""

from __future__ import annotations

from core.jobs import TERMINAL_VALUES
from core.ledger import BUCKETS

# one letter per bucket for the bars: queued, starting, training, evaluating, checkpointing,
# stopping, lost, stalled
BAR_MARKS = dict(zip(BUCKETS, "qs#eckLS", strict=True))


def required_service(address: str | None):
    """A context manager yielding the service, or a UsageError saying how to start one."""
    from orchestrator import client

    return client.connected_service(address, required=True)


def read_queue(
    address: str | None, include_finished: bool, waiting: int | None = None
) -> tuple[list[dict], dict]:
    """(the queue's jobs, the service's info): from the service's HTTP API when `up` recorded
    it here (milliseconds), else by joining the cluster (seconds). `waiting`: only the first
    that many of the waiting jobs (info's "jobs" counts them all)."""
    from orchestrator import client

    page = client.recorded_page(address)
    if page:
        query = f"queue?finished={int(include_finished)}&rates=0"  # the page's live rates: not shown here
        query += "" if waiting is None else f"&waiting={waiting}"
        try:
            jobs, info = client.api_get(page, query), client.api_get(page, "info")
            if not include_finished:  # a service from before ?finished sends every job
                jobs = [job for job in jobs if job["state"] not in TERMINAL_VALUES]
            return jobs, info
        except client.Unreachable:
            pass

    with required_service(address) as service:
        return client.call(service.queue, include_finished, waiting), client.call(service.info)


def duration_text(seconds: float | None) -> str:
    """H:MM:SS, the one format of the queue's durations; '-' when unknown."""
    if seconds is None:
        return "-"
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def workers_text(job: dict) -> str:
    """'2', or for an elastic job its size now and its range: '3/2..8' (running), '2..8' (waiting)."""
    if not job.get("elastic"):
        return str(job["workers"])
    low, high = job["elastic"]
    now = sum(job["placement"].values())
    return f"{now}/{low}..{high}" if now else f"{low}..{high}"


def ledger_bar(ledger: dict, width: int = 40) -> str:
    """The buckets as a bar of `width` characters, one mark per bucket (BAR_MARKS)."""
    buckets = ledger.get("buckets") or {}
    wall = sum(buckets.values())
    if wall <= 0:
        return ""
    bar, edge, so_far = "", 0, 0.0
    for bucket in BUCKETS:  # cumulative rounding: the marks always add up to `width`
        so_far += buckets.get(bucket, 0.0)
        end = round(so_far / wall * width)
        bar, edge = bar + BAR_MARKS[bucket] * (end - edge), end
    return bar


def ledger_lines(ledger: dict) -> list[str]:
    """`orchestrator status`'s lines: the bar with the goodput, then each bucket's time."""
    spent = ", ".join(
        f"{bucket} {duration_text(seconds)}"
        for bucket, seconds in ledger["buckets"].items()
        if seconds >= 0.5
    )
    goodput = ledger["goodput"]
    return [
        f"[{ledger_bar(ledger)}] goodput {percent(goodput['time'])} (scheduling"
        f" {percent(goodput['scheduling'])} x runtime {percent(goodput['runtime'])})",
        spent or "nothing yet",
    ]


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"
