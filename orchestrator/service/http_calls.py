"""The service's HTTP API beyond the status page's reads (monitoring/web.py serves those, the
page and /metrics, and adds these routes to its app): what the CLI's `submit`, `stop`,
`preempt`, `queues apply`, `users`, `audit` and `sweep` send, so that a user reaches the
service with its own token alone, never the Ray cluster's (docs/security.md).

    POST   /api/jobs                {"spec_file", "package"}     queue jobs (below): 201
    POST   /api/jobs/{id}/stop      {"now": bool}                stop a job (`now`: kill it)
    POST   /api/jobs/{id}/preempt   {}                           checkpoint it, queue it again
    PUT    /api/queues              {"config": {...} | null}     apply a queue configuration
    GET    /api/users                                            the users (admins)
    POST   /api/users               {"name", "team", "role"}     add one: 201, its token once
    DELETE /api/users/{name}                                     revoke its token
    GET    /api/audit?since=T&until=T&user=U                     the audit log (admins)
    GET    /api/sweeps/{name}                                    a sweep's trials

A submission's body is {"spec_file": {path, text, overrides, cwd, home}, "package" (the
project, a base64 zip)}, the spec file as the CLI read it, which the service reads and checks
(201 {"jobs": [views], "sweep", "notes"}; 400 {"error", "errors": [lines]}), or {"specs",
"options", "package"}, specs the caller validated itself (201 {"jobs"}).

The service decides each on the request's token with the same door as its actor calls
(`service/access.py`), and writes the audit entry of every change, refusals included (so the
page's gate lets the changes through to it: `decides_itself`). Answers: JSON with 200 (201
for a new user or queued jobs); 400 `{"error"}` for a body it cannot take or the service's one
line, 401 or 403 (nothing changed), 404 for a job the service does not know, 503 when the
audit log cannot be written.

A submission needs no gate: an app without one (a page embedded elsewhere, tests) takes jobs
only from a body with the cluster's Ray token (`Submitter.token`), and answers the other calls
not at all. Imports no Ray.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hmac
from typing import Any, Protocol

from aiohttp import web

from orchestrator.monitoring.web_auth import token_of
from orchestrator.monitoring.web_json import in_executor, json_reply, refusal_reply

HTTP = "http"  # the route the audit log names (service/access.py)
MAX_SUBMISSION_BYTES = 512 * 1024 * 1024  # the zipped project travels in the body (Ray's own limit)


class Submitter(Protocol):
    """What queues jobs sent over HTTP: the service, guarded by the cluster's token."""

    token: str | None  # None: submitting over HTTP is off (a cluster without token auth)

    def submit_specs(
        self, specs: list[dict], options: list[dict], package: bytes | None, token: str | None = None
    ) -> list[dict]:
        """Validate and queue as the holder of `token` (passed only with a gate); raises
        ValueError with one line a person can act on, PermissionError with `args` (line,
        status) for a caller who may not."""
        ...

    def submit_sent(self, sent: dict, package: bytes | None, token: str | None = None) -> dict:
        """The same for a spec file sent as the CLI read it (text, overrides, the caller's
        directories): {"jobs": views, "sweep", "notes"}; ValueError with every line of a
        spec's errors."""
        ...


class ServiceCalls(Protocol):
    """The service's calls these routes make; each takes the caller's token and the route."""

    def stop(self, job_id: str, now: bool, token: str | None, route: str) -> dict: ...
    def preempt(self, job_id: str, token: str | None, route: str) -> dict: ...
    def apply_queues(self, raw: dict | None, token: str | None, route: str) -> dict | None: ...
    def add_user(self, token: str | None, name: str, team: str, role: str, route: str) -> dict: ...
    def list_users(self, token: str | None, route: str) -> list[dict]: ...
    def revoke_user(self, token: str | None, name: str, route: str) -> dict: ...
    def audit(self, token: str | None, since, until, user, route: str) -> list[dict]: ...
    def sweep(self, name: str, token: str | None, route: str) -> list[dict]: ...


def decides_itself(handler):
    """`handler` as a route whose call the service decides and logs itself, 401s included
    (the gate reads the mark: web_auth.py)."""

    async def route(request: web.Request) -> web.StreamResponse:
        return await handler(request)

    route.decides_itself = True
    return route


def add_write_routes(
    app: web.Application, submitter: Submitter | None, calls: ServiceCalls | None, gated: bool
) -> None:
    """The service's routes on the page's `app`: POST /api/jobs always (without a `submitter`
    it refuses every job); the other calls only behind the service's door (`gated`)."""
    app.router.add_post("/api/jobs", decides_itself(_submit_route(submitter, gated)))
    if gated and calls is not None:
        add_call_routes(app, calls)


def add_call_routes(app: web.Application, service: ServiceCalls) -> None:
    routes = _Calls(service)
    app.router.add_post("/api/jobs/{id}/stop", decides_itself(routes.stop))
    app.router.add_post("/api/jobs/{id}/preempt", decides_itself(routes.preempt))
    app.router.add_put("/api/queues", decides_itself(routes.apply_queues))
    app.router.add_get("/api/users", routes.list_users)
    app.router.add_post("/api/users", decides_itself(routes.add_user))
    app.router.add_delete("/api/users/{name}", decides_itself(routes.revoke_user))
    app.router.add_get("/api/audit", routes.audit)
    app.router.add_get("/api/sweeps/{name}", routes.sweep)


