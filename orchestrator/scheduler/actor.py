"""The orchestrator service: one detached, named Ray actor per cluster that owns the queue.

    CLI (submit, queue, stop, preempt, status)  --actor calls-->  OrchestratorService
    a job's driver (`orchestrator run`)         --actor calls-->    |  Policy (pure)
                                                                    |  Store  (job files, lease)
                                                                    |  JobRunner (Ray Jobs API)

A scheduling pass runs every `tick_s` on a thread of the actor: renew the lease, read the
cluster's nodes, reconcile the job table with the Ray Jobs that run the drivers (a driver
that died, workers that did not start in time, a victim that did not stop within its grace
period), then ask the policy what to admit and whom to preempt, and act on it. Every change
of a job is written to the store before anything else learns of it, so a restarted service
(Ray restarts the actor; a new one can start elsewhere) reloads the queue and carries on.

The drivers do the rest: a driver polls `admission` until its job is admitted (with the
nodes the service counted), runs the job there, reports progress (and learns of stop
requests in the reply), and reports how its attempt ended. A preempted driver goes back to
waiting; a job whose driver died is started again from its package by the service.
"""

from __future__ import annotations

import collections
import io
import logging
import secrets
import threading
import time
import zipfile
from dataclasses import dataclass, field
from typing import Any

import ray

from orchestrator.monitoring.exporter import registry_for
from orchestrator.monitoring.web import make_app, serve
from orchestrator.scheduler.policy import Policy
from orchestrator.scheduler.runner import TERMINAL, JobRunner, submission_id, write_spec
from orchestrator.scheduler.store import JobRecord, JobState, Store
from orchestrator.scheduler.types import Allocation, JobRequest, Node
from workers import storage
from workers.checkpoint import checkpoint_step
from workers.metrics_log import read_metrics

SERVICE_NAME = "orchestrator"
NAMESPACE = "orchestrator"

log = logging.getLogger("orchestrator.service")


@dataclass
class ServiceConfig:
    store: str  # URI of the job store (any pyarrow filesystem)
    dashboard: str  # the Ray dashboard (Jobs API) the service starts drivers through
    tick_s: float = 1.0
    start_deadline_s: float = 300.0  # all workers of an admitted job must start within this
    backoff_s: float = 10.0  # first wait before a job whose start failed is admitted again
    max_backoff_s: float = 600.0
    max_failed_starts: int = 3  # attempts in a row that end before training starts: then failed
    driver_timeout_s: float = 60.0  # a driver outside Ray Jobs that stops reporting is gone
    quotas: dict[str, dict[str, float]] = field(default_factory=dict)
    backfill: bool = True
    preemption: bool = True
    web_host: str = "127.0.0.1"  # the status page and /metrics; 0.0.0.0 to reach them from elsewhere
    web_port: int = 8266  # 0: any free port (its URL is in `info()`)


def worker_resources(spec: dict) -> dict[str, float]:
    """The Ray resources one worker of a spec (as JSON) needs."""
    res = spec.get("resources", {})
    out = {"CPU": float(res.get("cpus_per_worker", 1.0))}
    if res.get("gpus_per_worker"):
        out["GPU"] = float(res["gpus_per_worker"])
    for name, amount in (res.get("custom_per_worker") or {}).items():
        out[name] = float(amount)
    return out


def new_job_id(name: str) -> str:
    return f"{name}-{time.strftime('%m%d-%H%M%S')}-{secrets.token_hex(2)}"


