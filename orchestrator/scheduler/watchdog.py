"""The service's watch over running jobs: hangs (`hangs.py`) and stragglers (`stragglers.py`).

Fed by the drivers' reports (`OrchestratorService.report`): the newest step, the records
(rank 0's, with its step-time split), the other ranks' own records, and the job's workers
(rank -> pid, node). Asked by the scheduling loop which jobs are hung, and by the views and
the exporter which ranks straggle. Memory only: a restarted service starts watching afresh.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core import records
from core.jobs import JobState
from orchestrator.scheduler.hangs import StepClock, start_timeout_s, timeout_s
from orchestrator.scheduler.store import JobRecord
from orchestrator.scheduler.stragglers import StragglerWindow


@dataclass
class Watch:
    attempt: int
    clock: StepClock = field(default_factory=StepClock)
    window: StragglerWindow = field(default_factory=StragglerWindow)
    workers: dict[int, dict] = field(default_factory=dict)  # rank -> {"pid", "node", "node_id"}
    group: int = 0  # restarts of the worker group within the attempt
    acted_on: set[int] = field(default_factory=set)  # stragglers already acted on


class Watchdog:
    def __init__(self):
        self.watches: dict[str, Watch] = {}

    def _watch(self, job: JobRecord) -> Watch:
        watch = self.watches.get(job.id)
        if watch is None or watch.attempt != job.attempt:
            watch = self.watches[job.id] = Watch(job.attempt)
        return watch

    def observe(self, job: JobRecord, progress: dict, now: float) -> None:
        """A driver's report of the job's current attempt."""
        watch = self._watch(job)
        group = int(progress.get("restarts") or 0)
        if group != watch.group:  # a new worker group: new ranks, new windows
            watch.group, watch.window, watch.workers, watch.acted_on = group, StragglerWindow(), {}, set()
        if progress.get("workers"):
            watch.workers = {int(rank): dict(w) for rank, w in progress["workers"].items()}
        batch = progress.get("records") or []
        watch.clock.add_records(batch)
        watch.clock.observe(
            progress.get("step"), group, now, progress.get("start_step"), workers_up=bool(watch.workers)
        )
        for r in batch:
            if records.is_train(r):
                watch.window.add(int(r.get("rank", 0)), int(r[records.STEP]), r.get("compute_s"))
        for rank, r in (progress.get("ranks") or {}).items():
            if records.STEP in r:
                watch.window.add(int(rank), int(r[records.STEP]), r.get("compute_s"))

    def forget(self, job_id: str) -> None:
        self.watches.pop(job_id, None)

    # -- hangs -------------------------------------------------------------------------------

    def timeout_s(self, job: JobRecord, start: bool = False) -> float:
        """The job's hang timeout; `start`: its start timeout (before a group's first step)."""
        watch = self.watches.get(job.id)
        p95 = watch.clock.p95_interval_s() if watch is not None else None
        rule = start_timeout_s if start else timeout_s
        return rule(job.spec.fault_tolerance.hang_timeout_s, p95)

    def hung(self, jobs: list[JobRecord], now: float) -> list[tuple[JobRecord, Watch, float]]:
        """The running jobs hung now, each with its watch and the timeout it ran past (the
        start timeout for a worker group without a first step); each stall once."""
        out = []
        for job in jobs:
            watch = self.watches.get(job.id)
            if job.state is not JobState.RUNNING or watch is None or watch.attempt != job.attempt:
                continue
            spec, clock = job.spec, watch.clock
            timeout, start = self.timeout_s(job), self.timeout_s(job, start=True)
            every = (spec.checkpoint.every_steps, spec.train.eval_every)
            if watch.workers and clock.hung(
                now, timeout, spec.metrics.log_every, every, job.total_steps, start
            ):
                clock.fired = True
                out.append((job, watch, timeout if clock.armed else start))
        return out

    # -- stragglers --------------------------------------------------------------------------

    def stragglers(self, job_id: str) -> list[dict]:
        """[{"rank", "node", "ip", "ratio"}] of the job's flagged ranks, slowest first."""
        watch = self.watches.get(job_id)
        if watch is None:
            return []
        flagged = []
        for rank, ratio in watch.window.stragglers().items():
            worker = watch.workers.get(rank, {})
            flagged.append(
                {"rank": rank, "node": worker.get("node_id"), "ip": worker.get("node"), "ratio": ratio}
            )
        return sorted(flagged, key=lambda s: -s["ratio"])

    def ratios(self, job_id: str) -> list[dict]:
        """Every rank's compute ratio (once the windows are full), for the exporter."""
        watch = self.watches.get(job_id)
        if watch is None:
            return []
        return [
            {"rank": rank, "node": watch.workers.get(rank, {}).get("node_id"), "ratio": ratio}
            for rank, ratio in watch.window.ratios().items()
        ]

    def new_stragglers(self, job_id: str) -> list[dict]:
        """Flagged ranks not acted on yet (each straggler once per worker group)."""
        watch = self.watches.get(job_id)
        if watch is None:
            return []
        fresh = [s for s in self.stragglers(job_id) if s["rank"] not in watch.acted_on]
        watch.acted_on |= {s["rank"] for s in fresh}
        return fresh
