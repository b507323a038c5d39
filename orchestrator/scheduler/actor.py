"""The orchestrator service: one detached, named Ray actor per cluster that owns the queue.

    CLI (submit, queue, stop, preempt, status)  --actor calls-->  OrchestratorService (this file)
    a job's driver (`orchestrator run`)         --actor calls-->    |  SchedulingCycle (cycle.py)
                                                                    |  Policy (policy.py, pure)
                                                                    |  Lifecycle (lifecycle.py)
                                                                    |  Store (store.py: job files)
                                                                    |  JobRunner (Ray Jobs API)

This file is the service's surface: the calls the CLI and the drivers make, each under one
lock. A scheduling pass (`cycle.py`) runs every `tick_s` on a thread of the actor; every change
of a job's state goes through `lifecycle.py`, which checks it against the table in
`core/jobs.py` and writes it to the store before anything else learns of it, so a restarted
service (Ray restarts the actor; a new one can start elsewhere) reloads the queue and carries on.

The drivers do the rest: a driver polls `admission` until its job is admitted (with the
nodes the service counted), runs the job there, reports progress (and learns of stop
requests in the reply), and reports how its attempt ended. A preempted driver goes back to
waiting; a job whose driver died is started again from its package by the service.
"""

from __future__ import annotations

import functools
import logging
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import ray

from core import metrics_log, run_folder, storage
from core.jobs import JobState
from core.ledger import cluster_goodput
from core.queues import QueueConfig, validate_queue_config
from core.records import STEP
from core.run_folder import checkpoint_step
from core.spec import JobSpec, SpecError, validate
from orchestrator.monitoring.exporter import registry_for
from orchestrator.monitoring.page_view import PageView, process_info
from orchestrator.monitoring.web import make_app, serve
from orchestrator.ray.autoscaler import detected_config
from orchestrator.ray.cluster import read_token
from orchestrator.scheduler import stacks
from orchestrator.scheduler.admission import add, scale
from orchestrator.scheduler.cohorts import CohortBook
from orchestrator.scheduler.cycle import SchedulingCycle, allocation, request
from orchestrator.scheduler.lifecycle import Lifecycle
from orchestrator.scheduler.live import LiveMetrics
from orchestrator.scheduler.policy import Policy
from orchestrator.scheduler.runner import JobRunner, submission_id
from orchestrator.scheduler.store import JobRecord, Store
from orchestrator.scheduler.submission import new_job_id, new_record, unpack
from orchestrator.scheduler.watchdog import Watchdog

SERVICE_NAME = "orchestrator"
HEAD_RESOURCE = "node:__internal_head__"
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
    # a failed attempt is held this long before the job fails, in case Ray declares one of its
    # nodes dead meanwhile (then it is requeued): Ray's health check period x failure threshold
    node_loss_wait_s: float = 8.0
    grow_after_s: float = 120.0  # an elastic job runs this long at one size before it may grow
    autoscaler: dict | None = None  # node types an autoscaler may add (orchestrator/ray/autoscaler.py)
    quotas: dict[str, dict[str, float]] = field(default_factory=dict)
    backfill: bool = True
    preemption: bool = True
    web_host: str = "127.0.0.1"  # the status page and /metrics; 0.0.0.0 to reach them from elsewhere
    web_port: int = 8266  # 0: any free port (its URL is in `info()`)


