"""The driver of one job on Ray, by two entry points over the same attempt
(`orchestrator.attempt`):

    run                `orchestrator run` on a cluster or a local Ray: without a service the
                       job runs at once, at its largest size (`run_alone`); with one, this
                       driver queues the job and runs it at each admission (`run_queued`)
    run_for_service    the one attempt the service started an attempt controller for
                       (`orchestrator.attempt_controller`), on the job's own node

Printing, signals and exit statuses live here; watching one training run is
`orchestrator.attempt`'s job, starting it `orchestrator.ray.launcher`'s.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading

from core import storage
from core.run_folder import run_name
from core.spec import JobSpec
from core.summary import print_summary, write_summary
from orchestrator import client as service_client
from orchestrator.attempt import Attempt, Stopped, on_sigterm, preflight
from orchestrator.errors import UsageError
from orchestrator.monitoring.terminal import Display
from orchestrator.queued_job import QueuedJob
from orchestrator.ray import cluster

EXIT = {"succeeded": 0, "stopped_early": 0, "failed": 1, "stopped": 1}


def storage_from_here(path: str, tag: str) -> str:
    """A relative path, as the user meant it. Under `ray job submit` this process runs in Ray's
    temporary copy of the working directory: resolve against the directory it was submitted
    from where that is known for sure, else refuse (checkpoints there would be deleted)."""
    path = os.path.expanduser(path)
    if os.path.isabs(path) or service_client.own_submission_id() is None:
        return path
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


def run(spec: JobSpec, address: str | None = None, summary_path: str | None = None) -> int:
    tag = f"[{spec.name}]"
    if "://" not in spec.checkpoint.storage:  # workers run in other directories
        spec.checkpoint.storage = os.path.abspath(storage_from_here(spec.checkpoint.storage, tag))
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
            with Display() as display:
                if service is None:
                    summary = run_alone(spec, where, display, local=address is None)
                else:
                    summary = run_queued(spec, service, display)
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
    return report(spec, summary, summary_path)


def run_for_service(spec: JobSpec, job_id: str, state) -> int:
    """The attempt of `job_id` that the service started the calling attempt controller for:
    attached to the service's record, run with `state` (the controller's own run state) as the
    run's, reported. The service starts the next attempt's controller, if there is one."""
    cluster.yield_to_training()  # this thread polls and reports; the job's ranks come first
    service = service_client.find()
    if service is None:
        print(f"error: {spec.name}: no orchestrator service on this cluster", file=sys.stderr, flush=True)
        return 1
    try:
        with Display() as display:
            queued = QueuedJob(spec, service, job_id, display, state=state)
            queued.preflight()
            summary = queued.run()
    except (service_client.ServiceError, OSError) as err:
        print(f"error: {spec.name}: {err}", file=sys.stderr, flush=True)
        return 1
    return report(spec, summary, None)


def report(spec: JobSpec, summary: dict, summary_path: str | None) -> int:
    """The run's summary, printed and written where asked; the exit status."""
    tag = f"[{spec.name}]"
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


def run_alone(spec: JobSpec, where: str, display: Display, local: bool) -> dict:
    """`orchestrator run` with no service on the cluster: the job runs now, at its largest size."""
    if spec.resources.elastic:  # no service to size it
        spec = spec.at_size(spec.resources.max_workers)
    run = run_name(spec)
    preflight(spec, storage.join(spec.checkpoint.storage, run))
    _check_resources(spec, local)
    display.event(
        spec.name,
        f"{spec.resources.num_workers} worker(s) on {where}; checkpoints in "
        f"{storage.join(spec.checkpoint.storage, run)}",
    )
    attempt = Attempt(spec, run, None, display)
    summary = attempt.run()
    attempt.wait_tracking()
    return summary


def run_queued(spec: JobSpec, service, display: Display) -> dict:
    """Through the service: this driver queues the job and runs it each time it is admitted."""
    queued = QueuedJob(spec, service, None, display)
    queued.preflight()
    return queued.run()


def _check_resources(spec: JobSpec, local: bool) -> None:
    import ray

    gpus = spec.resources.num_workers * spec.resources.gpus_per_worker
    have = ray.cluster_resources().get("GPU", 0)
    if gpus > have:
        text = f"resources: the job asks for {gpus:g} GPU(s) and the cluster has {have:g}"
        if local:
            raise cluster.ClusterError(text + "; set resources.gpus_per_worker=0 to train on CPUs")
        print(f"[{spec.name}] warning: {text}; waiting for the autoscaler", flush=True)
