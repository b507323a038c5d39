"""How anything outside the orchestrator service reaches it: the CLI and the jobs' drivers.

Two ways in. The service's HTTP API (the status page's server, `monitoring/web.py`, with the
service's own routes, `service/http_calls.py`) answers in milliseconds and leaves nothing
behind; joining the cluster as a Ray driver to call the service actor takes seconds on a small
machine and leaves a row in Ray's job list for every command.
The CLI reads, submits, stops, preempts, applies queues, manages users and reads the audit log
over HTTP when `orchestrator up` recorded the service's page on this machine (or
$ORCHESTRATOR_URL names it) and no --address names another cluster: a user needs only its own
token, never the Ray cluster's. When the page cannot be reached (a service restarted on
another port, a page turned off, a service from before a route) it joins the cluster instead,
which needs the Ray token. Submitting over HTTP sends the caller's own token, else the
cluster's Ray token (whose holder is the cluster's admin); the service checks either, and a
refusal (400, 401, 403) is final: the CLI prints its one line and does not try the cluster
instead.

Actor calls are retried while Ray restarts the service actor (a restart reloads the queue from
the store within seconds); an error the service raises on purpose (an unknown job, a job too
big for the cluster) becomes a `ServiceError` with the service's one-line message.

Who is calling: the caller's own token (`caller_token`: $ORCHESTRATOR_TOKEN, else the file
`orchestrator login` wrote), sent with every HTTP request as `Authorization: Bearer` and
handed to the service's user calls; the service derives the user and team from it, never from
what the request says (`orchestrator/service/tenants.py`, docs/security.md). A caller without
one that the page refuses (401: `up --require-login`) asks once more with this machine's Ray
token, if any: its holder is the cluster's admin, as on an actor call.

Imports neither Ray nor torch at module level (the HTTP way in needs neither), nor the service
actor's module: the names the actor is registered under live here, and it imports them.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from orchestrator.errors import UsageError

SERVICE_NAME = "orchestrator"  # the service actor's name, in its namespace
NAMESPACE = "orchestrator"


def attempt_name(job_id: str, attempt: int) -> str:
    """The name of an attempt's controller, in the service's namespace (`orchestrator logs`
    finds its log by it; Ray's dashboard lists it)."""
    return f"{job_id}-a{attempt}"


def is_attempt_of(name: str, job_id: str) -> bool:
    return name.startswith(f"{job_id}-a") and name.removeprefix(f"{job_id}-a").isdigit()


TIMEOUT_S = 5.0
TOKEN_ENV = "ORCHESTRATOR_TOKEN"  # the caller's token, as kubectl and Ray read theirs from the environment
PAGE_ENV = "ORCHESTRATOR_URL"  # the service's page (http://HEAD:8266), where `up` left no record
TOKEN_PREFIX = "orch_"  # every user token starts so (the service makes them: service/tenants.py)
MAX_TOKEN_CHARS = 256  # longer is not one of ours
SUBMIT_TIMEOUT_S = 120.0  # a large project directory travels in the request
CHANGE_TIMEOUT_S = 120.0  # a change waits for the service's lock, as long as an actor call may


# -- who is calling ------------------------------------------------------------------------------


def token_path() -> Path:
    """The file `orchestrator login` keeps the caller's token in (mode 0600), beside the
    CLI's other state: $ORCHESTRATOR_HOME, else ~/.orchestrator."""
    from orchestrator.ray import cluster

    return cluster.home() / "token"


def caller_token() -> str | None:
    """The caller's token: $ORCHESTRATOR_TOKEN, else the file `orchestrator login` wrote; None
    without either (then a service on loopback takes the caller for its local admin)."""
    token = os.environ.get(TOKEN_ENV, "").strip()
    if token:
        return token
    try:
        return token_path().read_text().strip() or None
    except OSError:  # not logged in (or the file is not readable: the same to the service)
        return None


def auth_headers() -> dict[str, str]:
    """The caller's token as HTTP sends it (nothing without one)."""
    token = caller_token()
    return {"Authorization": f"Bearer {token}"} if token else {}


# -- the service's HTTP API ----------------------------------------------------------------------


class Refused(UsageError):
    """The service said no (a job too big for the cluster, an id taken, a token it does not
    take or a call the token's user may not make): one line for a person, exit status 2."""


REFUSING = (400, 401, 403)  # the service's answers that another way in would not change


class Unreachable(Exception):
    """No answer from the recorded page: use the cluster instead."""


class NoAnswer(UsageError):
    """A change sent over HTTP that timed out: it may have been done. One line, exit status 2."""


def recorded_page(address: str | None) -> str | None:
    """The service's page: $ORCHESTRATOR_URL (a user's machine, where `up` never ran), else
    the one `orchestrator up` recorded here; None when --address asks for a cluster."""
    if address:
        return None
    from orchestrator.ray import cluster

    return os.environ.get(PAGE_ENV, "").strip() or (cluster.read_state() or {}).get("status_page")


def api_get(page: str, path: str):
    """GET `path` of the page's API as JSON; None for a 404 (an unknown job)."""
    return _api(page, "GET", path, refusing=(401, 403))  # joining the cluster would not make the token valid


def api_send(page: str, method: str, path: str, body: dict | None = None):
    """A change (`method`: POST, PUT, DELETE) of `path` with a JSON body and the caller's
    token: the reply's JSON; None when the service does not know the job `path` names. A
    refusal (400, 401, 403, 503) is final: `Refused`; a page without the route (a service
    from before) is `Unreachable`, as no answer is; a timeout is `NoAnswer`: the call may have
    been done, so it is not sent again another way."""
    return _api(page, method, path, body or {}, CHANGE_TIMEOUT_S, (*REFUSING, 503))


def _api(page: str, method: str, path: str, body=None, timeout=TIMEOUT_S, refusing=REFUSING, token=None):
    """`token`: sent instead of the caller's (the Ray token, after a 401 to a caller without a
    token of its own: a page that asks every request for one, and the Ray token's holder,
    the cluster's admin, behind the CLI; nothing is done on a 401, so asking again is safe)."""
    url = f"{page.rstrip('/')}/api/{path.lstrip('/')}"
    headers = {"Authorization": f"Bearer {token}"} if token else auth_headers()
    data = None if body is None else json.dumps(body).encode()
    if data is not None:
        headers["Content-Type"] = "application/json"
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, data, headers, method=method), timeout=timeout
        ) as reply:
            return json.load(reply)
    except urllib.error.HTTPError as err:
        line = _service_line(err)  # None: not the service's answer (an old page, a proxy)
        ray_token = _ray_token() if err.code == 401 and not headers.get("Authorization") else None
        if ray_token:
            return _api(page, method, path, body, timeout, refusing, ray_token)
        if err.code == 404 and (line is not None or method == "GET"):
            return None
        if err.code in refusing and (line is not None or err.code in (401, 403)):
            raise Refused(line or f"HTTP {err.code}") from None
        raise Unreachable(f"{url}: HTTP {err.code}") from None
    except TimeoutError:
        if method == "GET":
            raise Unreachable(f"{url}: no answer in {timeout:g} s") from None
        raise NoAnswer(
            f"the orchestrator service did not answer within {timeout:g} s; the {method} may have "
            "been done: `orchestrator audit` (admins) or `orchestrator status ID` shows"
        ) from None
    except (OSError, ValueError) as err:  # refused, not our JSON
        raise Unreachable(f"{url}: {err}") from None