class OrchestratorService:
    """Use through `ray.remote(...)` (see `service_options`); every method is safe to retry."""

    def __init__(self, config: dict):
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
        self.config = ServiceConfig(**config)
        store = Store(self.config.store)
        self.owner = ray.get_runtime_context().get_actor_id() or f"service-{secrets.token_hex(4)}"
        self.generation = store.acquire_lease(self.owner)
        self.lifecycle = Lifecycle(store, JobRunner(self.config.dashboard), self.config, self.generation)
        self.store, self.jobs = store, self.lifecycle.jobs
        self.policy = self._startup_policy()
        # on the head, beside its cluster's monitor
        autoscaler = self.config.autoscaler or detected_config(ray.get_runtime_context().gcs_address)
        self.cycle = SchedulingCycle(self.lifecycle, self.policy, self.config, autoscaler)
        self.started_at = time.time()
        self.last_pass_s = 0.0
        self.lock = threading.RLock()
        self.live: dict[str, LiveMetrics] = {}  # newest metrics of the jobs that report (memory only)
        self.watchdog = Watchdog()  # hangs and stragglers of the running jobs (memory only)
        self._closing = threading.Event()
        self._wake = threading.Event()  # a submission schedules at once, not at the next tick
        self.token = read_token()  # jobs over HTTP (`POST /api/jobs`) must carry the cluster's token
        self.page, self.page_url = None, None
        try:
            self.page, self.page_url = serve(
                make_app(PageView(self), registry_for(self), submitter=self),
                self.config.web_host,
                self.config.web_port,
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

    def _policy(self, queues: QueueConfig | None) -> Policy:
        """The policy with `queues`; ValueError if a queue has both a --quota and an entry."""
        return Policy(
            [],
            quotas=self.config.quotas,
            backfill=self.config.backfill,
            preemption=self.config.preemption,
            grow_after_s=self.config.grow_after_s,
            queues=queues,
        )

    def _startup_policy(self) -> Policy:
        """With the queue configuration applied last (`queues apply`, or `up --queues`, which
        stores it before it starts the service), kept in the store: a restart applies it again."""
        stored = self.store.load_queues()
        if stored is None:
            return self._policy(None)
        try:  # written by `set_queues`: a load, but a newer schema or a new --quota may refuse it
            return self._policy(validate_queue_config(stored, "stored queues.json"))
        except (SpecError, ValueError) as err:
            log.error("the stored queue configuration is not applied: %s", str(err).splitlines()[0])
            return self._policy(None)

    def set_queues(self, queues: QueueConfig | None) -> dict:
        """Apply a queue configuration validated by the CLI (None: back to none) and store it
        for the next start. Refused (ValueError, nothing changed) when a queue has a --quota."""
        with self.lock:
            policy = self._policy(queues)
            policy.set_nodes(self.policy.nodes, self.policy.possible)
            self.store.save_queues(None if queues is None else queues.model_dump(mode="json"))
            self.policy = self.cycle.policy = policy
            log.info(
                "queue configuration %s",
                "cleared" if queues is None else f"of {len(queues.queues)} queue(s) applied",
            )
        self._wake.set()
        return self.queues_view()

    def queues_view(self) -> dict | None:
        """The queue configuration (as written: defaults left out) and each queue's use now
        (None: no configuration)."""
        with self.lock:
            config = self.policy.queue_config
            if config is None:
                return None
            running = [allocation(j) for j in self.jobs.values() if j.state.holds_resources]
            use = CohortBook(config, running).report()
            for name, queue in config.queues.items():
                if name not in use:  # a hard cap, or a queue with an order only
                    mine = [a for a in running if a.queue == name]
                    used = {r: sum(a.per_worker.get(r, 0.0) * a.workers for a in mine) for r in queue.nominal}
                    use[name] = {
                        "cohort": None,
                        "used": used,
                        "nominal": dict(queue.nominal),
                        "borrowed": {},
                        "lent": {},
                    }
                use[name]["order"] = queue.order
            return {"config": config.model_dump(mode="json", exclude_defaults=True), "use": use}

    def _new_record(self, spec: JobSpec, options: dict, launched_by: str) -> JobRecord:
        job_id = options.get("job_id") or new_job_id(spec.name)
        if job_id in self.jobs:
            raise ValueError(f"there is already a job '{job_id}' in the queue")
        job = new_record(spec, job_id, options, launched_by)
        self.cycle.refresh_nodes()  # judged against the cluster as it is now, not at the last pass
        refusal = self.policy.rejection_reason(request(job)) if self.nodes else None
        if refusal:
            raise ValueError(f"{refusal}; lower resources.num_workers or the per-worker resources")
        self.jobs[job.id] = job
        return job

    @property
    def nodes(self):
        return self.cycle.nodes

    @property
    def notes(self) -> dict[str, str]:
        return self.cycle.notes

    # -- the scheduling loop ------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._closing.is_set():
            try:
                self.tick()
            except Exception:  # one bad pass must not end scheduling
                log.exception("scheduling pass failed")
            self._wake.wait(self.config.tick_s)
            self._wake.clear()

    def tick(self, now: float | None = None) -> None:
        started = time.perf_counter()
        with self.lock:
            now = time.time() if now is None else now
            self.store.renew_lease(self.owner, self.generation, now)
            self.cycle.run(now)
            self._check_hangs(now)
        self.last_pass_s = time.perf_counter() - started

    # -- submitting ----------------------------------------------------------------------------

    def submit(self, spec: JobSpec, options: dict | None = None, package: bytes | None = None) -> dict:
        """Queue a spec validated at submission; `package` is the zipped project directory the
        job runs in. Options: priority, job_id, user, sweep. Returns the job's record."""
        options = options or {}
        with self.lock:
            job = self._new_record(spec, options, "service")
            job.package = unpack(self.store, job.id, package, spec)
            self.lifecycle.save(job)
            view = self._view(job)
        self._wake.set()
        return view

    def submit_specs(self, specs: list[dict], options: list[dict], package: bytes | None) -> list[dict]:
        """Jobs sent over HTTP (`POST /api/jobs`, the CLI's quick path): their specs are checked
        against the schema again, since anyone holding the token may send them."""
        try:
            typed = [validate(raw, "submitted spec") for raw in specs]
        except SpecError as err:
            raise ValueError(str(err).splitlines()[0]) from None
        return [self.submit(spec, option, package) for spec, option in zip(typed, options, strict=True)]

    def register(self, spec: JobSpec, options: dict | None = None, package: bytes | None = None) -> dict:
        """A driver started outside the service (`orchestrator run`, `ray job submit`) queues its
        job. Options: job_id, submission_id (its Ray Job, if any), priority."""
        options = options or {}
        with self.lock:
            if options.get("job_id") in self.jobs:  # a restarted driver of a known job
                job = self.jobs[options["job_id"]]
                return self._attach(job, options.get("submission_id"))
            job = self._new_record(spec, options, "driver")
            job.submission_id = options.get("submission_id")
            if package is not None:
                job.package = unpack(self.store, job.id, package, spec)
            job.last_seen = time.time()
            self.lifecycle.save(job)
            return self._view(job)

    # -- the drivers ---------------------------------------------------------------------------

    def attach(self, job_id: str, submission_id: str | None) -> dict:
        """The driver the service started for `job_id` is up."""
        with self.lock:
            return self._attach(self._job(job_id), submission_id)

    def _attach(self, job: JobRecord, submission_id: str | None) -> dict:
        job.submission_id = submission_id or job.submission_id
        job.last_seen = time.time()
        self.lifecycle.save(job)
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
            if attempt != job.attempt or not job.state.holds_resources or job.unconfirmed_failure:
                # requeued (a node of its died) or replaced: the attempt ends now, no checkpoint
                return {"stop": "abort", "reason": f"the job is {job.state.value} (attempt {job.attempt})"}
            live = self.live.setdefault(job_id, LiveMetrics())
            if progress.get("rewound"):
                live.clear()
            live.add(progress.get("records") or [])
            self._account(job, progress)
            self.watchdog.observe(job, progress, time.time())
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
            start = progress.get("start_step")
            if start and job.attempt == 1 and "resuming" not in (e["event"] for e in job.history):
                # a job run again under a name whose run has checkpoints continues that run
                job.log("resuming", run=job.run, step=start)
                changed = True
            changed = self._stragglers(job) or changed
            if progress.get("workers_started") and job.state is JobState.ADMITTED:
                self.lifecycle.mark_running(job, attempt)  # saves
            elif changed:
                self.lifecycle.save(job)
            return {"stop": job.stop_requested}

    def finished(self, job_id: str, attempt: int, outcome: str, summary: dict | None = None) -> dict:
        """How an attempt ended: succeeded, failed, stopped or preempted (then it is queued
        again, and the same driver waits for its next admission)."""
        with self.lock:
            job = self._job(job_id)
            now = time.time()
            summary = summary or {}
            if attempt != job.attempt or not job.state.holds_resources or job.unconfirmed_failure:
                # a late report of an attempt already accounted for: it knows its last step
                self.lifecycle.correct_node_loss(job, attempt, summary)
                return self._view(job)
            job.summary = summary
            if job.ledger is not None and summary.get("checkpoint"):
                job.ledger.checkpointed(checkpoint_step(summary["checkpoint"]))
            job.step = summary.get("steps") or job.step
            job.last_checkpoint = summary.get("checkpoint") or job.last_checkpoint
            lost = self.cycle.lost_nodes(job) if outcome == "failed" else []  # else every rank finished
            if lost:
                self.lifecycle.node_lost(job, lost, now)
            elif outcome == "failed" and summary.get("retryable"):
                self.lifecycle.hold_failure(job, summary, now)
            elif outcome == "preempted":
                self.lifecycle.preempted(job, now, acknowledged=True)
            elif outcome == "stopped":
                self.lifecycle.finish(job, JobState.STOPPED, now, reason=f"stopped at step {job.step}")
            elif outcome == "succeeded":
                self.lifecycle.finish(job, JobState.SUCCEEDED, now)
            else:
                self.lifecycle.finish(job, JobState.FAILED, now, reason=summary.get("reason") or outcome)
            return self._view(job)

    def fail(self, job_id: str, reason: str) -> dict:
        """The driver found a problem no retry mends (storage it cannot write, data that is not
        there): the job fails now, with that reason."""
        with self.lock:
            job = self._job(job_id)
            if not job.state.is_terminal:
                self.lifecycle.finish(job, JobState.FAILED, time.time(), reason=reason)
            return self._view(job)

    # -- the CLI ------------------------------------------------------------------------------

    def stop(self, job_id: str, now: bool = False) -> dict:
        """Checkpoint and stop a job (a queued one just leaves the queue); `now`: kill it."""
        with self.lock:
            job = self._job(job_id)
            t = time.time()
            if job.state.is_terminal:
                return self._view(job)
            runner = self.lifecycle.runner
            if job.state.is_pending:
                self.lifecycle.finish(job, JobState.STOPPED, t, reason="stopped while queued")
                if job.submission_id:  # a driver waiting for admission
                    runner.stop(job.submission_id)
            elif now:
                if job.submission_id:
                    runner.stop(job.submission_id)
                job.steps_lost += self.lifecycle.steps_since_checkpoint(job)
                self.lifecycle.finish(job, JobState.STOPPED, t, reason="stopped at once (--now)")
            else:
                self.lifecycle.request_stop(job, "stop", t)
            return self._view(job)

    def preempt(self, job_id: str) -> dict:
        """Checkpoint a running job and put it back in the queue."""
        with self.lock:
            job = self._job(job_id)
            if not job.state.holds_resources:
                raise ValueError(f"{job_id} is {job.state.value}: only a running job can be preempted")
            self.lifecycle.request_stop(job, "preempt", time.time(), by="request")
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
                "draining": sorted(self.cycle.draining),
                "node_events": list(self.cycle.node_events),
                # nodes the autoscaler may still add, by type, and what it was asked for (None: no autoscaler)
                "autoscaler": None
                if self.cycle.node_types is None
                else {"may_add": dict(self.cycle.scale_left), "asked_for": dict(self.cycle.scaling_for)},
                "jobs": counts,
                "goodput": self._cluster_goodput(time.time()),
                "queues": self.queues_view(),
                "last_pass_s": self.last_pass_s,
                "process": process_info(),  # the control plane never loads torch: see for yourself
            }

    def shutdown(self) -> None:
        """Stop scheduling and give the lease back (`orchestrator down`)."""
        self._closing.set()
        self._wake.set()
        if self.page is not None:
            self.page.stop()
        with self.lock:
            self.store.release_lease(self.owner)

    # -- monitoring ----------------------------------------------------------------------------

    def _total(self) -> dict[str, float]:
        return functools.reduce(add, (node.capacity for node in self.nodes), {})

    def _busy(self) -> dict[str, float]:
        held = (scale(j.per_worker, j.workers) for j in self.jobs.values() if j.state.holds_resources)
        return functools.reduce(add, held, {})

    def exporter_snapshot(self) -> dict[str, Any]:
        """What the Prometheus collector reads at each scrape (see monitoring/exporter.py)."""
        with self.lock:
            jobs = []
            for job in self.jobs.values():
                view = self._view(job, history=False)
                live = self.live.get(job.id)
                view.update(live.snapshot() if live else {})
                view["straggler_ratios"] = self.watchdog.ratios(job.id) if job.state.holds_resources else []
                watch = self.watchdog.watches.get(job.id) if job.state.holds_resources else None
                view["hung"] = bool(watch is not None and watch.clock.fired)  # until it steps again
                view["restarts"] = (live.restarts if live else 0) + sum(
                    1 for e in job.history if e["event"] == "driver-exited"
                )
                jobs.append(view)
            nodes = [{"id": n.id, "capacity": dict(n.capacity)} for n in self.nodes]
            return {
                "jobs": jobs,
                "nodes": nodes,
                "busy": self._busy(),
                "nodes_lost": self.cycle.nodes_lost,
                "goodput": self._cluster_goodput(time.time()),
            }

    def metrics_since(self, job_id: str, since_step: int) -> list[dict]:
        """A job's metrics records after `since_step`: from memory while it reports, else from its
        metrics log in storage."""
        with self.lock:
            job = self._job(job_id)
            live = self.live.get(job_id)
            if live is not None and live.records:
                return [r for r in live.records if r.get(STEP, 0) > since_step]
            run_uri = run_folder.run_uri(job.spec, job.run)
        try:
            return [r for r in metrics_log.read_metrics(run_uri) if r.get(STEP, 0) > since_step]
        except (FileNotFoundError, OSError):
            return []

    def checkpoints(self, job_id: str) -> list[str]:
        with self.lock:
            job = self._job(job_id)
            run_uri = run_folder.run_uri(job.spec, job.run)
        try:
            return run_folder.checkpoints(run_uri)
        except OSError:
            return []

    # -- hangs and stragglers (docs/monitoring.md) ----------------------------------------------

    def _check_hangs(self, now: float) -> None:
        """Running jobs without step progress for longer than their hang timeout: their stacks
        are taken and their ranks ended (Ray Train restarts them from the newest checkpoint)
        on a thread of their own, so that scheduling goes on meanwhile."""
        for job, watch, timeout in self.watchdog.hung(list(self.jobs.values()), now):
            stalled = watch.clock.stalled_s(now)
            log.warning(
                "%s: no step after %d for %.0f s (timeout %.0f s): hung", job.id, job.step, stalled, timeout
            )
            hang = dict(attempt=job.attempt, step=job.step, workers=dict(watch.workers), stalled_s=stalled)
            threading.Thread(
                target=self._on_hang, args=(job.id, hang, timeout), name=f"hang-{job.id}", daemon=True
            ).start()

    def _on_hang(self, job_id: str, hang: dict, timeout: float) -> None:
        with self.lock:
            job = self._job(job_id)
            run_uri = run_folder.run_uri(job.spec, job.run)
            folder = run_folder.hang_folder(run_uri, hang["attempt"], hang["step"])
        taken = stacks.stacks(self.config.dashboard, self.token, hang["workers"])
        try:
            fs, path = storage.resolve(folder)
            fs.create_dir(path, recursive=True)
            for rank, text in taken.items():
                with fs.open_output_stream(f"{path}/rank-{rank}.txt") as out:
                    out.write(text.encode())
        except OSError as err:
            log.error("%s: cannot save the stacks of its hang in %s: %s", job_id, folder, err)
        with self.lock:
            job = self._job(job_id)
            clock = self.watchdog.watches.get(job_id)
            if job.attempt != hang["attempt"] or job.state is not JobState.RUNNING or clock is None:
                return  # it ended or moved on meanwhile
            if clock.clock.step != hang["step"]:
                log.warning("%s stepped again while its stacks were taken: not restarted", job_id)
                return
            job.log(
                "hung",
                step=hang["step"],
                stalled_s=round(hang["stalled_s"], 1),
                timeout_s=round(timeout, 1),
                stacks=folder,
                ranks={str(rank): stacks.where(text) for rank, text in taken.items()},
            )
            self.lifecycle.save(job)
        try:
            stacks.kill(hang["workers"])
        except Exception as err:
            log.error("%s: cannot end its hung ranks: %s", job_id, err)

    def _stragglers(self, job: JobRecord) -> bool:
        """A `straggler` line in the job's history for each rank newly flagged (`on_straggler:
        warn`, the one action so far). Returns whether the job changed."""
        fresh = self.watchdog.new_stragglers(job.id)
        for s in fresh:
            log.warning(
                "%s: rank %d computes %.2fx the median rank's (node %s)",
                *(job.id, s["rank"], s["ratio"], s["node"]),
            )
            job.log("straggler", rank=s["rank"], node=s["node"], ip=s["ip"], ratio=round(s["ratio"], 3))
        return bool(fresh)

    # -- helpers -------------------------------------------------------------------------------

    def _mfu(self, job_id: str) -> float | None:
        live = self.live.get(job_id)
        return (live.latest or {}).get("mfu") if live is not None else None

    def _cluster_goodput(self, now: float, since: float | None = None) -> dict:
        """Goodput over the jobs in the table (those alive after `since`), each weighted by its
        accelerators (docs/monitoring.md)."""
        ledgers = [
            (job.ledger, self._mfu(job.id))
            for job in self.jobs.values()
            if job.ledger is not None and (since is None or (job.finished_at or now) >= since)
        ]
        return cluster_goodput(ledgers, now).as_dict()

    @staticmethod
    def _account(job: JobRecord, progress: dict) -> None:
        """A driver's report in the job's time ledger: the start of a run first (a resume below
        the newest step reached rolls training back), then the records, then a new checkpoint."""
        ledger, now = job.ledger, time.time()
        if ledger is None:
            return
        batch = progress.get("records") or []
        if int(progress.get("restarts") or 0):  # a worker group Ray Train restarted: a failure
            ledger.regrouped([job.attempt, int(progress["restarts"])], now)
        if progress.get("start_step") is not None:  # the run began before the records it sent
            times = [r["time"] for r in batch if isinstance(r.get("time"), (int, float))]
            run = [job.attempt, int(progress.get("restarts") or 0)]
            ledger.began(run, progress["start_step"], min([now, *times]))
        for record in batch:
            ledger.record(record, now)
        if progress.get("checkpoint") and progress["checkpoint"] != job.last_checkpoint:
            ledger.checkpointed(checkpoint_step(progress["checkpoint"]))

    def _job(self, job_id: str) -> JobRecord:
        job = self.jobs.get(job_id)
        if job is None:
            raise KeyError(f"no job '{job_id}' in the queue; `orchestrator queue --all` lists them")
        return job

    def _view(self, job: JobRecord, history: bool = True) -> dict[str, Any]:
        view = job.to_json()
        view.pop("spec")  # the typed spec stays here; views are plain JSON
        view["ledger"] = job.ledger.view(time.time(), self._mfu(job.id)) if job.ledger is not None else None
        if not history:
            view.pop("history")
        view["note"] = self.notes.get(job.id)
        view["stragglers"] = self.watchdog.stragglers(job.id) if job.state.holds_resources else []
        view["remaining_s"] = job.remaining_s
        view["waited_s"] = job.waited(time.time())
        res = job.spec.resources
        view["elastic"] = [res.min_workers, res.max_workers] if res.elastic else None
        # the Ray Job that runs it: a driver that waits through a preemption runs later attempts too
        view["submission"] = job.submission_id or (
            submission_id(job.id, job.attempt) if job.attempt else None
        )
        return view


def _queue_order(job: JobRecord) -> tuple:
    active = 0 if job.state.holds_resources else 1
    return (active, -job.priority, job.submitted_at, job.id)


def service_options() -> dict:
    """How the service actor is created: detached and named, so it outlives the command that
    started it and every client finds it; restarted by Ray whenever it dies; no CPU of its own;
    on the head node (Ray gives only the head `node:__internal_head__`), which outlives the
    worker nodes, so that losing one never moves the queue."""
    return dict(
        name=SERVICE_NAME,
        namespace=NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        num_cpus=0,
        resources={HEAD_RESOURCE: 0.001},
        max_restarts=-1,
        max_task_retries=-1,
        max_concurrency=64,
    )


ServiceActor = ray.remote(OrchestratorService)
