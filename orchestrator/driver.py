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

import json
import math
import os
import signal
import sys
import threading
import time

from orchestrator.checks import data_problems
from orchestrator.ray import cluster, launcher
from orchestrator.ray.run_state import (
    CheckpointSaved,
    MetricsLog,
    Records,
    RunStarted,
    WorkerFailed,
    WorkersStarted,
)
from orchestrator.scheduler import client as service_client
from orchestrator.spec import JobSpec
from workers import storage
from workers.context import run_name
from workers.run import print_summary, write_summary

POLL_S = 1.0  # progress lines once a second; each poll is an actor call
REPORT_S = 2.0  # progress to the service
REMOTE_METRICS_EVERY_S = 10.0  # rewriting an object per poll would be wasteful
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
            if threading.current_thread() is threading.main_thread():
                # after ray.init, whose own SIGTERM handler would end the process mid-C++
                signal.signal(signal.SIGTERM, _raise_stopped)
            service = service_client.find() if address else None
            if service is None and job_id:
                raise cluster.ClusterError(f"--job-id {job_id}: no orchestrator service on {where}")
            if service is None:
                run = run_name(spec)
                _preflight(spec, storage.join(spec.checkpoint.storage, run))
                _check_resources(spec, local=address is None)
                print(
                    f"{tag} {spec.resources.num_workers} worker(s) on {where}; checkpoints in "
                    f"{storage.join(spec.checkpoint.storage, run)}",
                    flush=True,
                )
                summary = Attempt(spec, run, None).run()
            else:
                _preflight(spec, storage.join(spec.checkpoint.storage, spec.name))
                summary = QueuedJob(spec, service, job_id).run()
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
    """One training run: started, watched (progress lines, the metrics log in storage, reports to
    the service), stopped on request, summarised."""

    def __init__(
        self, spec: JobSpec, run: str, placement: dict[str, int] | None, queued: QueuedJob | None = None
    ):
        self.spec, self.run_name, self.placement, self.queued = spec, run, placement, queued
        self.tag = f"[{spec.name}]"
        self.metrics_uri = storage.join(spec.checkpoint.storage, run, "metrics.jsonl")
        self.remote = not storage.is_local(self.metrics_uri)
        self.log = MetricsLog()
        self.last_write = self.last_report = 0.0
        self.last_step: int | None = None
        self.last_checkpoint: str | None = None
        self.workers_started = False
        self.step_times: list[tuple[float, int]] = []  # (time, step) of recent records
        self.stop_sent: str | None = None

    def run(self) -> dict:
        handle = launcher.start(self.spec, self.run_name, self.placement)
        while handle.running:
            handle.join(POLL_S)
            self._poll(handle)
        self._poll(handle, final=True)
        return launcher.summary(handle, self.last_step, self.last_checkpoint)

    def _poll(self, handle: launcher.RunHandle, final: bool = False) -> None:
        for event in handle.events():
            self.log.apply(event)
            self._show(event)
        if self.log.changed and (
            final or not self.remote or time.time() - self.last_write > REMOTE_METRICS_EVERY_S
        ):
            self._write(self.log.records)
            self.log.changed, self.last_write = False, time.time()
        if self.queued is not None and (final or time.time() - self.last_report > REPORT_S):
            stop = self.queued.report(self.progress())
            self.last_report = time.time()
            if stop and stop != self.stop_sent and not final:
                handle.request_stop(stop)
                self.stop_sent = stop
                what = "preemption" if stop == "preempt" else "stop"
                print(f"{self.tag} {what} requested: checkpointing at the next logging step", flush=True)

    def progress(self) -> dict:
        step_time = None
        if len(self.step_times) >= 2:
            (t0, s0), (t1, s1) = self.step_times[0], self.step_times[-1]
            step_time = (t1 - t0) / (s1 - s0) if s1 > s0 else None
        return {
            "step": self.last_step,
            "step_time_s": step_time,
            "checkpoint": self.last_checkpoint,
            "workers_started": self.workers_started,
        }

    def _write(self, records: list[dict]) -> None:
        fs, path = storage.resolve(self.metrics_uri)
        with fs.open_output_stream(path) as out:
            out.write("".join(json.dumps(r) + "\n" for r in records).encode())

    def _show(self, event) -> None:
        tag = self.tag
        if isinstance(event, WorkersStarted):
            self.workers_started = True
            who = ", ".join(f"rank {rank} pid {w['pid']} on {w['node']}" for rank, w in event.members.items())
            label = "workers" if event.attempt == 0 else f"restart {event.attempt}: workers"
            print(f"{tag} {label}: {who}", flush=True)
        elif isinstance(event, RunStarted):
            for skipped in event.skipped:
                print(f"{tag} skipped {skipped['checkpoint']}: {skipped['reason']}", flush=True)
            if event.attempt:
                print(
                    f"{tag} restarted from the checkpoint at step {event.step}"
                    if event.step
                    else f"{tag} restarted from scratch (no checkpoint yet)",
                    flush=True,
                )
            elif event.step:
                print(f"{tag} resuming at step {event.step}", flush=True)
            self.last_step = event.step
        elif isinstance(event, CheckpointSaved):
            self.last_checkpoint = event.uri
            print(f"{tag} checkpoint at step {event.step}: {event.uri}", flush=True)
        elif isinstance(event, WorkerFailed):
            print(f"{tag} rank {event.rank} failed: {event.reason}", flush=True)
        elif isinstance(event, Records):
            for r in event.records:
                self._show_record(r)

    def _show_record(self, r: dict) -> None:
        step = r.get("step")
        self.last_step = step
        if "loss" in r:
            self.step_times = (self.step_times + [(r.get("time", time.time()), step)])[-20:]
            total = f"/{self.spec.train.steps}" if self.spec.train.steps else ""
            print(
                f"{self.tag} step {step}{total}  loss {r['loss']:.4f}  {r.get('samples_per_s', 0):,.0f} "
                f"samples/s  lr {r.get('lr', 0):.2e}",
                flush=True,
            )
        else:
            evals = "  ".join(
                f"{k.removeprefix('eval_')} {v:.4f}"
                for k, v in r.items()
                if k.startswith("eval_") and isinstance(v, (int, float))
            )
            print(f"{self.tag} eval at step {step}: {evals}", flush=True)


