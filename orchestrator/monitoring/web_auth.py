"""Who may read the status page, its JSON API and /metrics: the token of each request, checked
by the service's door (`orchestrator/service/access.py`) before any route runs.

    Authorization: Bearer <token>     the JSON API, /metrics (Prometheus's `authorization`)
    cookie `orchestrator_token`       the page in a browser, set by the login form
    GET  /login                       the form: paste a token once
    POST /api/authenticate            the form's target: a valid token becomes the cookie
                                      (HttpOnly, SameSite=Strict), as Ray's dashboard does
    POST /api/logout                  forgets the cookie

A request without a token is whoever the door takes it for: the local admin while the page
listens on loopback only (the quick start needs no login), else nobody. A token that is sent
is always checked, an empty one too. A refusal is one line of JSON (`{"error"}`) with 401 or
403; the page itself sends a browser without a valid token to the login form. A change (a
route the service decides itself: service/http_calls.py, the submission among them) reaches
the service whatever the token, so that it logs the refusal too; it must come as JSON (else
415), which a browser sends to another site only after a CORS preflight this server never
answers: no other page can make a visitor's browser change anything. Imports no Ray.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from aiohttp import web

from orchestrator.policy.permissions import Action, Verdict

STATIC_DIR = Path(__file__).parent / "static"
COOKIE = "orchestrator_token"
COOKIE_MAX_AGE_S = 7 * 24 * 3600
OPEN_PATHS = ("/login", "/api/authenticate", "/api/logout", "/static/")  # reachable before a login
READING_METHODS = ("GET", "HEAD", "OPTIONS")
MAX_FORM_BYTES = 4096  # a token is a few dozen characters
# the login form posts to the page itself; everything else as the page's own policy
LOGIN_POLICY = (
    "default-src 'self'; script-src 'none'; style-src 'self'; img-src 'self' data:; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)


class Gate(Protocol):
    """What the page asks the service's door (`access.Door`)."""

    def verdict(self, token: str | None, route: str, action: Action) -> Verdict: ...


def token_of(request: web.Request) -> str | None:
    """The token a request carries: its bearer token, else the login cookie; "" for an
    `Authorization` header that is empty or not a bearer token (sent, and refused)."""
    header = request.headers.get("Authorization")
    if header is not None:
        scheme, _, value = header.strip().partition(" ")
        return value.strip() if scheme.lower() == "bearer" else ""
    return request.cookies.get(COOKIE)


def refusal(request: web.Request, verdict: Verdict) -> web.StreamResponse:
    """The page goes to the login form; the API and /metrics answer one line of JSON."""
    if request.path == "/" and request.method == "GET":
        raise web.HTTPSeeOther("login")
    return web.json_response(
        {"error": verdict.reason}, status=verdict.status, headers={"Cache-Control": "no-store"}
    )


def gatekeeper(gate: Gate):
    """The middleware that reads every request's token and lets a reader through; what a
    route then does (a submission) it decides again, on what it does."""

    @web.middleware
    async def check(request: web.Request, handler) -> web.StreamResponse:
        if request.path.startswith(OPEN_PATHS) or request.path == "/favicon.ico":
            return await handler(request)
        if request.method not in READING_METHODS and not _is_json(request):
            return _not_json()
        if getattr(request.match_info.handler, "decides_itself", False):
            return await handler(request)  # the service decides, and logs a refusal too
        verdict = gate.verdict(token_of(request), "http", Action.READ)
        if not verdict.allowed:
            return refusal(request, verdict)
        return await handler(request)

    return check


def _is_json(request: web.Request) -> bool:
    return request.content_type == "application/json"


def _not_json() -> web.Response:
    """A change that is not JSON: a form another site's page posts (our cookie is SameSite,
    but on loopback no token at all is the local admin)."""
    return web.json_response(
        {"error": "a change must be sent as Content-Type: application/json"},
        status=415,
        headers={"Cache-Control": "no-store"},
    )


def add_login_routes(app: web.Application, gate: Gate) -> None:
    async def form(request: web.Request) -> web.StreamResponse:
        headers = {"Cache-Control": "no-cache", "Content-Security-Policy": LOGIN_POLICY}
        return web.FileResponse(STATIC_DIR / "login.html", headers=headers)

    async def authenticate(request: web.Request) -> web.StreamResponse:
        if (request.content_length or 0) > MAX_FORM_BYTES:
            return _login_failed("that is not a token: it is far too long", 401)
        token = str((await request.post()).get("token", "")).strip()
        verdict = gate.verdict(token, "http", Action.READ)
        if not verdict.allowed:
            return _login_failed(verdict.reason, verdict.status)
        response = web.HTTPSeeOther(".")
        response.set_cookie(
            COOKIE, token, max_age=COOKIE_MAX_AGE_S, httponly=True, samesite="Strict", path="/"
        )
        raise response

    async def logout(request: web.Request) -> web.StreamResponse:
        response = web.HTTPSeeOther("login")
        response.del_cookie(COOKIE, path="/")
        raise response

    app.router.add_get("/login", form)
    app.router.add_post("/api/authenticate", authenticate)
    app.router.add_post("/api/logout", logout)


def _login_failed(reason: str, status: int) -> web.Response:
    """A plain page saying why, with the way back to the form (the reason is our own text)."""
    body = (
        "<!doctype html><meta charset=utf-8><title>orchestrator: not logged in</title>"
        f"<p>{_escape(reason)}</p><p><a href=login>try another token</a></p>"
    )
    return web.Response(
        text=body, status=status, content_type="text/html", headers={"Cache-Control": "no-store"}
    )


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
