"""What the service tests share: the job's history as the service recorded it, its metrics log,
its time ledger."""

from pathlib import Path

from core.metrics_log import read_metrics

# What the service saw rather than did: a loaded runner can make a rank lag (`on_straggler: warn`).
OBSERVATIONS = {"straggler", "autoscaler-requested"}


def events(job: dict) -> list[str]:
    return [e["event"] for e in job["history"]]


def lifecycle(job: dict) -> list[str]:
    """The job's history without the service's observations."""
    return [e for e in events(job) if e not in OBSERVATIONS]


def when(job: dict, event: str, nth: int = 0) -> float:
    return [e["time"] for e in job["history"] if e["event"] == event][nth]


def train_steps(run_dir: Path | str) -> list[int]:
    return [r["step"] for r in read_metrics(str(run_dir)) if "loss" in r]


def ledger_of(job: dict) -> dict[str, float]:
    """The job's time ledger as stored with it, checked against its wall time (submission to
    end, the record's own times): the buckets must add up to it within 1% or 1 s."""
    buckets = job["ledger"]["seconds"]
    wall = job["finished_at"] - job["submitted_at"]
    assert abs(sum(buckets.values()) - wall) <= max(1.0, 0.01 * wall), (buckets, wall)
    assert min(buckets.values()) >= 0, buckets
    return buckets
