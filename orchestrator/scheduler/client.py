"""Finding the orchestrator service on a connected cluster and calling it (CLI and drivers).

Calls are retried while Ray restarts the service actor (a restart reloads the queue from the
store within seconds); an error the service raises on purpose (an unknown job, a job too big
for the cluster) becomes a `ServiceError` with the service's one-line message.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import ray

from orchestrator.errors import UsageError
from orchestrator.scheduler.actor import NAMESPACE, SERVICE_NAME
from orchestrator.scheduler.submission import zip_project


class ServiceError(Exception):
    """The service said no (or is unreachable): printed as one line."""


def find():
    """The service's actor handle on the connected cluster, or None when there is none."""
    try:
        return ray.get_actor(SERVICE_NAME, namespace=NAMESPACE)
    except ValueError:
        return None


def call(method, *args, retries: int = 60, delay: float = 1.0, timeout: float = 120.0):
    """`method.remote(*args)`, waiting out a restart of the service actor."""
    for attempt in range(retries + 1):
        try:
            return ray.get(method.remote(*args), timeout=timeout)
        except ray.exceptions.RayTaskError as err:  # the service raised: its message is the answer
            cause = getattr(err, "cause", None) or err
            text = str(cause.args[0] if getattr(cause, "args", None) else cause).strip()
            raise ServiceError(text.splitlines()[0] if text else type(cause).__name__) from None
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as err:
            if attempt == retries:
                raise ServiceError(
                    f"the orchestrator service does not answer ({type(err).__name__})"
                ) from None
            time.sleep(delay)
    raise AssertionError("unreachable")


def own_submission_id() -> str | None:
    """The Ray Job submission id of this process, when Ray Jobs started it."""
    raw = os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")
    if not raw:
        return None
    try:
        return json.loads(raw).get("metadata", {}).get("job_submission_id")
    except (ValueError, AttributeError):
        return None


def package_if_in_ray_job() -> bytes | None:
    """A driver that Ray Jobs started runs in its job's working_dir: ship it, so that the
    service can start the job again if this driver dies."""
    return zip_project(Path.cwd()) if own_submission_id() else None


def service_address(address: str | None) -> str | None:
    """The cluster (GCS) address to find the service at: --address unless it is a dashboard
    URL, else $RAY_ADDRESS, else what `orchestrator up` recorded."""
    from orchestrator.ray import cluster

    for candidate in (address, os.environ.get("RAY_ADDRESS"), (cluster.read_state() or {}).get("address")):
        if candidate and not candidate.startswith(("http://", "https://")):
            return candidate
    return None


@contextlib.contextmanager
def connected_service(address: str | None, required: bool = False) -> Iterator:
    """Join the cluster and yield the service's handle (None when there is none, unless
    `required`: then say how to start one)."""
    from orchestrator.ray import cluster

    where = service_address(address)
    if where is None:
        if required:
            raise UsageError(
                "no orchestrator service known here: start one with `orchestrator up`, or pass "
                "--address HOST:6379 of a cluster that runs one"
            )
        yield None
        return
    with cluster.connect(where):
        service = find()
        if service is None and required:
            raise UsageError(
                f"no orchestrator service on the Ray cluster at {where}; start one with "
                f"`orchestrator up --address {where}`"
            )
        yield service
