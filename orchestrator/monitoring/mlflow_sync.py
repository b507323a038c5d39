"""A job's MLflow run completed from its durable metrics log: the log is the source, the
MLflow run a copy that catches up whenever the server answers.

`sync_run` reads the run folder's metrics log, finds the job's MLflow run (the one
`mlflow.json` names, else a new one: a `torchrun` or `--local` job never had one), sends every
record past the run's marks (`orchestrator.last_train_step`, `orchestrator.last_eval_step`,
written in the same call as the metrics, so each step arrives once however often it runs),
then, when the run ended, its summary as `summary.json` and its final status. The service
runs it for each ended tracked job (`service/mlflow_catchup.py`); `orchestrator tracking sync`
runs it by hand.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from core import metrics_log, records
from orchestrator.monitoring.mlflow_tracking import (
    BATCH,
    MARKS,
    STATUS,
    metrics_of,
    open_run,
    read_run_file,
)

TERMINAL_STATUSES = {"FINISHED", "FAILED", "KILLED"}


@dataclass
class SyncReport:
    name: str  # the run's name
    sent: list[int] = field(default_factory=list)  # steps of the records sent now
    already: int = 0  # records the MLflow run had before
    status: str | None = None  # the final status set now (None: none set)
    kept_status: str | None = None  # the run's status, left as it was

    def line(self) -> str:
        """'convnet-digits: sent 50 records (steps 110-600), FINISHED; 10 were already there'"""
        if self.sent:
            what = f"sent {len(self.sent)} records (steps {min(self.sent)}-{max(self.sent)})"
        else:
            what = "sent no records"
        if self.status:
            what += f", {self.status}"
        elif self.kept_status:
            what += f"; the run stays {self.kept_status}"
        return f"{self.name}: {what}; {self.already} were already there"


def tracked_records(run_uri: str) -> list[dict]:
    """The log's train and eval records, in order; none when nothing was logged."""
    try:
        logged = metrics_log.read_metrics(run_uri)
    except FileNotFoundError:
        return []
    return [r for r in logged if records.kind_of(r) in MARKS]


def unsent(logged: list[dict], marks: dict[str, int]) -> list[dict]:
    return [r for r in logged if int(r[records.STEP]) > marks.get(records.kind_of(r), -1)]


def known_marks(run_uri: str) -> dict[str, int]:
    """What the run's folder says was sent (a driver that gave up on the server wrote it there):
    the best guess while the server does not answer."""
    known = read_run_file(run_uri) or {}
    return {kind: int(step) for kind, step in (known.get("sent") or {}).items()}


def final_status(summary: dict | None) -> str | None:
    """FINISHED, FAILED or KILLED for an ended run's summary; None for one that comes back."""
    return STATUS.get((summary or {}).get("status"))


def sync_run(
    settings,
    run_uri: str,
    run_name: str,
    summary: dict | None,
    tags: dict[str, str] | None = None,
    params: dict[str, str] | None = None,
) -> SyncReport:
    """Complete the job's MLflow run from its metrics log; with `summary` of an ended run, its
    summary and final status too. Raises what the client raises while the server does not answer."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # the caller retries
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")  # we say what was sent
    from mlflow import MlflowClient

    report, logged = SyncReport(run_name), tracked_records(run_uri)
    if not logged and read_run_file(run_uri) is None:
        return report  # it never trained: nothing to copy, no run to make
    client = MlflowClient(tracking_uri=settings.uri)
    run = open_run(client, settings, run_uri, run_name, params or {}, (tags or {}).get("orchestrator.sweep"))
    marks = {kind: int(run.data.tags[tag]) for kind, tag in MARKS.items() if tag in run.data.tags}
    waiting = unsent(logged, marks)
    report.already = len(logged) - len(waiting)
    _send(client, run.info.run_id, waiting, marks, dict(tags or {}))
    report.sent = [int(r[records.STEP]) for r in waiting]
    status = final_status(summary)
    if status is None or run.info.status == status:
        report.kept_status = run.info.status
        return report
    client.log_dict(run.info.run_id, summary, "summary.json")
    client.set_terminated(run.info.run_id, status=status)
    report.status = status
    return report


def _send(client, run_id: str, waiting: list[dict], marks: dict[str, int], tags: dict[str, str]) -> None:
    """In calls of at most BATCH metrics, each with the marks it moves: a call that fails
    leaves the run's marks where its metrics stopped."""
    from mlflow.entities import Metric

    metrics: list = []
    for record in waiting:
        numbers = metrics_of(record)
        if metrics and len(metrics) + len(numbers) > BATCH:
            _log(client, run_id, metrics, tags, marks)
            metrics, tags = [], {}
        kind, step = records.kind_of(record), int(record[records.STEP])
        marks[kind] = step
        stamp = int(record.get(records.TIME, time.time()) * 1000)
        metrics += [Metric(k, v, stamp, step) for k, v in numbers.items()]
    if metrics or tags:
        _log(client, run_id, metrics, tags, marks)


def _log(client, run_id: str, metrics: list, tags: dict[str, str], marks: dict[str, int]) -> None:
    from mlflow.entities import RunTag

    every = {**tags, **{MARKS[kind]: str(step) for kind, step in marks.items()}}
    client.log_batch(run_id, metrics=metrics, tags=[RunTag(k, v) for k, v in every.items()])