def _submit_route(submitter: Submitter | None, gated: bool):
    """POST /api/jobs: queue the jobs of an authenticated body through `submitter`: the
    service decides on the caller's token (`gated`), else the body must carry the cluster's."""

    async def submit(request: web.Request) -> web.Response:
        refused = _submission_refused(submitter, gated, request)
        if refused is not None:
            return refused
        try:
            body = await request.json()
            package = base64.b64decode(body["package"], validate=True) if body.get("package") else None
            if "spec_file" in body:  # the spec as the CLI read it: the service reads it
                call, given = submitter.submit_sent, (body["spec_file"],)
            else:  # specs the caller validated itself
                specs, options = list(body["specs"]), list(body.get("options") or [{}] * len(body["specs"]))
                call, given = submitter.submit_specs, (specs, options)
        except (ValueError, KeyError, TypeError, AttributeError, binascii.Error):
            body_form = "{spec_file, package} or {specs, options, package}"
            return json_reply({"error": f"the body must be JSON: {body_form}"}, status=400)
        caller = (token_of(request),) if gated else ()
        try:
            done = await in_executor(call, *given, package, *caller)
        except PermissionError as err:  # the service's door: (line, status)
            return refusal_reply(err)
        except ValueError as err:
            lines = str(err).splitlines() or ["refused"]
            return json_reply({"error": lines[0], "errors": lines}, status=400)
        return json_reply(done if isinstance(done, dict) else {"jobs": done}, status=201)

    return submit


def _submission_refused(
    submitter: Submitter | None, gated: bool, request: web.Request
) -> web.Response | None:
    """Why a submission is refused before its body is read, or None."""
    if submitter is None:
        return json_reply({"error": "this page takes no jobs"}, status=403)
    if gated:
        return None  # the gate let the caller in; the service decides on each job's queue
    if submitter.token is None:
        off = "this service takes jobs over HTTP only on a cluster with token auth"
        return json_reply({"error": off}, status=403)
    given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
    if not hmac.compare_digest(given.encode(), submitter.token.encode()):
        return json_reply({"error": "missing or wrong cluster token"}, status=401)
    return None


class BadBody(ValueError):
    """A request whose body or query the route cannot take."""


async def _body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object ({} for an empty body)."""
    if not request.can_read_body:
        return {}
    try:
        body = await request.json()
    except ValueError:
        raise BadBody("the body must be a JSON object") from None
    if not isinstance(body, dict):
        raise BadBody("the body must be a JSON object")
    return body


def _seconds(request: web.Request, name: str) -> float | None:
    text = request.query.get(name)
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        raise BadBody(f"{name} must be a time in seconds since the epoch") from None


def _answer_errors(route):
    """The service's exceptions as answers: refusals with their status, an unknown job 404,
    a call it cannot do (or a body the route cannot take) 400 with its one line."""

    @functools.wraps(route)
    async def answered(self, request: web.Request) -> web.Response:
        try:
            return await route(self, request)
        except PermissionError as err:  # the door's Denied: (line, status)
            return refusal_reply(err)
        except KeyError as err:
            return json_reply({"error": _line(err.args[0] if err.args else err)}, status=404)
        except ValueError as err:
            return json_reply({"error": _line(err)}, status=400)

    return answered


def _line(err: object) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else "refused"


class _Calls:
    def __init__(self, service: ServiceCalls):
        self.service = service

    @_answer_errors
    async def stop(self, request: web.Request) -> web.Response:
        now = (await _body(request)).get("now", False)
        if not isinstance(now, bool):
            raise BadBody("now must be true or false")
        job_id, token = request.match_info["id"], token_of(request)
        return json_reply(await in_executor(self.service.stop, job_id, now, token, HTTP))

    @_answer_errors
    async def preempt(self, request: web.Request) -> web.Response:
        await _body(request)  # nothing to read, but it must be JSON like every change
        job_id, token = request.match_info["id"], token_of(request)
        return json_reply(await in_executor(self.service.preempt, job_id, token, HTTP))

    @_answer_errors
    async def apply_queues(self, request: web.Request) -> web.Response:
        body = await _body(request)
        if "config" not in body:
            raise BadBody('the body must be {"config": a queue configuration, or null to clear it}')
        view = await in_executor(self.service.apply_queues, body["config"], token_of(request), HTTP)
        return json_reply(view)

    @_answer_errors
    async def list_users(self, request: web.Request) -> web.Response:
        return json_reply(await in_executor(self.service.list_users, token_of(request), HTTP))

    @_answer_errors
    async def add_user(self, request: web.Request) -> web.Response:
        body = await _body(request)
        try:
            name, team, role = (str(body[key]) for key in ("name", "team", "role"))
        except KeyError:
            raise BadBody('the body must be {"name", "team", "role"}') from None
        added = await in_executor(self.service.add_user, token_of(request), name, team, role, HTTP)
        return json_reply(added, status=201)

    @_answer_errors
    async def revoke_user(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        return json_reply(await in_executor(self.service.revoke_user, token_of(request), name, HTTP))

    @_answer_errors
    async def audit(self, request: web.Request) -> web.Response:
        since, until = _seconds(request, "since"), _seconds(request, "until")
        user = request.query.get("user") or None
        call = functools.partial(self.service.audit, token_of(request), since, until, user, HTTP)
        return json_reply(await in_executor(call))

    @_answer_errors
    async def sweep(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        return json_reply(await in_executor(self.service.sweep, name, token_of(request), HTTP))
