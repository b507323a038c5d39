"""The orchestrator's live status page: a small aiohttp app over a `PageSource`.

    GET /                                the page (a static file: every value comes from the API)
    GET /static/...                      its script, styles and the vendored uPlot
    GET /api/info                        the service: generation, store, dashboard, nodes, counts, queues
    GET /api/queue?offset=&limit=&state=&q=
                                         one page of the jobs in queue order (what the page reads):
                                         {"jobs", "offset", "limit", "total", "counts"} (queue_query.py);
                                         each view with its newest rates ("live", "restarts") and a
                                         running job's newest losses ("loss_trail")
    GET /api/queue                       without those: every job's view, as a list (older callers);
                                         ?waiting=N: only the first N waiting jobs, ?finished=0;
                                         ?rates=0: the views alone (what `orchestrator queue` reads)
    GET /api/jobs/{id}                   one job with its history and checkpoints (404 if unknown)
    GET /api/jobs/{id}/metrics?since=N   the job's metrics records with step > N
    GET /metrics                         the registry in Prometheus' text format (404 without one)
    GET /login, POST /api/authenticate   the login form and its cookie (web_auth.py)
    POST /api/jobs, POST /api/jobs/{id}/stop, ...
                                         the service's own HTTP API, added to this app: submit,
                                         stop, preempt, queues, users, audit, sweeps
                                         (orchestrator/service/http_calls.py)

With a `gate` (the service's door) every route but the login's and the static files reads the
request's token first and answers 401 or 403 to whoever may not read (web_auth.py); a
submission and the other changes go to the service whatever the token: it decides (a
submission per job, on its queue) and logs the refusal too. Without one (a page embedded elsewhere,
tests) it reads openly and takes jobs only with the cluster's token.

The service actor is a threaded Ray actor with no event loop of its own, so `serve` runs the
app on a loop in a background thread. Source calls may block (the service holds a lock), so
they run in the loop's executor, never on the loop itself. Nothing here imports Ray.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import prometheus_client
from aiohttp import web

from orchestrator.monitoring.exporter import exposition
from orchestrator.monitoring.live_rates import LiveRates, restarts
from orchestrator.monitoring.queue_query import QueueQuery, is_paged
from orchestrator.monitoring.web_auth import Gate, add_login_routes, gatekeeper
from orchestrator.monitoring.web_json import in_executor, json_reply

if TYPE_CHECKING:
    from orchestrator.service.http_calls import ServiceCalls, Submitter

STATIC_DIR = Path(__file__).parent / "static"

# what a page may load and run: only its own files; an injected tag could do nothing even if
# some value ever escaped the page's text-only rendering
PAGE_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


class PageSource(Protocol):
    """What the orchestrator service gives the page; every method returns plain JSON-able data."""

    def info(self) -> dict:
        """{"generation", "store", "dashboard", "started_at", "nodes", "jobs": {state: count},
        "resources": {"total": {...}, "busy": {...}}}"""
        ...

    def queue(self, waiting: int | None = None, finished: bool = True) -> list[dict]:
        """Job views in queue order, finished jobs included (no history); `waiting`: only the
        first that many of the waiting jobs; `finished`: False leaves finished jobs out."""
        ...

    def queue_page(self, query: QueueQuery) -> dict:
        """One page of the jobs `query` asks for (no history): `query.select`'s page as
        {"jobs", "offset", "limit", "total", "counts"}."""
        ...

    def job(self, job_id: str) -> dict | None:
        """A job view with "history" and "checkpoints" (URIs, newest last); None if unknown."""
        ...

    def metrics(self, job_id: str, since_step: int, newest: int | None = None) -> list[dict]:
        """The job's metrics records with step > since_step (`newest`: only that many, the
        newest): training records ("step", "loss",
        "lr", "samples_per_s", "tokens_per_s", "mfu", ...) and eval records ("step", "eval_*")."""
        ...


def _not_found(job_id: str) -> web.Response:
    return json_reply({"error": f"no job '{job_id}' in the orchestrator's queue"}, status=404)


def make_app(
    source: PageSource,
    registry: prometheus_client.CollectorRegistry | None = None,
    submitter: Submitter | None = None,
    gate: Gate | None = None,
    calls: ServiceCalls | None = None,
) -> web.Application:
    """The status page's app; host it with `serve` (or any aiohttp runner). Without a
    `submitter` it only reads; with a `gate`, only for those the gate lets in. The service's own
    routes come with it (service/http_calls.py): the submissions through `submitter`, and with a
    gate, `calls` answers the routes that stop, preempt, apply queues and manage users."""
    # here, not at the top: monitoring loads nothing of the service until an app is made
    from orchestrator.service.http_calls import MAX_SUBMISSION_BYTES, add_write_routes

    reads = _Reads(source, registry)
    middlewares = [_headers] if gate is None else [_headers, gatekeeper(gate)]
    app = web.Application(middlewares=middlewares, client_max_size=MAX_SUBMISSION_BYTES)
    if gate is not None:
        add_login_routes(app, gate)
    app.router.add_get("/", _page)
    app.router.add_static("/static/", STATIC_DIR)
    app.router.add_get("/api/info", reads.info)
    app.router.add_get("/api/queue", reads.queue)
    app.router.add_get("/api/jobs/{id}", reads.job)
    app.router.add_get("/api/jobs/{id}/metrics", reads.job_metrics)
    app.router.add_get("/metrics", reads.metrics)
    add_write_routes(app, submitter, calls, gated=gate is not None)
    return app


async def _page(request: web.Request) -> web.StreamResponse:
    return web.FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})


@web.middleware
async def _headers(request: web.Request, handler) -> web.StreamResponse:
    response = await handler(request)
    response.headers.setdefault("Content-Security-Policy", PAGE_POLICY)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "no-referrer")
    if request.path.startswith("/static/"):
        response.headers.setdefault("Cache-Control", "no-cache")  # revalidate: new versions show
    return response


class _Reads:
    """The app's GET routes over a `PageSource` (and the Prometheus registry, if any)."""

    def __init__(self, source: PageSource, registry: prometheus_client.CollectorRegistry | None):
        self.source, self.registry = source, registry
        self.live = LiveRates(source)

    async def info(self, request: web.Request) -> web.Response:
        return json_reply(await in_executor(self.source.info))

    async def queue(self, request: web.Request) -> web.Response:
        """?offset=&limit=&state=&q=: one page and its totals (the status page). Without them,
        the plain list: ?waiting=N, the jobs holding resources and the first N waiting;
        ?finished=0, no finished jobs; else every job."""
        if is_paged(request.query):
            return await self.queue_page(request)
        asked = {}
        try:
            if "waiting" in request.query:
                asked["waiting"] = max(int(request.query["waiting"]), 0)
        except ValueError:
            return json_reply({"error": "waiting must be a number of jobs"}, status=400)
        if "finished" in request.query:
            asked["finished"] = request.query["finished"] not in ("0", "false", "no")
        views = await in_executor(functools.partial(self.source.queue, **asked))
        if _no_rates(request):  # no metrics read, half the bytes
            return json_reply(views)
        return json_reply(await in_executor(self.live.annotate, views))

    async def queue_page(self, request: web.Request) -> web.Response:
        try:
            query = QueueQuery.from_params(request.query)
        except ValueError as err:
            return json_reply({"error": str(err)}, status=400)
        page = await in_executor(self.source.queue_page, query)
        if not _no_rates(request):  # the rates of this page's running jobs only
            page["jobs"] = await in_executor(self.live.annotate, page["jobs"])
        return json_reply(page)

    async def job(self, request: web.Request) -> web.Response:
        job_id = request.match_info["id"]
        try:
            view = await in_executor(self.source.job, job_id)
        except KeyError:
            view = None
        if view is None:
            return _not_found(job_id)
        return json_reply({**view, "restarts": restarts(view)})

    async def job_metrics(self, request: web.Request) -> web.Response:
        job_id = request.match_info["id"]
        try:
            since = int(request.query.get("since", "-1"))
        except ValueError:
            return json_reply({"error": "since must be a step number"}, status=400)
        try:
            records = await in_executor(self.source.metrics, job_id, since)
        except KeyError:
            return _not_found(job_id)
        return json_reply(records)

    async def metrics(self, request: web.Request) -> web.Response:
        if self.registry is None:
            return json_reply(
                {"error": "this orchestrator service exports no Prometheus metrics"}, status=404
            )
        body = await in_executor(exposition, self.registry)
        return web.Response(body=body, headers={"Content-Type": prometheus_client.CONTENT_TYPE_LATEST})