def _ray_token() -> str | None:
    from orchestrator.ray import cluster

    return cluster.read_token()


def api_job(page: str, job_id: str) -> dict | None:
    return api_get(page, job_path(job_id))


def api_metrics_since(page: str, job_id: str, since_step: int) -> list[dict]:
    """The job's metrics records with step > since_step."""
    return api_get(page, f"{job_path(job_id, 'metrics')}?since={since_step}") or []


def api_submit(page: str, token: str, specs: list[dict], options: list[dict], package: bytes) -> list[dict]:
    """Queue the specs (JSON-ready dicts) with the project's zip; the jobs' views."""
    return _post_job(page, token, {"specs": specs, "options": options}, package)["jobs"]


def spec_file(path: str, overrides: list[str], cwd: str | None, check_storage: bool = True) -> dict | None:
    """A spec file as the service reads it (`service/sent_spec.py`): its text, the overrides,
    where the user stood (`cwd`; None: not known, for the driver of a `ray job submit` from a
    directory this machine did not record), their home, and whether the service probes its
    storage (not for storage only the job's nodes reach). None when the file cannot be read
    here (the local checks then say why)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, ValueError):
        return None
    home = os.path.expanduser("~")
    sent = {"path": path, "text": text, "overrides": list(overrides), "cwd": cwd or "", "home": home}
    return {**sent, "check_storage": check_storage}


def submit_to_actor(service, sent: dict, package: bytes, route: str, came_in_by: str | None = None) -> dict:
    """`sent` queued by the service actor (the same call as over HTTP): {"jobs", "sweep",
    "notes"}; `Refused` with the service's lines."""
    try:
        return call(service.submit_sent, sent, package, caller_token(), route, came_in_by)
    except ServiceError as err:
        raise Refused(str(err)) from None


