"""The CLI's quick way to read the service: its HTTP API (the status page's server, web.py).

Joining the cluster as a Ray driver to ask the service actor takes seconds on a small machine
and leaves a row in Ray's job list for every command; the HTTP API answers in milliseconds and
leaves nothing behind. `queue`, `status` and `submit` use it when `orchestrator up` recorded
the service's page on this machine and no --address names another cluster; when it cannot be
reached (a service restarted on another port, a page turned off, a cluster without token
auth) they join the cluster as before (client.py). Submitting sends the cluster's Ray token,
which the service checks. Imports neither Ray nor torch.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request

TIMEOUT_S = 5.0
SUBMIT_TIMEOUT_S = 120.0  # a large project directory travels in the request


class Refused(Exception):
    """The service said no (a job too big for the cluster, an id taken): one line for a person."""


class Unreachable(Exception):
    """No answer from the recorded page: use the cluster instead."""


def recorded_page(address: str | None) -> str | None:
    """The service page `orchestrator up` recorded here, unless --address asks for a cluster."""
    if address:
        return None
    from orchestrator.ray import cluster

    return (cluster.read_state() or {}).get("status_page")


def get(page: str, path: str):
    """GET `path` of the page's API as JSON; None for a 404 (an unknown job)."""
    url = f"{page.rstrip('/')}/api/{path.lstrip('/')}"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as reply:
            return json.load(reply)
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return None
        raise Unreachable(f"{url}: HTTP {err.code}") from None
    except (OSError, ValueError) as err:  # refused, timed out, not our JSON
        raise Unreachable(f"{url}: {err}") from None


def job(page: str, job_id: str) -> dict | None:
    return get(page, f"jobs/{urllib.parse.quote(job_id, safe='')}")


def metrics_since(page: str, job_id: str, since_step: int) -> list[dict]:
    """The job's metrics records with step > since_step."""
    return get(page, f"jobs/{urllib.parse.quote(job_id, safe='')}/metrics?since={since_step}") or []


def submit(page: str, token: str, specs: list[dict], options: list[dict], package: bytes) -> list[dict]:
    """Queue the specs (JSON-ready dicts) with the project's zip; the jobs' views."""
    body = json.dumps(
        {"specs": specs, "options": options, "package": base64.b64encode(package).decode()}
    ).encode()
    url = f"{page.rstrip('/')}/api/jobs"
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, body, headers, method="POST"), timeout=SUBMIT_TIMEOUT_S
        ) as reply:
            return json.load(reply)["jobs"]
    except urllib.error.HTTPError as err:
        if err.code == 400:
            raise Refused(_error_of(err)) from None
        raise Unreachable(f"{url}: HTTP {err.code}") from None
    except (OSError, ValueError, KeyError) as err:
        raise Unreachable(f"{url}: {err}") from None


def _error_of(err: urllib.error.HTTPError) -> str:
    try:
        return str(json.load(err)["error"])
    except (ValueError, KeyError, TypeError):
        return f"HTTP {err.code}"