def _no_rates(request: web.Request) -> bool:
    return request.query.get("rates") in ("0", "false", "no")


class PageServer:
    """An app running on an event loop of its own in a daemon thread; `stop()` ends both."""

    def __init__(self, app: web.Application, host: str, port: int, start_timeout_s: float = 30.0):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="orchestrator-status-page", daemon=True
        )
        self.thread.start()
        self.runner = web.AppRunner(app, access_log=None)
        try:
            bound = self._wait(self._start(host, port), start_timeout_s)
        except BaseException:  # e.g. the port is taken: leave no thread or half-set-up runner behind
            try:
                self._wait(self.runner.cleanup(), 5.0)
            finally:
                self._close_loop()
            raise
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{bound[1]}/"
        self._stopped = False

    async def _start(self, host: str, port: int) -> tuple:
        await self.runner.setup()
        await web.TCPSite(self.runner, host, port).start()
        return self.runner.addresses[0]  # the bound (host, port): port 0 asked for a free one

    async def _shutdown(self) -> None:
        await self.runner.cleanup()
        await self.loop.shutdown_default_executor()

    def _wait(self, coroutine, timeout_s: float):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    def _close_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        if not self.thread.is_alive():
            self.loop.close()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Close the listening socket and every connection, then end the loop's thread."""
        if self._stopped:
            return
        self._stopped = True
        try:
            self._wait(self._shutdown(), timeout_s)
        finally:
            self._close_loop()


def serve(app: web.Application, host: str = "127.0.0.1", port: int = 0) -> tuple[PageServer, str]:
    """Start `app` on host:port in a background thread; port 0 picks a free one. Returns the
    server (call `stop()` to end it) and the URL it answers on. Loopback by default: exposing
    the page beyond the machine is the caller's explicit choice."""
    server = PageServer(app, host, port)
    return server, server.url
