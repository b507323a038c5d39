"""The service's reads: the queue, a job, a sweep's trials, the service's info, a job's metrics
and checkpoints, the queue configuration's use, and the exporter's snapshot. A mixin of
`OrchestratorService` (actor.py), which gives it `door`, `lock`, `jobs`, `live`, `views` and
`_job`; imports no Ray.

Each read takes the caller's token last and asks the door whether it may read (none: the Ray
token's holder); reads are checked, not logged (`access.py`). The status page's routes reach
them through `monitoring/page_view.py`, after the page's own check of the request's token.
"""

from __future__ import annotations

from typing import Any

from core import run_folder
from orchestrator.monitoring.page_view import process_info
from orchestrator.monitoring.queue_query import QueueQuery
from orchestrator.service.access import ACTOR, Door
from orchestrator.service.live import with_logged


class ReadCalls:
    door: Door

    def queue(
        self, include_finished: bool = False, waiting: int | None = None, token: str | None = None
    ) -> list[dict]:
        """In queue order; `waiting`: only the first that many of the waiting jobs."""
        self.door.check_read(token, ACTOR)
        with self.lock:
            return self.views.queue(include_finished, waiting)

    def queue_page(self, query: QueueQuery, token: str | None = None) -> dict:
        """One page of the queue and its totals (monitoring/queue_query.py)."""
        self.door.check_read(token, ACTOR)
        with self.lock:
            return self.views.queue_page(query)

    def status(self, job_id: str, token: str | None = None) -> dict:
        self.door.check_read(token, ACTOR)
        with self.lock:
            return self._view(self._job(job_id))

    def sweep(self, name: str, token: str | None = None, route: str = ACTOR) -> list[dict]:
        self.door.check_read(token, route)
        with self.lock:
            return [self._view(j, history=False) for j in self.jobs.values() if j.sweep == name]

    def queues_view(self, token: str | None = None) -> dict | None:
        """The queue configuration (as written: defaults left out) and each queue's use now
        (None: no configuration)."""
        self.door.check_read(token, ACTOR)
        with self.lock:
            return self.views.queues()

    def info(self, token: str | None = None) -> dict:
        self.door.check_read(token, ACTOR)
        with self.lock:
            return {
                "status_page": self.page_url,
                "generation": self.generation,
                "store": self.config.store,
                "dashboard": self.config.dashboard,
                "started_at": self.started_at,
                "last_pass_s": self.last_pass_s,
                "health_checks": self.health_checks.describe(),
                "shared_storage": list(self.config.shared_storage),
                **self.views.cluster(),  # nodes, resources, jobs by state, goodput, queues, ...
                "process": process_info(),  # the control plane never loads torch: see for yourself
            }

    # -- monitoring ----------------------------------------------------------------------------

    def exporter_snapshot(self) -> dict[str, Any]:
        """What the Prometheus collector reads at each scrape (see monitoring/exporter.py)."""
        with self.lock:
            return {**self.views.exporter_snapshot(), "mlflow_waiting": self.mlflow.records_waiting()}

    def metrics_since(
        self, job_id: str, since_step: int, newest: int | None = None, token: str | None = None
    ) -> list[dict]:
        """A job's metrics records after `since_step` (`newest`: only that many, the newest):
        from memory while it reports, older ones than memory keeps (`LiveMetrics.KEEP`) and
        those of a job that does not report from its metrics log in storage."""
        self.door.check_read(token, ACTOR)
        with self.lock:
            job = self._job(job_id)
            live = self.live.get(job_id)
            kept = live.since(since_step, newest) if live is not None else []
            if kept and (len(kept) == newest or not live.older_than(since_step)):
                return kept
            if not kept and live is not None and live.records and not live.older_than(since_step):
                return []  # memory has the newest records, none after since_step: no log to read
            run_uri = run_folder.run_uri(job.spec, job.run)
        return with_logged(kept, run_uri, since_step, newest)

    def checkpoints(self, job_id: str, token: str | None = None) -> list[str]:
        self.door.check_read(token, ACTOR)
        with self.lock:
            job = self._job(job_id)
            run_uri = run_folder.run_uri(job.spec, job.run)
        try:
            return run_folder.checkpoints(run_uri)
        except OSError:
            return []