class OrchestratorService:
    """Use through `ray.remote(...)` (see `service_options`); every method is safe to retry."""

    def __init__(self, config: dict):
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
        self.config = ServiceConfig(**config)
        self.store = Store(self.config.store)
        self.owner = ray.get_runtime_context().get_actor_id() or f"service-{secrets.token_hex(4)}"
        self.generation = self.store.acquire_lease(self.owner)
        self.jobs: dict[str, JobRecord] = self.store.load_all()
        self.runner = JobRunner(self.config.dashboard)
        self.policy = Policy(
            [], quotas=self.config.quotas, backfill=self.config.backfill, preemption=self.config.preemption
        )
        self.nodes: list[Node] = []
        self.notes: dict[str, str] = {}
        self.started_at = time.time()
        self.last_pass_s = 0.0
        self.lock = threading.RLock()
        self.live: dict[str, LiveMetrics] = {}  # newest metrics of the jobs that report (memory only)
        self._closing = threading.Event()
        self.page, self.page_url = None, None
        try:
            self.page, self.page_url = serve(
                make_app(PageView(self), registry_for(self)), self.config.web_host, self.config.web_port
            )
        except OSError as err:  # the queue matters more than the page: keep scheduling
            log.error(
                "status page and metrics not served on %s:%s: %s",
                self.config.web_host,
                self.config.web_port,
                err,
            )
        log.info(
            "orchestrator service generation %d: %d jobs in %s",
            self.generation,
            len(self.jobs),
            self.config.store,
        )
        threading.Thread(target=self._loop, name="scheduling", daemon=True).start()

    # -- the scheduling loop ------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._closing.is_set():
            try:
                self.tick()
            except Exception:  # one bad pass must not end scheduling
                log.exception("scheduling pass failed")
            self._closing.wait(self.config.tick_s)

    def tick(self, now: float | None = None) -> None:
        started = time.perf_counter()
        with self.lock:
            now = time.time() if now is None else now
            self.store.renew_lease(self.owner, self.generation, now)
            self._refresh_nodes()
            self._reconcile(now)
            self._schedule(now)
        self.last_pass_s = time.perf_counter() - started

    def _refresh_nodes(self) -> None:
        nodes = []
        for n in ray.nodes():
            if n.get("Alive"):
                capacity = {
                    k: float(v)
                    for k, v in n.get("Resources", {}).items()
                    if not k.startswith("node:") and isinstance(v, (int, float))
                }
                nodes.append(Node(n["NodeID"], capacity))
        self.nodes = nodes
        self.policy.set_nodes(nodes)

    def _reconcile(self, now: float) -> None:
        """Bring the job table in line with the drivers Ray runs."""
        watched = [
            j
            for j in self.jobs.values()
            if not j.state.is_terminal
            and (j.state.holds_resources or j.submission_id or j.launched_by == "driver")
        ]
        statuses = self.runner.statuses() if any(j.submission_id for j in watched) else {}
        for job in watched:
            if job.submission_id:
                status = statuses.get(job.submission_id)
                driver_gone = status is None or status in TERMINAL
            else:  # a driver outside Ray Jobs (a terminal): alive while it keeps reporting
                status = None
                silent = now - job.last_seen
                driver_gone = job.launched_by == "driver" and silent > self.config.driver_timeout_s
            if driver_gone and job.state.is_pending:
                job.submission_id = None  # a driver waiting in the queue went away
                if not job.package:
                    self._finish(job, JobState.FAILED, now, reason="its driver exited while it was queued")
                else:
                    self._save(job)
            elif driver_gone and job.state.holds_resources:
                self._driver_gone(job, now, status)
            elif job.state is JobState.ADMITTED and now - job.admitted_at > self.config.start_deadline_s:
                self._start_timed_out(job, now)
            elif job.state is JobState.STOPPING and job.stop_requested_at is not None and not job.killed:
                grace = float(job.spec.get("scheduling", {}).get("preemption_grace_s", 60.0))
                if now - job.stop_requested_at > grace:
                    log.warning("%s did not stop within %.0f s: stopping its driver", job.id, grace)
                    job.killed = True
                    job.log("killed", now, reason=f"no checkpoint within {grace:.0f} s")
                    self._save(job)
                    if job.submission_id:
                        self.runner.stop(job.submission_id)

    def _driver_gone(self, job: JobRecord, now: float, status: str | None) -> None:
        """The driver of a job that still holds resources ended without saying how."""
        was = job.state
        job.submission_id = None
        if job.stop_requested == "stop":
            self._finish(job, JobState.STOPPED, now, reason="stopped by request")
            return
        lost = self._steps_since_checkpoint(job)
        job.steps_lost += lost
        if not job.package:
            self._finish(job, JobState.FAILED, now, reason="its driver exited and it cannot be restarted")
            return
        if job.stop_requested == "preempt":
            job.preemptions += 1
            job.log("preempted", now, step=job.step, steps_lost=lost, acknowledged=False)
        else:
            job.log(
                "driver-exited",
                now,
                status=status or "unknown",
                step=job.step,
                steps_lost=lost,
                was=was.value,
            )
        self._requeue(job, now, backoff=job.stop_requested != "preempt")

    def _steps_since_checkpoint(self, job: JobRecord) -> int:
        saved = checkpoint_step(job.last_checkpoint) if job.last_checkpoint else 0
        return max(job.step - (saved or 0), 0)

    def _start_timed_out(self, job: JobRecord, now: float) -> None:
        log.warning(
            "%s: its workers did not all start within %.0f s; requeued", job.id, self.config.start_deadline_s
        )
        job.log("start-timeout", now, deadline_s=self.config.start_deadline_s)
        if job.submission_id:
            self.runner.stop(job.submission_id)
            job.submission_id = None
        self._requeue(job, now, backoff=True)

    def _requeue(self, job: JobRecord, now: float, backoff: bool) -> None:
        if backoff and job.failed_starts + 1 >= self.config.max_failed_starts:
            reason = (
                f"its driver failed to run it {job.failed_starts + 1} times in a row; "
                f"see `orchestrator logs {job.submission_id or submission_id(job.id, job.attempt)}`"
            )
            self._finish(job, JobState.FAILED, now, reason=reason)
            return
        job.state = JobState.PREEMPTED if job.stop_requested == "preempt" else JobState.QUEUED
        job.placement, job.stop_requested, job.stop_requested_at, job.killed = {}, None, None, False
        if backoff:
            job.failed_starts += 1
            wait = min(self.config.backoff_s * 2 ** (job.failed_starts - 1), self.config.max_backoff_s)
            job.not_before = now + wait
        self._save(job)

    def _schedule(self, now: float) -> None:
        trials: dict[str, int] = {}  # running trials per sweep, for sweep.max_concurrent
        for j in self.jobs.values():
            if j.sweep and j.state.holds_resources:
                trials[j.sweep] = trials.get(j.sweep, 0) + 1

        def sweep_full(job: JobRecord) -> bool:
            return bool(job.sweep_max_concurrent) and trials.get(job.sweep, 0) >= job.sweep_max_concurrent

        pending = [
            self._request(j)
            for j in self.jobs.values()
            if j.state.is_pending and j.not_before <= now and not sweep_full(j)
        ]
        running = [self._allocation(j) for j in self.jobs.values() if j.state.holds_resources]
        decision = self.policy.schedule(now, pending, running)
        self.notes = dict(decision.notes)
        for job_id, placement in decision.admit:
            job = self.jobs[job_id]
            if sweep_full(job):  # several trials of one sweep fit in this pass: start only its share
                continue
            if job.sweep:
                trials[job.sweep] = trials.get(job.sweep, 0) + 1
            self._admit(job, placement, now)
        for job_id in decision.preempt:
            self._request_stop(self.jobs[job_id], "preempt", now, by=decision.reserved_for)

    def _request(self, job: JobRecord) -> JobRequest:
        return JobRequest(
            job.id,
            job.priority,
            job.workers,
            job.per_worker,
            job.submitted_at,
            job.preemptible,
            job.queue,
            job.remaining_s,
        )

    def _allocation(self, job: JobRecord) -> Allocation:
        remaining = job.remaining_s
        return Allocation(
            job.id,
            job.priority,
            dict(job.placement),
            job.per_worker,
            job.admitted_at or 0.0,
            job.preemptible,
            job.queue,
            None if remaining is None else time.time() + remaining,
            stopping=job.state is JobState.STOPPING,
        )

    def _admit(self, job: JobRecord, placement: dict[str, int], now: float) -> None:
        job.attempt += 1
        job.state, job.placement, job.admitted_at = JobState.ADMITTED, dict(placement), now
        job.generation = self.generation
        job.log("admitted", now, attempt=job.attempt, nodes=len(placement), step=job.step)
        self._save(job)
        if (
            job.submission_id is None
            and job.launched_by == "service"
            or (job.submission_id is None and job.package)
        ):
            try:
                job.submission_id = self.runner.launch(
                    job.id, job.attempt, job.package, {"attempt": job.attempt}
                )
            except Exception as err:
                log.error("%s: cannot start its driver: %s", job.id, err)
                job.log("launch-failed", now, error=str(err).splitlines()[0][:300])
                self._requeue(job, now, backoff=True)
                return
            self._save(job)

    def _request_stop(self, job: JobRecord, why: str, now: float, by: str | None = None) -> None:
        if job.state is JobState.STOPPING and job.stop_requested == why:
            return
        job.state, job.stop_requested, job.stop_requested_at = JobState.STOPPING, why, now
        job.log("stop-requested", now, why=why, **({"for": by} if by else {}), step=job.step)
        self._save(job)

    def _finish(self, job: JobRecord, state: JobState, now: float, reason: str | None = None) -> None:
        job.state, job.finished_at, job.reason = state, now, reason or job.reason
        job.placement, job.stop_requested = {}, None
        job.log(state.value, now, step=job.step, **({"reason": reason} if reason else {}))
        self._save(job)

    def _save(self, job: JobRecord) -> None:
        self.store.save(job)

    # -- submitting ----------------------------------------------------------------------------

    def submit(self, spec: dict, options: dict | None = None, package: bytes | None = None) -> dict:
        """Queue a validated spec (as JSON); `package` is the zipped project directory the job
        runs in. Options: priority, job_id, sweep. Returns the job's record."""
        options = options or {}
        with self.lock:
            job = self._new_record(spec, options, launched_by="service")
            job.package = self._unpack(job.id, package, spec)
            self._save(job)
            return self._view(job)

    def register(self, spec: dict, options: dict | None = None, package: bytes | None = None) -> dict:
        """A driver started outside the service (`orchestrator run`, `ray job submit`) queues its
        job. Options: job_id, submission_id (its Ray Job, if any), priority."""
        options = options or {}
        with self.lock:
            if options.get("job_id") in self.jobs:  # a restarted driver of a known job
                job = self.jobs[options["job_id"]]
                return self._attach(job, options.get("submission_id"))
            job = self._new_record(spec, options, launched_by="driver")
            job.submission_id = options.get("submission_id")
            if package is not None:
                job.package = self._unpack(job.id, package, spec)
            job.last_seen = time.time()
            self._save(job)
            return self._view(job)

    def _new_record(self, spec: dict, options: dict, launched_by: str) -> JobRecord:
        sched = spec.get("scheduling", {})
        res = spec.get("resources", {})
        job_id = options.get("job_id") or new_job_id(spec["name"])
        if job_id in self.jobs:
            raise ValueError(f"there is already a job '{job_id}' in the queue")
        priority = int(options.get("priority", sched.get("priority", 0)))
        request = JobRequest(
            job_id,
            priority,
            int(res.get("num_workers", 1)),
            worker_resources(spec),
            time.time(),
            bool(sched.get("preemptible", False)),
            sched.get("queue", "default"),
        )
        refusal = self.policy.rejection_reason(request) if self.nodes else None
        if refusal:
            raise ValueError(f"{refusal}; lower resources.num_workers or the per-worker resources")
        train = spec.get("train", {})
        resume = spec.get("checkpoint", {}).get("resume", "auto")
        # the run (its checkpoints) is named once, here: `resume: never` gets a run of its own,
        # which every later attempt of this job continues
        run = f"{spec['name']}-{time.strftime('%Y%m%d-%H%M%S')}" if resume == "never" else spec["name"]
        job = JobRecord(
            id=job_id,
            run=run,
            name=spec["name"],
            spec=spec,
            priority=priority,
            queue=request.queue,
            preemptible=request.preemptible,
            workers=request.workers,
            per_worker=request.per_worker,
            submitted_at=request.submitted_at,
            launched_by=launched_by,
            sweep=options.get("sweep"),
            sweep_params=options.get("sweep_params") or {},
            sweep_metric=options.get("sweep_metric"),
            sweep_mode=options.get("sweep_mode"),
            sweep_max_concurrent=options.get("sweep_max_concurrent"),
            total_steps=train.get("steps"),
        )
        job.log("queued", job.submitted_at, priority=priority, by=launched_by)
        self.jobs[job.id] = job
        return job

    def _unpack(self, job_id: str, package: bytes | None, spec: dict) -> str | None:
        if package is None:
            return None
        uri = self.store.package_uri(job_id)
        fs, root = storage.resolve(uri)
        with zipfile.ZipFile(io.BytesIO(package)) as archive:
            for item in archive.infolist():
                if item.is_dir() or item.filename.startswith("/") or ".." in item.filename.split("/"):
                    continue
                target = f"{root}/{item.filename}"
                fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
                with archive.open(item) as src, fs.open_output_stream(target) as out:
                    out.write(src.read())
        write_spec(uri, {**spec, "name": spec["name"]})
        return uri

    # -- the drivers ---------------------------------------------------------------------------

    def attach(self, job_id: str, submission_id: str | None) -> dict:
        """The driver the service started for `job_id` is up."""
        with self.lock:
            return self._attach(self._job(job_id), submission_id)

    def _attach(self, job: JobRecord, submission_id: str | None) -> dict:
        job.submission_id = submission_id or job.submission_id
        job.last_seen = time.time()
        self._save(job)
        return self._view(job)

    def admission(self, job_id: str) -> dict:
        """For a waiting driver: {"state", "attempt", "placement", "note", "position"}."""
        with self.lock:
            job = self._job(job_id)
            job.last_seen = time.time()
            ahead = sum(
                1
                for j in self.jobs.values()
                if j.state.is_pending
                and j.id != job.id
                and (j.priority, -j.submitted_at) > (job.priority, -job.submitted_at)
            )
            return {
                "state": job.state.value,
                "attempt": job.attempt,
                "placement": dict(job.placement),
                "note": self.notes.get(job.id),
                "ahead": ahead,
                "stop": job.stop_requested,
            }

    def report(self, job_id: str, attempt: int, progress: dict) -> dict:
        """Progress of a running attempt (step, total_steps, step_time_s, checkpoint,
        workers_started); the reply carries a stop request, if any."""
        with self.lock:
            job = self._job(job_id)
            job.last_seen = time.time()
            if attempt != job.attempt:
                return {"stop": "stop", "reason": "a newer attempt of this job runs"}
            live = self.live.setdefault(job_id, LiveMetrics())
            if progress.get("rewound"):
                live.clear()
            live.add(progress.get("records") or [])
            if progress.get("ranks") is not None:
                live.ranks = dict(progress["ranks"])
            if progress.get("restarts") is not None:
                live.restarts = int(progress["restarts"])
            changed = False
            for key in ("step", "total_steps", "step_time_s"):
                if progress.get(key) is not None and getattr(job, key) != progress[key]:
                    setattr(job, key, progress[key])
                    changed = key != "step_time_s" or changed
            if progress.get("checkpoint") and progress["checkpoint"] != job.last_checkpoint:
                job.last_checkpoint = progress["checkpoint"]
                changed = True
            if progress.get("workers_started") and job.state is JobState.ADMITTED:
                job.state, job.started_at = JobState.RUNNING, time.time()
                job.failed_starts = 0
                job.log("running", job.started_at, attempt=attempt, step=job.step)
                changed = True
            if changed:
                self._save(job)
            return {"stop": job.stop_requested}

    def finished(self, job_id: str, attempt: int, outcome: str, summary: dict | None = None) -> dict:
        """How an attempt ended: succeeded, failed, stopped or preempted (then it is queued
        again, and the same driver waits for its next admission)."""
        with self.lock:
            job = self._job(job_id)
            now = time.time()
            if attempt != job.attempt or not job.state.holds_resources:
                return self._view(job)  # a late report of an attempt already accounted for
            summary = summary or {}
            job.summary = summary
            job.step = summary.get("steps") or job.step
            job.last_checkpoint = summary.get("checkpoint") or job.last_checkpoint
            if outcome == "preempted":
                job.preemptions += 1
                saved = checkpoint_step(job.last_checkpoint) if job.last_checkpoint else 0
                lost = max(job.step - (saved or 0), 0)
                job.steps_lost += lost
                job.log("preempted", now, step=job.step, steps_lost=lost, acknowledged=True)
                job.stop_requested = "preempt"
                self._requeue(job, now, backoff=False)
            elif outcome == "stopped":
                self._finish(job, JobState.STOPPED, now, reason=f"stopped at step {job.step}")
            elif outcome == "succeeded":
                self._finish(job, JobState.SUCCEEDED, now)
            else:
                self._finish(job, JobState.FAILED, now, reason=summary.get("reason") or outcome)
            return self._view(job)

    # -- the CLI ------------------------------------------------------------------------------

    def stop(self, job_id: str, now: bool = False) -> dict:
        """Checkpoint and stop a job (a queued one just leaves the queue); `now`: kill it."""
        with self.lock:
            job = self._job(job_id)
            t = time.time()
            if job.state.is_terminal:
                return self._view(job)
            if job.state.is_pending:
                self._finish(job, JobState.STOPPED, t, reason="stopped while queued")
                if job.submission_id:  # a driver waiting for admission
                    self.runner.stop(job.submission_id)
            elif now:
                if job.submission_id:
                    self.runner.stop(job.submission_id)
                job.steps_lost += self._steps_since_checkpoint(job)
                self._finish(job, JobState.STOPPED, t, reason="stopped at once (--now)")
            else:
                self._request_stop(job, "stop", t)
            return self._view(job)

    def preempt(self, job_id: str) -> dict:
        """Checkpoint a running job and put it back in the queue."""
        with self.lock:
            job = self._job(job_id)
            if not job.state.holds_resources:
                raise ValueError(f"{job_id} is {job.state.value}: only a running job can be preempted")
            self._request_stop(job, "preempt", time.time(), by="request")
            return self._view(job)

    def queue(self, include_finished: bool = False) -> list[dict]:
        with self.lock:
            jobs = [j for j in self.jobs.values() if include_finished or not j.state.is_terminal]
            return [self._view(j, history=False) for j in sorted(jobs, key=_queue_order)]

    def status(self, job_id: str) -> dict:
        with self.lock:
            return self._view(self._job(job_id))

    def sweep(self, name: str) -> list[dict]:
        with self.lock:
            return [self._view(j, history=False) for j in self.jobs.values() if j.sweep == name]

    def info(self) -> dict:
        with self.lock:
            counts: dict[str, int] = {}
            for j in self.jobs.values():
                counts[j.state.value] = counts.get(j.state.value, 0) + 1
            return {
                "status_page": self.page_url,
                "resources": {"total": self._total(), "busy": self._busy()},
                "generation": self.generation,
                "store": self.config.store,
                "dashboard": self.config.dashboard,
                "started_at": self.started_at,
                "nodes": len(self.nodes),
                "jobs": counts,
                "last_pass_s": self.last_pass_s,
            }

    def shutdown(self) -> None:
        """Stop scheduling and give the lease back (`orchestrator down`)."""
        self._closing.set()
        if self.page is not None:
            self.page.stop()
        with self.lock:
            self.store.release_lease(self.owner)

    # -- monitoring ----------------------------------------------------------------------------

    def _total(self) -> dict[str, float]:
        total: dict[str, float] = {}
        for node in self.nodes:
            for name, amount in node.capacity.items():
                total[name] = total.get(name, 0.0) + amount
        return total

    def _busy(self) -> dict[str, float]:
        busy: dict[str, float] = {}
        for job in self.jobs.values():
            if job.state.holds_resources:
                for name, amount in job.per_worker.items():
                    busy[name] = busy.get(name, 0.0) + amount * job.workers
        return busy

    def exporter_snapshot(self) -> dict[str, Any]:
        """What the Prometheus collector reads at each scrape (see monitoring/exporter.py)."""
        with self.lock:
            jobs = []
            for job in self.jobs.values():
                view = self._view(job, history=False)
                live = self.live.get(job.id)
                view.update(live.snapshot() if live else {})
                view["restarts"] = (live.restarts if live else 0) + sum(
                    1 for e in job.history if e["event"] == "driver-exited"
                )
                jobs.append(view)
            nodes = [{"id": n.id, "capacity": dict(n.capacity)} for n in self.nodes]
            return {"jobs": jobs, "nodes": nodes, "busy": self._busy()}

    def metrics_since(self, job_id: str, since_step: int) -> list[dict]:
        """A job's metrics records after `since_step`: from memory while it reports, else from its
        metrics log in storage."""
        with self.lock:
            job = self._job(job_id)
            live = self.live.get(job_id)
            if live is not None and live.records:
                return [r for r in live.records if r.get("step", 0) > since_step]
            run_uri = storage.join(job.spec.get("checkpoint", {}).get("storage", "./runs"), job.run)
        try:
            return [r for r in read_metrics(run_uri) if r.get("step", 0) > since_step]
        except (FileNotFoundError, OSError):
            return []

    def checkpoints(self, job_id: str) -> list[str]:
        with self.lock:
            job = self._job(job_id)
            run_uri = storage.join(job.spec.get("checkpoint", {}).get("storage", "./runs"), job.run)
        try:
            names = [n for n in storage.list_dirs(run_uri) if checkpoint_step(n) is not None]
        except OSError:
            return []
        return [storage.join(run_uri, n) for n in sorted(names)]

    # -- helpers -------------------------------------------------------------------------------

    def _job(self, job_id: str) -> JobRecord:
        job = self.jobs.get(job_id)
        if job is None:
            raise KeyError(f"no job '{job_id}' in the queue; `orchestrator queue --all` lists them")
        return job

    def _view(self, job: JobRecord, history: bool = True) -> dict[str, Any]:
        view = job.to_json()
        view.pop("spec")
        if not history:
            view.pop("history")
        view["note"] = self.notes.get(job.id)
        view["remaining_s"] = job.remaining_s
        view["submission"] = submission_id(job.id, job.attempt) if job.attempt else None
        return view