def api_submit_sent(page: str, token: str, sent: dict, package: bytes) -> dict:
    """Queue a spec file as read here (`service/sent_spec.py`: path, text, overrides, cwd,
    home), which the service checks: {"jobs": views, "sweep", "notes"}. A spec's errors come
    back as `Refused`, one line each."""
    return _post_job(page, token, {"spec_file": sent}, package)


def _post_job(page: str, token: str, body: dict, package: bytes) -> dict:
    data = json.dumps({**body, "package": base64.b64encode(package).decode()}).encode()
    url = f"{page.rstrip('/')}/api/jobs"
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, data, headers, method="POST"), timeout=SUBMIT_TIMEOUT_S
        ) as reply:
            done = json.load(reply)
    except urllib.error.HTTPError as err:
        if err.code in REFUSING:
            raise Refused(_error_of(err)) from None
        raise Unreachable(f"{url}: HTTP {err.code}") from None
    except (OSError, ValueError) as err:
        raise Unreachable(f"{url}: {err}") from None
    if not isinstance(done, dict) or not isinstance(done.get("jobs"), list):
        raise Unreachable(f"{url}: not the service's answer")
    return done


def _error_of(err: urllib.error.HTTPError) -> str:
    return _service_line(err) or f"HTTP {err.code}"


def _service_line(err: urllib.error.HTTPError) -> str | None:
    """The service's lines in an error's JSON body (`{"error"}`, with every line of a spec's
    errors in `"errors"`), else None."""
    try:
        body = json.load(err)
        lines = body.get("errors")
        if isinstance(lines, list) and lines and all(isinstance(line, str) for line in lines):
            return "\n".join(lines)
        return str(body["error"])
    except (ValueError, KeyError, TypeError, AttributeError, OSError):
        return None


# -- the service actor ---------------------------------------------------------------------------


class ServiceError(Exception):
    """The service said no (or is unreachable): printed as one line."""


def find():
    """The service's actor handle on the connected cluster, or None when there is none."""
    import ray

    try:
        return ray.get_actor(SERVICE_NAME, namespace=NAMESPACE)
    except ValueError:
        return None


def call(method, *args, retries: int = 60, delay: float = 1.0, timeout: float = 120.0):
    """`method.remote(*args)`, waiting out a restart of the service actor."""
    import ray

    for attempt in range(retries + 1):
        try:
            return ray.get(method.remote(*args), timeout=timeout)
        except ray.exceptions.RayTaskError as err:  # the service raised: its message is the answer
            cause = getattr(err, "cause", None) or err
            lines = str(cause.args[0] if getattr(cause, "args", None) else cause).strip().splitlines()
            # a refused spec names each field on a line of its own; any other answer is one line
            text = "\n".join(lines) if isinstance(cause, ValueError) else (lines or [""])[0]
            raise ServiceError(text or type(cause).__name__) from None
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
    from orchestrator.project_package import zip_project

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


# -- a call of the service, whichever way in -----------------------------------------------------


def job_path(job_id: str, *more: str) -> str:
    """The API's path of a job (and of a call on it): `jobs/ID/stop`."""
    return "/".join(["jobs", urllib.parse.quote(job_id, safe=""), *more])


def through_service(address: str | None, http: tuple, method: str, *params):
    """The service's answer to a call: over its HTTP API when `up` recorded the page here
    (`http`: the verb, the path under /api/ and, for a change, the JSON body), which needs
    only the caller's own token; else, or when the page does not answer, by joining the
    cluster (which needs the Ray token) to call the actor's `method(*params)`. A refusal
    either way is final: `Refused`, one line."""
    page = recorded_page(address)
    if page:
        verb, path, *body = http
        try:
            return api_get(page, path) if verb == "GET" else api_send(page, verb, path, *body)
        except Unreachable:
            pass
    with connected_service(address, required=True) as service:
        try:
            return call(getattr(service, method), *params)
        except ServiceError as err:
            raise Refused(str(err)) from None


def queued_job(address: str | None, method: str, *params, http: tuple | None = None) -> dict | None:
    """Ask the orchestrator service about a job it knows (`status`, `stop`); None when there is
    no service or it does not know the id (then the id is a Ray Job submission id, for Ray's
    Jobs API). A status is read, and a call with an `http` route sent, over the service's HTTP
    API when `up` recorded it here (no need to join the cluster, nor to hold its token);
    otherwise, or when the page does not answer, through the actor."""
    page = recorded_page(address) if method == "status" or http else None
    if page:
        try:
            return api_job(page, params[0]) if http is None else api_send(page, *http)
        except Unreachable:
            pass
    if service_address(address) is None:  # joining the cluster below takes seconds
        return None
    with connected_service(address) as service:
        if service is None:
            return None
        try:
            return call(getattr(service, method), *params)
        except ServiceError as err:
            if "no job" in str(err):
                return None
            raise UsageError(str(err)) from None
