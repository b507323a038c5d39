"""The orchestrator service: one detached, named Ray actor per cluster that owns the queue.

    CLI (submit, queue, stop, preempt, status)  --actor calls-->  OrchestratorService (this file)
    a job's driver (`orchestrator run`)         --actor calls-->    |  SchedulingCycle (cycle.py)
                                                                    |  Policy (policy/policy.py, pure)
                                                                    |  Lifecycle (lifecycle.py)
                                                                    |  Store (store.py: job files)
                                                                    |  JobTable (table.py: jobs by state)
                                                                    |  AttemptRunner (attempt controllers)
                                                                    |  progress.py (drivers' reports)
                                                                    |  Health (health.py: hangs, stragglers)
                                                                    |  Views (views.py: what is shown)
                                                                    |  MlflowCatchUp (ended jobs' MLflow runs)

This file is the service's surface: the calls the CLI and the drivers make, each under one
lock (the reads are in `read_calls.py`, the queue configuration in `queue_calls.py`, the calls
about people in `tenant_calls.py`). A scheduling pass (`cycle.py`) runs every `tick_s` on a
thread of the actor; every change of a job's state goes through `lifecycle.py`, which checks
it against the table in `core/jobs.py` and writes it to the store before anything else learns
of it, so a restarted service (Ray restarts the actor; a new one can start elsewhere) reloads
the queue and carries on.

The drivers do the rest: a driver polls `admission` until its job is admitted (with the
nodes the service counted), runs the job there, reports progress (and learns of stop
requests in the reply), and reports how its attempt ended. A preempted driver goes back to
waiting; a job whose driver died is started again from its package by the service.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import ray

from core import storage
from core.jobs import JobState
from core.spec import JobSpec, SpecError, validate
from orchestrator.client import NAMESPACE, SERVICE_NAME
from orchestrator.monitoring.page_view import serve_page
from orchestrator.policy.permissions import Action
from orchestrator.service.access import ACTOR, DRIVER, HTTP
from orchestrator.service.cluster_access import ClusterAccess, of_ray
from orchestrator.service.cycle import SchedulingCycle, request
from orchestrator.service.health import Health, Watchdog
from orchestrator.service.lifecycle import Lifecycle
from orchestrator.service.live import LiveMetrics
from orchestrator.service.mlflow_catchup import MlflowCatchUp
from orchestrator.service.progress import RECORD, STEP, fold
from orchestrator.service.queue_calls import QueueCalls
from orchestrator.service.read_calls import ReadCalls
from orchestrator.service.sent_spec import (
    SentSpec,
    checked,
    queue_items,
    read_sent,
    resume_note,
    storage_problem,
)
from orchestrator.service.store import JobRecord, Store, find
from orchestrator.service.submission import new_job_id, new_record, storage_refusal, store_package
from orchestrator.service.tenant_calls import TenantCalls, open_door
from orchestrator.service.views import Views

HEAD_RESOURCE = "node:__internal_head__"

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
    # the longest a failed attempt is held while the service finds out whether a node of its is
    # dead (it probes them; docs/cluster.md); None: as long as the cluster's own health checks
    # may take to declare a node dead (orchestrator/ray/node_health.py)
    node_loss_wait_s: float | None = None
    grow_after_s: float = 120.0  # an elastic job runs this long at one size before it may grow
    move_after_s: float = 600.0  # a preemptible job runs this long before it may move for room
    autoscaler: dict | None = None  # node types an autoscaler may add (orchestrator/ray/autoscaler.py)
    # local paths every node mounts (NFS): checkpoints may go there on a cluster of many nodes
    shared_storage: list[str] = field(default_factory=list)
    quotas: dict[str, dict[str, float]] = field(default_factory=dict)
    backfill: bool = True
    preemption: bool = True
    web_host: str = "127.0.0.1"  # the status page and /metrics; 0.0.0.0 to reach them from elsewhere
    web_port: int = 8266  # 0: any free port (its URL is in `info()`)
    # a call without a token is the local admin while the page listens on loopback only (the
    # quick start needs no login); False: every call needs a token (a shared head node)
    single_user: bool = True


class OrchestratorService(QueueCalls, ReadCalls, TenantCalls):
    """Use through `ray.remote(...)` (see `service_options`); every method is safe to retry.

    The calls people make take the caller's token last (`token`; the user calls and `audit`
    take it first) and go through `self.door` (`access.py`): none is the Ray token's holder,
    the cluster's admin. The drivers' calls (attach, admission, report, finished, fail) are
    the cluster's own: only a holder of the Ray token reaches them."""

    def __init__(self, config: dict, cluster: ClusterAccess | None = None):
        """`cluster`: what the service takes from its Ray cluster (default: the one this actor
        runs on)."""
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
        self.config = ServiceConfig(**config)
        cluster = cluster or of_ray(self.config.dashboard, self.config.autoscaler)
        store = Store(self.config.store)
        self.owner = cluster.owner
        self.generation = store.acquire_lease(self.owner)
        self.lifecycle = Lifecycle(store, cluster.runner, self.config, self.generation)
        self.store, self.jobs = store, self.lifecycle.jobs
        self.policy = self._startup_policy()
        self.health_checks = cluster.health_checks
        if self.config.node_loss_wait_s is None:
            self.config.node_loss_wait_s = self.health_checks.declare_dead_s
        log.info("the cluster's health checks: %s", self.health_checks.describe())
        self.cycle = SchedulingCycle(self.lifecycle, self.policy, self.config, cluster)
        self.started_at = time.time()
        self.last_pass_s = 0.0
        self.lock = threading.RLock()
        self.live: dict[str, LiveMetrics] = {}  # newest metrics of the jobs that report (memory only)
        self.watchdog = Watchdog()  # hangs and stragglers of the running jobs (memory only)
        self._closing = threading.Event()
        self._wake = threading.Event()  # a submission schedules at once, not at the next tick
        self.mlflow = MlflowCatchUp(self.jobs, self.lock, self._closing)  # ended jobs' MLflow runs
        self.token = cluster.token  # the Ray cluster's: over HTTP too, its holder is the admin
        self.door = open_door(self.config, self.token)
        self.health = Health(
            self.lifecycle, self.cycle, self.watchdog, self.lock, self.config.dashboard, self.token
        )
        self.views = Views(self.jobs, self.live, self.watchdog, self.cycle)
        self.page, self.page_url = self._serve_page()
        log.info(
            "orchestrator service generation %d: %d jobs in %s",
            self.generation,
            len(self.jobs),
            self.config.store,
        )
        threading.Thread(target=self._loop, name="scheduling", daemon=True).start()
        self.mlflow.start()

    def _new_record(self, spec: JobSpec, options: dict, launched_by: str) -> JobRecord:
        job_id = options.get("job_id")
        while not job_id or (job_id in self.jobs and not options.get("job_id")):
            job_id = new_job_id(spec.name)  # 4 hex digits a second: a busy second draws again
        if job_id in self.jobs:
            raise ValueError(f"there is already a job '{job_id}' in the queue")
        job = new_record(spec, job_id, options, launched_by)
        self.cycle.refresh_nodes()  # judged against the cluster as it is now, not at the last pass
        refusal = self.policy.rejection_reason(request(job)) if self.nodes else None
        if refusal:
            raise ValueError(f"{refusal}; lower resources.num_workers or the per-worker resources")
        nodes = max(len(self.nodes), len(self.policy.possible))  # the autoscaler's too
        refusal = storage_refusal(spec, self.config.shared_storage, nodes)
        if refusal:
            raise ValueError(refusal)
        self.jobs[job.id] = job
        return job

    @property
    def nodes(self):
        return self.cycle.nodes

    def _serve_page(self):
        """The status page and the HTTP API. Asked for any free port (0), the service takes the
        one an earlier instance of it took, while it is free: a service Ray restarted is then
        where `orchestrator up` recorded it, and the CLI (and a user with only a token of its
        own) still reaches it."""
        host, port = self.config.web_host, self.config.web_port
        kept = self.store.page_port() if port == 0 else None
        page, url = serve_page(self, host, kept or port)
        if page is None and kept:  # taken meanwhile
            page, url = serve_page(self, host, 0)
        if page is not None and port == 0:
            self.store.keep_page_port(int(url.rstrip("/").rsplit(":", 1)[1]))
        return page, url

    # -- the scheduling loop ------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._closing.is_set():
            try:
                self.tick()
            except Exception:  # one bad pass must not end scheduling
                log.exception("scheduling pass failed")
            # a pass holds the lock: the calls it kept waiting get as long again before a
            # submission's wake starts the next one (else a burst of submissions is a pass each)
            self._closing.wait(min(self.last_pass_s, self.config.tick_s))
            self._wake.wait(self.config.tick_s)
            self._wake.clear()

    def tick(self, now: float | None = None) -> None:
        started = time.perf_counter()
        with self.lock:
            now = time.time() if now is None else now
            self.store.renew_lease(self.owner, self.generation, now)
            self.cycle.run(now)
            self.health.check_hangs(now)
        self.last_pass_s = time.perf_counter() - started

    # -- submitting ----------------------------------------------------------------------------

    def submit(
        self,
        spec: JobSpec,
        options: dict | None = None,
        package: bytes | None = None,
        token: str | None = None,
        route: str = ACTOR,
    ) -> dict:
        """Queue a spec checked at submission (`submit_sent` reads and checks one); `package`
        is the zipped project directory the job runs in. Options: priority, job_id, sweep
        fields, came_in_by (the Ray Job it came in by). Returns the job's view. Its owner is
        the user and team of `token`, whatever the options say."""
        target = self.queue_target(spec.scheduling.queue)
        with self.lock, self.door.acting(token, route, Action.SUBMIT, target, name=spec.name) as owner:
            owned = {**(options or {}), "user": owner.user, "team": owner.team}
            job = self._new_record(spec, owned, "service")
            job.came_in_by = owned.get("came_in_by")
            job.package = store_package(self.store, job.id, package, spec)
            self.lifecycle.save(job)
            view = self._view(job)
        self._wake.set()
        return view

    def submit_sent(
        self,
        sent: dict,
        package: bytes | None,
        token: str | None = None,
        route: str = HTTP,
        came_in_by: str | None = None,
    ) -> dict:
        """The one way in: a spec file as its caller read it (`sent_spec.py`: its text, the
        overrides, where the user stood), from `orchestrator submit` (over HTTP, or as an
        actor call) and from `orchestrator run` on a cluster (a terminal, or the driver of a
        `ray job submit`, which it `came_in_by`). Read and checked here, as `validate` does,
        its relative storage made absolute, its storage probed, and queued:
        {"jobs": views, "sweep": name or None, "notes": lines to show}. ValueError with the
        lines a person acts on (a spec error names its field)."""
        self.door.authenticate(token, route, Action.SUBMIT)  # an unknown caller: 401, logged
        given = SentSpec.from_body(sent)
        try:
            spec = read_sent(given)
        except SpecError as err:
            raise ValueError(str(err)) from None
        specs, options = queue_items(spec, given.cwd or None, given.home)
        views = self._queue(specs, options, package, token, route, came_in_by, given.check_storage)
        sweep = spec.name if spec.sweep is not None else None
        notes = [note for note in [resume_note(spec) if spec.sweep is None else None] if note]
        return {"jobs": views, "sweep": sweep, "notes": notes}

    def submit_specs(
        self, specs: list[dict], options: list[dict], package: bytes | None, token: str | None = None
    ) -> list[dict]:
        """Specs as JSON (`POST /api/jobs` with `specs`, for a client that builds them itself):
        checked against the schema and the registries, then queued as `submit_sent` queues."""
        self.door.authenticate(token, HTTP, Action.SUBMIT)  # an unknown caller: 401, logged
        try:
            typed = [checked(validate(raw, "submitted spec")) for raw in specs]
        except SpecError as err:
            raise ValueError(str(err).splitlines()[0]) from None
        return self._queue(typed, options, package, token, HTTP)

    def register(self, spec: JobSpec, options: dict | None = None, package: bytes | None = None) -> dict:
        """A checked spec queued by a driver of the cluster (the Ray token's holder, its
        admin): `submit` on the driver's route. Options as `submit`'s; `submission_id`: the
        Ray Job it came in by."""
        options = {**(options or {}), "came_in_by": (options or {}).get("submission_id")}
        return self.submit(spec, options, package, None, DRIVER)

    def _queue(
        self,
        specs: list[JobSpec],
        options: list[dict],
        package: bytes | None,
        token: str | None,
        route: str,
        came_in_by: str | None = None,
        check_storage: bool = True,
    ) -> list[dict]:
        """The checks every submission gets before it is queued: the caller may use the queue
        (else its storage is not probed: a refused request learns nothing), and every job's
        storage takes a checkpoint (probed outside the lock: storage may be slow to answer),
        unless the caller says only the job's nodes reach it (its attempt checks it there)."""
        queues = {spec.scheduling.queue for spec in specs}
        allowed = all(
            self.door.verdict(token, route, Action.SUBMIT, self.queue_target(q)).allowed for q in queues
        )
        if allowed and check_storage:
            for uri, name in dict.fromkeys((spec.checkpoint.storage, spec.name) for spec in specs):
                problem = storage_problem(name, uri) if storage.is_absolute(uri) else None
                if problem:
                    raise ValueError(problem)
        options = [{**option, "came_in_by": came_in_by} for option in options]
        return [self.submit(s, o, package, token, route) for s, o in zip(specs, options, strict=True)]

    # -- the drivers ---------------------------------------------------------------------------

    def attach(self, job_id: str, submission_id: str | None = None) -> dict:
        """The attempt controller the service started for `job_id` is up."""
        with self.lock:
            job = self._job(job_id)
            job.submission_id = submission_id or job.submission_id
            job.last_seen = time.time()
            self.lifecycle.save(job)
            return self._view(job)

    def admission(self, job_id: str) -> dict:
        """For a waiting driver: {"state", "attempt", "placement", "note", "position"}."""
        with self.lock:
            job = self._job(job_id)
            job.last_seen = time.time()
            mine = (job.priority, -job.submitted_at)
            ahead = sum(1 for j in self.jobs.pending() if (j.priority, -j.submitted_at) > mine)
            return {
                "state": job.state.value,
                "attempt": job.attempt,
                "placement": dict(job.placement),
                "note": self.cycle.notes.get(job.id),
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
            changed = fold(job, progress, live, self.watchdog)
            if self.health.stragglers(job, time.time()):  # may ask it to stop
                changed = RECORD
            if progress.get("workers_started") and job.state is JobState.ADMITTED:
                self.lifecycle.mark_running(job, attempt)  # saves
            elif changed == RECORD:
                self.lifecycle.save(job)
            elif changed == STEP:  # the store is the truth of states and checkpoints, not of steps
                self.lifecycle.save_progress(job)
            if progress.get("replica_groups") is not None:
                self.lifecycle.groups_reported(job, progress["replica_groups"], time.time())
            reply = {"stop": job.stop_requested}
            if job.group_placements:  # where each replica group runs: a lost one, placed again
                reply["groups"] = job.group_placements
            return reply

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
            lost = self.cycle.lost_nodes(job) if outcome == "failed" else {}  # else every rank finished
            nodes = list(job.placement)
            self.lifecycle.attempt_ended(job, outcome, summary, lost, now)
            if job.unconfirmed_failure:  # no job lands on its nodes until each has answered a probe
                self.cycle.watch.doubt(nodes, now)
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

    def stop(self, job_id: str, now: bool = False, token: str | None = None, route: str = ACTOR) -> dict:
        """Checkpoint and stop a job (a queued one just leaves the queue); `now`: kill it."""
        with self.lock, self.door.acting(token, route, Action.STOP, lambda: self.job_target(job_id), now=now):
            job = self._job(job_id)
            self.lifecycle.stop(job, time.time(), at_once=now)
            return self._view(job)

    def preempt(self, job_id: str, token: str | None = None, route: str = ACTOR) -> dict:
        """Checkpoint a running job and put it back in the queue."""
        with self.lock, self.door.acting(token, route, Action.PREEMPT, lambda: self.job_target(job_id)):
            job = self._job(job_id)
            if not job.state.holds_resources:
                raise ValueError(f"{job_id} is {job.state.value}: only a running job can be preempted")
            self.lifecycle.request_stop(job, "preempt", time.time(), by="request")
            return self._view(job)

    def shutdown(self) -> None:
        """Stop scheduling and give the lease back (`orchestrator down`)."""
        self._closing.set()
        self._wake.set()
        if self.page is not None:
            self.page.stop()
        with self.lock:
            self.store.release_lease(self.owner)

    # -- helpers -------------------------------------------------------------------------------

    def _job(self, job_id: str) -> JobRecord:
        job = find(self.jobs, job_id)
        if job is None:
            raise KeyError(f"no job '{job_id}' in the queue; `orchestrator queue --all` lists them")
        return job

    def _view(self, job: JobRecord, history: bool = True) -> dict[str, Any]:
        view = self.views.job(job, history)
        waiting = self.mlflow.note(job.id)
        if waiting:
            view["mlflow"] = waiting  # records its MLflow run still lacks
        return view


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
