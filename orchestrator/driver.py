"""`orchestrator run SPEC` on Ray, from a terminal or as the driver of a `ray job submit`.

    a cluster with an orchestrator service   the spec file goes to the service's one way in
                                             (`submit_sent`, as `orchestrator submit` sends it)
                                             and the job is followed to its end; the service
                                             runs its attempts (`orchestrator/attempt/`)
    a cluster without one, or a local Ray    its one attempt runs now, at its largest size,
                                             through an AttemptController started here, whose
                                             lines this terminal shows

Under `ray job submit` this process runs in Ray's temporary copy of the working directory: a
relative checkpoint path is meant from the directory the job was submitted from, where that is
known for sure (`ray/origin.py`), and refused where it is not (`core.storage.as_the_user_meant`).
Printing, signals and exit statuses live here.
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
from core.summary import write_summary
from orchestrator import client
from orchestrator.errors import UsageError
from orchestrator.ray import cluster

POLL_S = 1.0  # how often the terminal shows what the attempt's controller said


class Stopped(Exception):
    """SIGTERM, e.g. from `ray job stop`: leave through ray.shutdown(), not mid-C++."""


# SIGTERM only sets this; the loops raise Stopped at their next turn (at most POLL_S later).
# An exception raised by the handler itself would land inside whatever Ray call the main
# thread is in (ray.wait), which cannot take one.
_sigterm = threading.Event()


def on_sigterm(signum, frame):
    _sigterm.set()


def raise_if_stopped() -> None:
    if _sigterm.is_set():
        raise Stopped()


def where_the_user_stood() -> str | None:
    """The directory a relative path is meant from: here, or for the driver of a `ray job
    submit` the directory it was submitted from (None: not known for sure)."""
    if client.own_submission_id() is None:
        return os.getcwd()
    from orchestrator.ray.origin import submitted_from

    return submitted_from()


def run(path: str, overrides: list[str], spec: JobSpec, address: str | None, summary_path: str | None) -> int:
    """`spec`: the file at `path` with `overrides`, checked here (a bad spec never reaches a
    cluster)."""
    cwd = where_the_user_stood()
    relative = not storage.is_absolute(spec.checkpoint.storage)
    if relative and cwd is not None and client.own_submission_id():
        where = f"in {cwd}, where it was submitted from"
        print(f"[{spec.name}] checkpoint.storage '{spec.checkpoint.storage}' is relative: {where}")
    try:
        address = cluster.driver_address(address)
        needed_cpus = math.ceil(spec.resources.max_workers * spec.resources.cpus_per_worker)
        with cluster.connect(address, num_cpus=needed_cpus) as where:
            # after connecting: a local Ray this process starts keeps its own priority
            cluster.yield_to_training()
            if threading.current_thread() is threading.main_thread():
                # after ray.init, whose own SIGTERM handler would end the process mid-C++
                signal.signal(signal.SIGTERM, on_sigterm)
            service = client.find() if address else None
            if service is not None:
                return submit_and_follow(service, client.spec_file(path, overrides, cwd), spec, summary_path)
            try:
                spec.checkpoint.storage = storage.as_the_user_meant(
                    spec.checkpoint.storage, cwd, os.path.expanduser("~")
                )
            except ValueError as err:  # relative, and where the user stood is not known
                raise UsageError(str(err)) from None
            return run_alone(spec, where, address is None, summary_path)
    except (cluster.ClusterError, client.ServiceError, OSError) as err:
        print(f"error: {spec.name}: {err}", file=sys.stderr, flush=True)
        return 1
    except Stopped:
        print(
            f"error: {spec.name}: stopped (SIGTERM); its checkpoints stay in storage",
            file=sys.stderr,
            flush=True,
        )
        return 128 + signal.SIGTERM


def submit_and_follow(service, sent: dict | None, spec: JobSpec, summary_path: str | None) -> int:
    """The job queued through the service's one way in, then followed to its end; a SIGTERM
    (`ray job stop`) asks the service to checkpoint and stop it."""
    from orchestrator.commands.follow_jobs import ActorReader, follow_queued
    from orchestrator.project_package import default_working_dir, zip_project

    if sent is None:
        raise UsageError(f"{spec.name}: the spec file cannot be read here")
    came_in_by = client.own_submission_id()
    # the project the job runs in: a Ray Job's working_dir, else what `submit` would ship
    package = zip_project(os.getcwd() if came_in_by else default_working_dir())
    done = client.submit_to_actor(service, sent, package, "driver", came_in_by)
    job = done["jobs"][0]
    for note in done.get("notes") or []:
        print(f"[{spec.name}] {note}", flush=True)
    print(
        f"[{spec.name}] queued as {job['id']} (priority {job['priority']}); the service runs it", flush=True
    )
    try:
        return follow_queued(
            ActorReader(service), [job["id"]], summary_path=summary_path, interrupt=raise_if_stopped
        )
    except Stopped:
        client.call(service.stop, job["id"], False, client.caller_token(), "driver")
        print(f"[{spec.name}] asked the service to checkpoint and stop {job['id']}", flush=True)
        raise


def run_alone(spec: JobSpec, where: str, local: bool, summary_path: str | None) -> int:
    """No service on the cluster: the job's one attempt, now, at its largest size, through an
    AttemptController beside this driver (which ends with it), its lines shown here."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from orchestrator.attempt.controller import AttemptControllerActor, print_report
    from orchestrator.attempt.listeners import replay
    from orchestrator.attempt.policy import exit_code
    from orchestrator.monitoring.terminal import Display

    if spec.resources.elastic:  # no service to size it
        spec = spec.at_size(spec.resources.max_workers)
    _check_resources(spec, local)
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    controller = AttemptControllerActor.options(scheduling_strategy=here).remote()
    result, cursor = controller.run.remote(spec), 0
    with Display() as display:
        uri = storage.join(spec.checkpoint.storage, run_name(spec))
        display.event(spec.name, f"{spec.resources.num_workers} worker(s) on {where}; checkpoints in {uri}")
        while True:
            done = ray.wait([result], timeout=POLL_S)[0]
            calls, cursor = ray.get(controller.feed_since.remote(cursor))
            replay(calls, display)
            raise_if_stopped()
            if done:
                break
    summary = ray.get(result)
    write_summary(summary, summary_path)
    print_report(summary)
    return exit_code(summary)


def _check_resources(spec: JobSpec, local: bool) -> None:
    import ray

    gpus = spec.resources.num_workers * spec.resources.gpus_per_worker
    have = ray.cluster_resources().get("GPU", 0)
    if gpus > have:
        text = f"resources: the job asks for {gpus:g} GPU(s) and the cluster has {have:g}"
        if local:
            raise cluster.ClusterError(text + "; set resources.gpus_per_worker=0 to train on CPUs")
        print(f"[{spec.name}] warning: {text}; waiting for the autoscaler", flush=True)
