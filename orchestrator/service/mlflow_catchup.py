"""The service completes every ended tracked job's MLflow run from its metrics log, whenever
the tracking server answers (`monitoring/mlflow_sync.py` does the sending).

A job's driver sends its records as it trains, but waits at most 15 s for a server that does
not answer once the attempt has ended, and a driver that died sends nothing more. The service
outlives both: on a thread of its own, once a job has ended (and its driver has had its
time), it copies what the MLflow run lacks, then sets the final status and uploads
`summary.json`. While the server does not answer it tries again with a growing pause and
keeps, per job, how many records wait and since when: the job's view and the Prometheus
metric `orchestrator_job_mlflow_records_waiting` show them.

What it has completed is kept in memory only: a restarted service asks the server once per
ended tracked job, and a run already in its final status costs one call.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from core import run_folder
from orchestrator.monitoring import mlflow_sync, mlflow_tracking

log = logging.getLogger("orchestrator.service")

PASS_S = 5.0  # between looks at the ended jobs
AFTER_END_S = mlflow_tracking.CLOSE_WAIT_S + 15  # the driver's own last try comes first
PAUSES_S = (5, 10, 20, 30)  # between tries of one job while its server does not answer


@dataclass
class Waiting:
    records: int  # in the metrics log, past what the server is known to have
    since: float  # the first try that failed
    why: str  # the first line of the error (in the service's log)
    tries: int = 1
    next_try: float = 0.0

    def note(self) -> str:
        at = time.strftime("%H:%M", time.localtime(self.since))
        return f"MLflow: {self.records} records waiting since {at} (server unreachable)"


@dataclass(frozen=True)
class Ended:
    """What the sync needs of an ended job, taken under the service's lock."""

    id: str
    settings: object
    run_uri: str
    run: str
    summary: dict
    tags: dict[str, str]
    params: dict[str, str]
    finished_at: float


class MlflowCatchUp:
    """`jobs`: the service's job table, read under `lock`; `closing`: set when the service stops."""

    def __init__(self, jobs, lock, closing: threading.Event):
        self.jobs, self.lock, self.closing = jobs, lock, closing
        self.complete: set[str] = set()
        self.waiting: dict[str, Waiting] = {}  # read by the views: replaced, never changed in place

    def start(self) -> None:
        threading.Thread(target=self._loop, name="mlflow-catch-up", daemon=True).start()

    def note(self, job_id: str) -> str | None:
        waiting = self.waiting.get(job_id)
        return waiting.note() if waiting else None

    def records_waiting(self) -> dict[str, int]:
        return {job_id: w.records for job_id, w in self.waiting.items()}

    def _loop(self) -> None:
        while not self.closing.wait(PASS_S):
            try:
                self.catch_up(time.time())
            except Exception:  # one bad pass must not end the catching up
                log.exception("MLflow catch-up pass failed")

    def catch_up(self, now: float) -> None:
        """One pass: every ended tracked job whose run is not known complete, when its turn comes."""
        for job in self._due(now):
            self._sync(job, self.waiting.get(job.id), now)

    def _due(self, now: float) -> list[Ended]:
        waiting = self.waiting
        with self.lock:
            return [
                _ended_job(job)
                for job in list(self.jobs.values())
                if job.state.is_terminal
                and job.spec.tracking.mlflow is not None
                and job.id not in self.complete
                and now - (job.finished_at or now) >= AFTER_END_S
                and now >= (waiting[job.id].next_try if job.id in waiting else 0)
            ]

    def _sync(self, job: Ended, waiting: Waiting | None, now: float) -> None:
        try:
            report = mlflow_sync.sync_run(
                job.settings, job.run_uri, job.run, job.summary, job.tags, job.params
            )
        except Exception as err:  # a server down, slow or refusing: tried again later
            self._failed(job, waiting, err, now)
            return
        self.complete.add(job.id)
        self.waiting = {k: v for k, v in self.waiting.items() if k != job.id}
        if report.sent or report.status:
            log.info("MLflow, job %s: %s", job.id, report.line())

    def _failed(self, job: Ended, waiting: Waiting | None, err: Exception, now: float) -> None:
        why = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
        count = len(
            mlflow_sync.unsent(mlflow_sync.tracked_records(job.run_uri), mlflow_sync.known_marks(job.run_uri))
        )
        if waiting is None:
            log.warning(
                "MLflow, job %s: cannot send to %s (%s); %d records wait",
                job.id,
                job.settings.uri,
                why,
                count,
            )
            waiting = Waiting(count, now, why, tries=0)
        pause = PAUSES_S[min(waiting.tries, len(PAUSES_S) - 1)]
        after = Waiting(count, waiting.since, waiting.why, waiting.tries + 1, now + pause)
        self.waiting = {**self.waiting, job.id: after}


def _ended_job(job) -> Ended:
    run_uri = run_folder.run_uri(job.spec, job.run)
    view = {"id": job.id, "attempt": job.attempt, "queue": job.queue, "user": job.user, "team": job.team}
    tags = mlflow_tracking.job_tags(run_uri, {**view, "sweep": job.sweep})
    if job.last_checkpoint:
        tags["orchestrator.checkpoint"] = job.last_checkpoint
    summary = {**(job.summary or {}), "status": job.state.value}  # the job's verdict decides
    params = mlflow_tracking.flat_params(job.spec.model_dump(mode="json", by_alias=True))
    return Ended(
        job.id, job.spec.tracking.mlflow, run_uri, job.run, summary, tags, params, job.finished_at or 0
    )