class LiveMetrics:
    """The newest metrics records of a job, as its driver reports them (kept in memory: the
    durable copy is the job's metrics log in storage)."""

    KEEP = 5000

    def __init__(self):
        self.records: collections.deque = collections.deque(maxlen=self.KEEP)
        self.latest: dict | None = None
        self.latest_eval: dict | None = None
        self.saves: collections.deque = collections.deque(maxlen=200)
        self.checkpoint_bytes: int | None = None
        self.restarts = 0
        self.ranks: dict[int, dict] = {}  # the newest record of each rank but 0

    def clear(self) -> None:
        self.records.clear()
        self.latest = self.latest_eval = None
        self.ranks = {}

    def add(self, records: list[dict]) -> None:
        seen = self.records[-1].get("step", -1) if self.records else -1
        for r in records:
            if r.get("step", 0) < seen:  # the driver resent what came before a rewind: keep order
                continue
            self.records.append(r)
            if "loss" in r:
                self.latest = r
            elif any(k.startswith("eval_") for k in r):
                self.latest_eval = r
            if r.get("checkpoint_save_s") is not None:
                self.saves.append(float(r["checkpoint_save_s"]))
            if r.get("checkpoint_bytes") is not None:
                self.checkpoint_bytes = int(r["checkpoint_bytes"])

    def snapshot(self) -> dict:
        return {
            "latest": self.latest,
            "latest_eval": self.latest_eval,
            "ranks": [self.ranks[r] for r in sorted(self.ranks)],
            "checkpoint_saves": list(self.saves),
            "checkpoint_bytes": self.checkpoint_bytes,
        }


class PageView:
    """The service as the status page's `PageSource`."""

    def __init__(self, service: OrchestratorService):
        self.service = service

    def info(self) -> dict:
        return self.service.info()

    def queue(self) -> list[dict]:
        return self.service.queue(include_finished=True)

    def job(self, job_id: str) -> dict | None:
        try:
            view = self.service.status(job_id)
        except KeyError:
            return None
        view["checkpoints"] = self.service.checkpoints(job_id)
        return view

    def metrics(self, job_id: str, since_step: int) -> list[dict]:
        return self.service.metrics_since(job_id, since_step)


def _queue_order(job: JobRecord) -> tuple:
    active = 0 if job.state.holds_resources else 1
    return (active, -job.priority, job.submitted_at, job.id)


def service_options() -> dict:
    """How the service actor is created: detached and named, so it outlives the command that
    started it and every client finds it; restarted by Ray whenever it dies; no CPU of its own."""
    return dict(
        name=SERVICE_NAME,
        namespace=NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        num_cpus=0,
        max_restarts=-1,
        max_task_retries=-1,
        max_concurrency=64,
    )


ServiceActor = ray.remote(OrchestratorService)
