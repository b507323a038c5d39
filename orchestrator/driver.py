"""`orchestrator run` on Ray: the driver of one job.

With an orchestrator service on the cluster, the driver queues the job there (or attaches to
the record the service started it for, `--job-id`), waits until the service admits it, runs it
on the nodes the service counted, reports progress, forwards stop requests to the workers and
reports how the attempt ended; a preempted job goes back to waiting in the same driver and
resumes from the checkpoint it stopped at. Without a service it runs the job at once.

Printing, the metrics log in storage, signals and exit statuses live here; starting the
training run is `orchestrator.ray.launcher`'s job.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time

from core import records, storage
from core.jobs import TERMINAL_VALUES
from core.run_folder import run_name
from core.spec import JobSpec
from core.summary import print_summary, write_summary
from orchestrator.monitoring.terminal import Display
from orchestrator.ray import cluster, launcher
from orchestrator.ray.run_state import (
    CheckpointSaved,
    RankRecord,
    Records,
    Rewound,
    RunStarted,
    WorkerFailed,
    WorkersStarted,
)
from orchestrator.scheduler import client as service_client

POLL_S = 1.0  # progress lines once a second; each poll is an actor call
REPORT_S = 2.0  # progress to the service
REPORT_RECORDS = 500  # the newest records a report carries to the service (its status page)
EXIT = {"succeeded": 0, "stopped_early": 0, "failed": 1, "stopped": 1}


class Stopped(Exception):
    """SIGTERM, e.g. from `ray job stop`: leave through ray.shutdown(), not mid-C++."""


def _raise_stopped(signum, frame):
    raise Stopped()


def run(
    spec: JobSpec, address: str | None = None, summary_path: str | None = None, job_id: str | None = None
) -> int:
    if "://" not in spec.checkpoint.storage:  # workers run in other directories
        spec.checkpoint.storage = os.path.abspath(os.path.expanduser(spec.checkpoint.storage))
    tag = f"[{spec.name}]"
    try:
        address = cluster.driver_address(address)
        needed_cpus = math.ceil(spec.resources.num_workers * spec.resources.cpus_per_worker)
        with cluster.connect(address, num_cpus=needed_cpus) as where:
            # after connecting: a local Ray this process starts keeps its own priority
            cluster.yield_to_training()
            if threading.current_thread() is threading.main_thread():
                # after ray.init, whose own SIGTERM handler would end the process mid-C++
                signal.signal(signal.SIGTERM, _raise_stopped)
            service = service_client.find() if address else None
            if service is None and job_id:
                raise cluster.ClusterError(f"--job-id {job_id}: no orchestrator service on {where}")
            with Display() as display:
                if service is None:
                    run = run_name(spec)
                    _preflight(spec, storage.join(spec.checkpoint.storage, run))
                    _check_resources(spec, local=address is None)
                    display.event(
                        spec.name,
                        f"{spec.resources.num_workers} worker(s) on {where}; checkpoints in "
                        f"{storage.join(spec.checkpoint.storage, run)}",
                    )
                    summary = Attempt(spec, run, None, display).run()
                else:
                    queued = QueuedJob(spec, service, job_id, display)
                    queued.preflight()
                    summary = queued.run()
    except (cluster.ClusterError, service_client.ServiceError, OSError) as err:
        print(f"error: {spec.name}: {err}", file=sys.stderr, flush=True)
        return 1
    except Stopped:
        print(
            f"error: {spec.name}: stopped (SIGTERM); its checkpoints stay in storage",
            file=sys.stderr,
            flush=True,
        )
        return 128 + signal.SIGTERM
    write_summary(summary, summary_path)
    if summary.get("steps") is not None:
        print_summary(summary)
    if summary.get("restarts"):
        print(f"{tag} restarts: {summary['restarts']} (resumed from checkpoints)", flush=True)
    if summary["status"] == "failed":
        print(f"error: {spec.name}: {summary['reason']}", file=sys.stderr, flush=True)
    return EXIT.get(summary["status"], 1)


def _preflight(spec: JobSpec, run_uri: str) -> None:
    """Fail before any worker starts when storage is unusable (the message names the URI) or the
    data is not where the job runs."""
    storage.check_writable(run_uri)
    resume = spec.checkpoint.resume
    if resume not in ("auto", "never"):
        try:
            found = storage.exists(resume)
        except Exception as err:
            raise OSError(f"checkpoint.resume: cannot read '{resume}': {err}") from None
        if not found:
            raise OSError(f"checkpoint.resume: no checkpoint at '{resume}'")
    from workers.checks import data_problems  # the data plane's registries

    problems = data_problems(spec)
    if problems:
        raise OSError(problems[0])


def _check_resources(spec: JobSpec, local: bool) -> None:
    import ray

    gpus = spec.resources.num_workers * spec.resources.gpus_per_worker
    have = ray.cluster_resources().get("GPU", 0)
    if gpus > have:
        text = f"resources: the job asks for {gpus:g} GPU(s) and the cluster has {have:g}"
        if local:
            raise cluster.ClusterError(text + "; set resources.gpus_per_worker=0 to train on CPUs")
        print(f"[{spec.name}] warning: {text}; waiting for the autoscaler", flush=True)


class Attempt:
    """One training run: started, watched (progress, the metrics log in storage, reports to the
    service), stopped on request, summarised."""

    def __init__(
        self,
        spec: JobSpec,
        run: str,
        placement: dict[str, int] | None,
        display: Display,
        queued: QueuedJob | None = None,
    ):
        from workers.run_log import RunLog  # the metrics log in storage (and TensorBoard's files)

        self.spec, self.run_name, self.placement, self.queued = spec, run, placement, queued
        self.display, self.name = display, spec.name
        self.log = RunLog(storage.join(spec.checkpoint.storage, run), tensorboard=spec.metrics.tensorboard)
        self.last_report = 0.0
        self.last_step: int | None = None
        self.total_steps = spec.train.steps  # an epoch-based job learns it from its records
        self.last_checkpoint: str | None = None
        self.workers_started = False
        self.restarts = 0
        self.step_times: list[tuple[float, int]] = []  # (time, step): newest record of recent polls
        self.unreported: list[dict] = []  # records the service has not seen yet
        self.rewound = False  # the log was rewound since the last report
        self.stop_sent: str | None = None
        self.ranks: dict[int, dict] = {}  # the newest record of each rank but 0

    def run(self) -> dict:
        handle = launcher.start(self.spec, self.run_name, self.placement)
        try:
            while handle.running:
                handle.join(POLL_S)
                self._poll(handle)
            self._poll(handle, final=True)
        finally:
            self.log.close()
        return launcher.summary(handle, self.last_step, self.last_checkpoint)

    def _poll(self, handle: launcher.RunHandle, final: bool = False) -> None:
        for event in handle.events():
            if isinstance(event, Rewound):
                self.log.rewind(event.records)
                self.unreported, self.rewound = list(event.records[-REPORT_RECORDS:]), True
            elif isinstance(event, Records):
                self.log.append(event.records)
                self.unreported = (self.unreported + event.records)[-REPORT_RECORDS:]
            elif isinstance(event, RankRecord):
                self.ranks[event.rank] = event.record
            elif isinstance(event, WorkersStarted):
                self.ranks = {}  # a new worker group
            self._show(event)
        if final:
            self.log.flush()
        if self.queued is not None and (final or time.time() - self.last_report > REPORT_S):
            stop = self.queued.report(
                {**self.progress(), "records": self.unreported, "rewound": self.rewound, "ranks": self.ranks}
            )
            self.unreported, self.rewound = [], False
            self.last_report = time.time()
            if stop and stop != self.stop_sent and not final:
                handle.request_stop(stop)
                self.stop_sent = stop
                what = "preemption" if stop == "preempt" else "stop"
                self.display.event(self.name, f"{what} requested: the workers checkpoint and stop")
                self.display.update(self.name, state="stopping")

    def progress(self) -> dict:
        step_time = None
        if len(self.step_times) >= 2:
            (t0, s0), (t1, s1) = self.step_times[0], self.step_times[-1]
            step_time = (t1 - t0) / (s1 - s0) if s1 > s0 else None
        return {
            "step": self.last_step,
            "total_steps": self.total_steps,
            "step_time_s": step_time,
            "checkpoint": self.last_checkpoint,
            "workers_started": self.workers_started,
            "restarts": self.restarts,
        }

    def _show(self, event) -> None:
        say = lambda text: self.display.event(self.name, text)  # noqa: E731
        if isinstance(event, WorkersStarted):
            self.workers_started, self.restarts = True, event.attempt
            who = ", ".join(f"rank {rank} pid {w['pid']} on {w['node']}" for rank, w in event.members.items())
            say(f"{'workers' if event.attempt == 0 else f'restart {event.attempt}: workers'}: {who}")
            self.display.update(self.name, state="running", total=self.spec.train.steps)
        elif isinstance(event, RunStarted):
            for skipped in event.skipped:
                say(f"skipped {skipped['checkpoint']}: {skipped['reason']}")
            if event.attempt:
                say(
                    f"restarted from the checkpoint at step {event.step}"
                    if event.step
                    else "restarted from scratch (no checkpoint yet)"
                )
            elif event.step:
                say(f"resuming at step {event.step}")
            self.last_step = event.step
        elif isinstance(event, CheckpointSaved):
            self.last_checkpoint = event.uri
            say(f"checkpoint at step {event.step}: {event.uri}")
        elif isinstance(event, WorkerFailed):
            say(f"rank {event.rank} failed: {event.reason}")
        elif isinstance(event, Records):
            # every evaluation gets its line; of the training records, the newest is what shows
            newest = None
            for r in event.records:
                if records.is_train(r):
                    newest = r
                else:
                    self._show_record(r)
            if newest is not None:
                self._show_record(newest)

    def _show_record(self, r: dict) -> None:
        step = r.get("step")
        self.last_step = step
        if not records.is_train(r):
            self.display.event(self.name, f"eval at step {step}: {records.format_eval(r)}")
            return
        self.step_times = (self.step_times + [(r.get("time", time.time()), step)])[-20:]
        total = self.total_steps = r.get("total_steps") or self.total_steps
        rate, unit = (
            (r["tokens_per_s"], "tokens/s")
            if r.get("tokens_per_s")
            else (r.get("samples_per_s", 0), "samples/s")
        )
        eta = None
        if total and len(self.step_times) >= 2 and self.progress()["step_time_s"]:
            eta = (total - step) * self.progress()["step_time_s"]
        self.display.progress(
            self.name,
            f"step {step}{f'/{total}' if total else ''}  loss {r['loss']:.4f}  "
            f"{r.get('samples_per_s', 0):,.0f} samples/s  lr {r.get('lr', 0):.2e}",
            state="running",
            step=step,
            total=total,
            loss=r["loss"],
            rate=rate,
            rate_unit=unit,
            eta_s=eta,
        )


class QueuedJob:
    """A job run through the orchestrator service: queued, admitted, run, maybe preempted and
    run again, until it ends."""

    WAIT_S = 1.0

    def __init__(self, spec: JobSpec, service, job_id: str | None, display: Display):
        self.spec, self.service, self.display, self.name = spec, service, display, spec.name
        submission = service_client.own_submission_id()
        if job_id:
            view = service_client.call(service.attach, job_id, submission)
        else:
            view = service_client.call(
                service.register,
                spec,
                {"submission_id": submission},
                service_client.package_if_in_ray_job(),
            )
        self.job_id, self.run_id, self.attempt = view["id"], view["run"], view["attempt"]
        display.event(
            self.name,
            f"queued as {self.job_id} (priority {view['priority']}); checkpoints in "
            f"{storage.join(spec.checkpoint.storage, self.run_id)}",
        )
        display.update(self.name, state="queued", total=spec.train.steps)

    def preflight(self) -> None:
        """Storage and data checks; a failure no retry can mend fails the job in the queue at
        once, with the real reason (not a retried start)."""
        try:
            _preflight(self.spec, storage.join(self.spec.checkpoint.storage, self.run_id))
        except OSError as err:
            service_client.call(self.service.fail, self.job_id, str(err).splitlines()[0])
            raise

    def run(self) -> dict:
        while True:
            admitted = self._wait_admission()
            if admitted is None:  # stopped while queued
                self.display.update(self.name, state="stopped")
                return {
                    "job": self.spec.name,
                    "run": self.run_id,
                    "status": "stopped",
                    "steps": None,
                    "reason": "stopped while queued",
                    "samples_per_s": 0.0,
                    "checkpoint": None,
                }
            self.attempt = admitted["attempt"]
            spec = self.spec
            if self.attempt > 1:  # a later admission continues the job's own checkpoints
                spec = spec.model_copy(deep=True)
                spec.checkpoint.resume = "auto"
            self.display.event(
                self.name,
                f"admitted (attempt {self.attempt}): {spec.resources.num_workers} "
                f"worker(s) on {len(admitted['placement'])} node(s)",
            )
            self.display.update(self.name, state="admitted", note=None)
            summary = Attempt(spec, self.run_id, admitted["placement"], self.display, queued=self).run()
            status = summary["status"]
            outcome = {"stopped_early": "succeeded"}.get(status, status)
            service_client.call(self.service.finished, self.job_id, self.attempt, outcome, summary)
            self.display.update(self.name, state=outcome)
            if outcome != "preempted":
                summary["job_id"] = self.job_id
                return summary
            self.display.event(
                self.name,
                f"preempted at step {summary.get('steps')}: back in the queue; it "
                f"resumes from {summary.get('checkpoint')}",
            )

    def _wait_admission(self) -> dict | None:
        shown = None
        while True:
            state = service_client.call(self.service.admission, self.job_id)
            if state["state"] == "admitted":
                return state
            if state["state"] in TERMINAL_VALUES:
                return None
            line = state.get("note") or (
                f"queued behind {state['ahead']} job(s)" if state["ahead"] else "queued"
            )
            if line != shown:
                self.display.event(self.name, line)
                self.display.update(self.name, state=state["state"], note=line)
                shown = line
            time.sleep(self.WAIT_S)

    def report(self, progress: dict) -> str | None:
        try:
            reply = service_client.call(self.service.report, self.job_id, self.attempt, progress, retries=1)
        except service_client.ServiceError:
            return None  # the service is restarting: keep training, report again later
        return reply.get("stop")
