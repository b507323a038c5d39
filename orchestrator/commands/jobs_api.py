"""Calls on Ray's Jobs API as the commands make them: errors as lines a person can act on."""

from __future__ import annotations

from orchestrator.errors import UsageError


def ray_job_ended(status: str) -> bool:
    """Whether a Ray Job's status is final (Ray's own definition)."""
    from ray.job_submission import JobStatus

    return JobStatus(status).is_terminal()


def call(args, method: str, *params):
    """client.<method>(*params), with errors turned into lines a person can act on."""
    from orchestrator.ray.cluster import jobs_client, translate

    client = jobs_client(args.address)
    try:
        return client, getattr(client, method)(*params)
    except Exception as err:
        job_id = getattr(args, "job_id", None)
        if job_id and "does not exist" in str(err):
            raise UsageError(f"no job '{job_id}' on this cluster; `orchestrator list` shows them") from None
        raise translate(err, args.address or "the Ray cluster") from None