class QueuedJob:
    """A job run through the orchestrator service: queued, admitted, run, maybe preempted and
    run again, until it ends."""

    WAIT_S = 1.0

    def __init__(self, spec: JobSpec, service, job_id: str | None):
        self.spec, self.service, self.tag = spec, service, f"[{spec.name}]"
        submission = service_client.own_submission_id()
        if job_id:
            view = service_client.call(service.attach, job_id, submission)
        else:
            view = service_client.call(
                service.register,
                service_client.spec_json(spec),
                {"submission_id": submission},
                service_client.package_if_in_ray_job(),
            )
        self.job_id, self.run_id, self.attempt = view["id"], view["run"], view["attempt"]
        print(
            f"{self.tag} queued as {self.job_id} (priority {view['priority']}); checkpoints in "
            f"{storage.join(spec.checkpoint.storage, self.run_id)}",
            flush=True,
        )

    def run(self) -> dict:
        while True:
            admitted = self._wait_admission()
            if admitted is None:  # stopped while queued
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
            nodes = len(admitted["placement"])
            print(
                f"{self.tag} admitted (attempt {self.attempt}): {spec.resources.num_workers} worker(s) "
                f"on {nodes} node(s)",
                flush=True,
            )
            summary = Attempt(spec, self.run_id, admitted["placement"], queued=self).run()
            status = summary["status"]
            outcome = {"stopped_early": "succeeded"}.get(status, status)
            service_client.call(self.service.finished, self.job_id, self.attempt, outcome, summary)
            if outcome != "preempted":
                summary["job_id"] = self.job_id
                return summary
            print(
                f"{self.tag} preempted at step {summary.get('steps')}: back in the queue; it resumes "
                f"from {summary.get('checkpoint')}",
                flush=True,
            )

    def _wait_admission(self) -> dict | None:
        shown = None
        while True:
            state = service_client.call(self.service.admission, self.job_id)
            if state["state"] == "admitted":
                return state
            if state["state"] in ("stopped", "failed", "succeeded"):
                return None
            line = state.get("note") or (
                f"queued behind {state['ahead']} job(s)" if state["ahead"] else "queued"
            )
            if line != shown:
                print(f"{self.tag} {line}", flush=True)
                shown = line
            time.sleep(self.WAIT_S)

    def report(self, progress: dict) -> str | None:
        try:
            reply = service_client.call(self.service.report, self.job_id, self.attempt, progress, retries=1)
        except service_client.ServiceError:
            return None  # the service is restarting: keep training, report again later
        return reply.get("stop")
