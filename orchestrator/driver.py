"""`orchestrator run` on Ray: the driver of one job.

With an orchestrator service on the cluster, the driver queues the job there (or attaches to
the record the service started it for, `--job-id`), waits until the service admits it, runs it
on the nodes the service counted, reports progress, forwards stop requests to the workers and
reports how the attempt ended; a preempted job goes back to waiting in the same driver and
resumes from the checkpoint it stopped at. Without a service it runs the job at once.

Printing, signals and exit statuses live here; watching one training run is `orchestrator.attempt`'s job,
starting it `orchestrator.ray.launcher`'s.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time

from core import storage
from core.jobs import TERMINAL_VALUES
from core.run_folder import run_name
from core.spec import JobSpec
from core.summary import print_summary, write_summary
from orchestrator import client as service_client
from orchestrator.attempt import Attempt, Stopped, on_sigterm, raise_if_stopped
from orchestrator.errors import UsageError
from orchestrator.monitoring.terminal import Display
from orchestrator.ray import cluster

EXIT = {"succeeded": 0, "stopped_early": 0, "failed": 1, "stopped": 1}


def storage_from_here(path: str, job_id: str | None, tag: str) -> str:
    """A relative path, as the user meant it. Under `ray job submit` this process runs in Ray's
    temporary copy of the working directory: resolve against the directory it was submitted
    from where that is known for sure, else refuse (checkpoints there would be deleted)."""
    path = os.path.expanduser(path)
    if os.path.isabs(path) or job_id or service_client.own_submission_id() is None:
        return path  # (the service's own drivers get absolute paths from submission)
    from orchestrator.ray.origin import submitted_from

    origin = submitted_from()
    if origin is None:
        raise UsageError(
            f"checkpoint.storage '{path}' is relative, and `ray job submit` runs the job in a "
            "temporary copy of its working directory, deleted with the cluster, without saying "
            "where it came from: give an absolute path or a URI (--set checkpoint.storage=$PWD/"
            f"{path.removeprefix('./')}), or submit with `orchestrator submit`"
        )
    print(f"{tag} checkpoint.storage '{path}' is relative: in {origin}, where it was submitted from")
    return os.path.join(origin, path)


def run(
    spec: JobSpec, address: str | None = None, summary_path: str | None = None, job_id: str | None = None
) -> int:
    tag = f"[{spec.name}]"
    if "://" not in spec.checkpoint.storage:  # workers run in other directories
        spec.checkpoint.storage = os.path.abspath(storage_from_here(spec.checkpoint.storage, job_id, tag))
    try:
        address = cluster.driver_address(address)
        needed_cpus = math.ceil(spec.resources.max_workers * spec.resources.cpus_per_worker)
        with cluster.connect(address, num_cpus=needed_cpus) as where:
            # after connecting: a local Ray this process starts keeps its own priority
            cluster.yield_to_training()
            if threading.current_thread() is threading.main_thread():
                # after ray.init, whose own SIGTERM handler would end the process mid-C++
                signal.signal(signal.SIGTERM, on_sigterm)
            service = service_client.find() if address else None
            if service is None and job_id:
                raise cluster.ClusterError(f"--job-id {job_id}: no orchestrator service on {where}")
            with Display() as display:
                if service is None:
                    if spec.resources.elastic:  # no service to size it: its largest size
                        spec = spec.at_size(spec.resources.max_workers)
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
    if summary.get("handed_back"):  # the job goes on: the service starts its next attempt's driver
        return 0
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
        # a driver the service started runs on the attempt's nodes, for that attempt only
        self.one_attempt = bool(job_id)
        self.finished_attempt = 0  # the newest attempt this driver ran and reported
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
        summary = self._summary("stopped", "stopped while queued")
        while True:
            view = self._wait_admission()
            if view["state"] in TERMINAL_VALUES:  # stopped while queued, or the service's verdict
                summary.update(status=view["state"], job_id=self.job_id, reason=view.get("reason"))
                return summary
            self.attempt = view["attempt"]
            if view["state"] == "stopping":  # stopped or preempted before this driver started it
                outcome = "preempted" if view["stop"] == "preempt" else "stopped"
                summary = self._summary(outcome, f"{outcome} before it started")
            else:
                summary = self._attempt(view)
            outcome = {"stopped_early": "succeeded"}.get(summary["status"], summary["status"])
            after = service_client.call(self.service.finished, self.job_id, self.attempt, outcome, summary)
            self.finished_attempt = self.attempt
            self.display.update(self.name, state=after["state"])
            if after["state"] in TERMINAL_VALUES:
                summary["job_id"] = self.job_id
                return summary
            self._say_requeued(after, summary)
            if self.one_attempt:
                summary.update(handed_back=True, job_id=self.job_id)
                return summary

    def _attempt(self, admitted: dict) -> dict:
        spec = self.spec.model_copy(deep=True)
        if spec.resources.elastic:  # the size the service admitted it at
            spec = spec.at_size(sum(admitted["placement"].values()))
        if self.attempt > 1:  # a later admission continues the job's own checkpoints
            spec.checkpoint.resume = "auto"
        accum = f", {spec.train.grad_accum} micro-batches per step" if self.spec.resources.elastic else ""
        self.display.event(
            self.name,
            f"admitted (attempt {self.attempt}): {spec.resources.num_workers} "
            f"worker(s) on {len(admitted['placement'])} node(s){accum}",
        )
        self.display.update(self.name, state="admitted", note=None)
        return Attempt(spec, self.run_id, admitted["placement"], self.display, queued=self).run()

    def _say_requeued(self, after: dict, summary: dict) -> None:
        """The attempt ended and the job is queued again (or the service is deciding whether a
        node of its died): say why, and go back to waiting."""
        last = (after.get("history") or [{}])[-1]
        if last.get("event") == "node-lost":
            why = f"a node it ran on was lost at step {last.get('step')}"
        elif last.get("event") == "infrastructure-failure":
            why = (
                f"its collectives failed at step {last.get('step')} with every node answering"
                f" ({last['count']})"
            )
        elif after["state"] == "preempted":
            why = f"preempted at step {summary.get('steps')}"
        elif after["state"] in ("admitted", "running", "stopping"):
            why = "its attempt failed; waiting to learn whether a node of its was lost"
        else:
            why = f"its attempt ended ({summary['status']})"
        resume = summary.get("checkpoint")
        self.display.event(
            self.name,
            f"{why}: back in the queue; it resumes from {resume or 'the start (no checkpoint yet)'}",
        )

    def _summary(self, status: str, reason: str) -> dict:
        return {
            "job": self.spec.name,
            "run": self.run_id,
            "status": status,
            "steps": None,
            "reason": reason,
            "samples_per_s": 0.0,
            "checkpoint": None,
        }

    def _wait_admission(self) -> dict:
        """The service's view once the job is admitted (a newer attempt), asked to stop before
        it started, or ended; meanwhile the queue notes, as they change."""
        shown = None
        while True:
            state = service_client.call(self.service.admission, self.job_id)
            newer = state["attempt"] > self.finished_attempt
            if state["state"] in TERMINAL_VALUES or (newer and state["state"] in ("admitted", "stopping")):
                return state
            if state["state"] in ("queued", "preempted"):
                line = state.get("note") or (
                    f"queued behind {state['ahead']} job(s)" if state["ahead"] else "queued"
                )
            else:  # this attempt still holds its nodes: the service is deciding about it
                line = "waiting for the service's verdict on the failed attempt (probing its nodes)"
            if line != shown:
                self.display.event(self.name, line)
                self.display.update(self.name, state=state["state"], note=line)
                shown = line
            time.sleep(self.WAIT_S)
            raise_if_stopped()

    def report(self, progress: dict) -> dict:
        """Progress to the service; its reply may carry a stop request ("stop", "preempt",
        "abort") and why."""
        try:
            return service_client.call(self.service.report, self.job_id, self.attempt, progress, retries=1)
        except service_client.ServiceError:
            return {}  # the service is restarting: keep training, report again later
