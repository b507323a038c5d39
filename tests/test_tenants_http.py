"""The status page, its JSON API and /metrics behind the service's door (monitoring/web_auth.py),
through aiohttp's own test client over the real service class without Ray
(tests/tenant_harness.py): a bearer token or the login cookie; on loopback no token is the
local admin; beyond it, nothing without a valid token; bad tokens fuzzed: always 401, never a
5xx, nothing changed.
"""

import asyncio
import base64
import json
import secrets

import pytest
from aiohttp.test_utils import TestClient, TestServer

from orchestrator.monitoring.exporter import registry_for
from orchestrator.monitoring.page_view import PageView
from orchestrator.monitoring.queue_query import QueueQuery
from orchestrator.monitoring.web import make_app
from orchestrator.monitoring.web_auth import COOKIE
from orchestrator.service.access import Denied
from orchestrator.service.tenants import Tenants
from tests.tenant_harness import RAY_TOKEN, add_team_users, spec, start_service

READS = ("/api/info", "/api/queue", "/api/queue?limit=5&q=nlp", "/metrics")


@pytest.fixture
def service(tmp_path):
    svc = start_service(str(tmp_path / "store"))
    try:
        yield svc
    finally:
        svc.shutdown()


@pytest.fixture
def tokens(service):
    return add_team_users(service)


def beyond_loopback(service) -> None:
    """As `up --metrics-host 0.0.0.0` makes it: no default identity."""
    service.door.tenants.default = None


def with_client(service, body):
    """Run `await body(client)` against the service's app on aiohttp's test server."""
    app = make_app(
        PageView(service), registry_for(service), submitter=service, gate=service.door, calls=service
    )

    async def run():
        async with TestClient(TestServer(app)) as client:
            return await body(client)

    return asyncio.run(run())


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def submission(queue: str = "shared") -> dict:
    raw = spec(queue).model_dump(mode="json", by_alias=True)
    return {"specs": [raw], "options": [{"user": "someone-else"}], "package": base64.b64encode(b"").decode()}


def test_on_loopback_no_token_reads_and_submits_as_the_local_admin(service):
    async def body(client):
        for path in READS:
            assert (await client.get(path)).status == 200, path
        reply = await client.post("/api/jobs", json=submission("nlp-gpu"))
        assert reply.status == 201, await reply.text()
        return (await reply.json())["jobs"][0]

    view = with_client(service, body)
    assert view["team"] == "local" and view["user"] != "someone-else"


def test_beyond_loopback_every_read_needs_a_token_and_the_page_asks_for_one(service, tokens):
    beyond_loopback(service)

    async def body(client):
        for path in READS:
            reply = await client.get(path)
            assert reply.status == 401 and "no token was sent" in (await reply.json())["error"], path
            assert (await client.get(path, headers=bearer(tokens["vic"]))).status == 200, path
        page = await client.get("/", allow_redirects=False)
        assert page.status == 303 and page.headers["Location"] == "login"
        assert (await client.get("/login")).status == 200
        assert "form-action 'self'" in (await client.get("/login")).headers["Content-Security-Policy"]

    with_client(service, body)


def test_the_login_form_sets_an_httponly_strict_cookie_that_then_opens_the_page(service, tokens):
    beyond_loopback(service)

    async def body(client):
        wrong = await client.post("/api/authenticate", data={"token": "orch_nope"}, allow_redirects=False)
        assert wrong.status == 401 and COOKIE not in wrong.cookies
        reply = await client.post("/api/authenticate", data={"token": tokens["vic"]}, allow_redirects=False)
        assert reply.status == 303
        cookie = reply.headers["Set-Cookie"]
        assert f"{COOKIE}=" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
        assert (await client.get("/api/queue")).status == 200  # the client's jar sends the cookie
        assert (await client.get("/", allow_redirects=False)).status == 200
        await client.post("/api/logout", allow_redirects=False)
        client.session.cookie_jar.clear()
        assert (await client.get("/api/queue")).status == 401

    with_client(service, body)


def test_a_submission_over_http_is_decided_on_the_tokens_user_and_its_queue(service, tokens):
    beyond_loopback(service)

    async def body(client):
        theirs = await client.post("/api/jobs", json=submission("nlp-gpu"), headers=bearer(tokens["ann"]))
        line = (await theirs.json())["error"]
        assert theirs.status == 403 and "nlp-gpu" in line and "\n" not in line
        viewer = await client.post("/api/jobs", json=submission("shared"), headers=bearer(tokens["vic"]))
        assert viewer.status == 403
        ours = await client.post("/api/jobs", json=submission("vision-gpu"), headers=bearer(tokens["ann"]))
        assert ours.status == 201
        nobody = await client.post("/api/jobs", json=submission("shared"))
        assert nobody.status == 401
        ray = await client.post("/api/jobs", json=submission("nlp-gpu"), headers=bearer(RAY_TOKEN))
        assert ray.status == 201  # the Ray token's holder is the cluster's admin
        return (await ours.json())["jobs"][0], (await ray.json())["jobs"][0]

    ann, ray = with_client(service, body)
    assert (ann["user"], ann["team"]) == ("ann", "vision") and ray["user"] == "cluster-admin"
    refusals = [e for e in service.audit(None, 0.0) if e["outcome"] == "refused"]
    assert {(e["user"], e["route"]) for e in refusals} == {("ann", "http"), ("vic", "http"), (None, "http")}


def bad_tokens(tmp_path, good: str) -> dict[str, str]:
    elsewhere = Tenants.open(str(tmp_path / "another-cluster")).add("ann", "vision")  # same name
    return {
        "empty": "",
        "wrong": "orch_" + secrets.token_urlsafe(32),
        "truncated": good[:-1],
        "one character more": good + "A",
        "another cluster's": elsewhere,
        "very long": "orch_" + "A" * 4000,  # far past MAX_TOKEN_CHARS, within a header's limit
        "not ascii": "orch_" + "ü" * 40,
        "control characters": "orch_\x00\x1b[2J",
        "the ray token's prefix": RAY_TOKEN[:-1],
    }


def test_bad_tokens_are_always_401_never_a_5xx_and_change_nothing(service, tokens, tmp_path):
    fuzz = bad_tokens(tmp_path, tokens["ada"])
    for loopback in (True, False):  # a token that is sent is checked, on loopback too
        if not loopback:
            beyond_loopback(service)
        for kind, token in fuzz.items():
            users, jobs, queues = (
                json.dumps(service.list_users(None)),
                set(service.jobs),
                service.store.load_queues(),
            )
            statuses = with_client(service, lambda client, token=token: _every_route(client, token))
            assert set(statuses.values()) == {401}, (kind, loopback, statuses)
            for call in (  # the actor's calls: the same door
                lambda token=token: service.submit(spec("shared"), {}, None, token),
                lambda token=token: service.add_user(token, "eve", "ops", "admin"),
                lambda token=token: service.queue(token=token),
                lambda token=token: service.queue_page(QueueQuery(), token=token),
            ):
                with pytest.raises(Denied) as caught:
                    call()
                assert caught.value.status == 401, kind
            after = json.dumps(service.list_users(None)), set(service.jobs), service.store.load_queues()
            assert after == (users, jobs, queues), kind


CHANGES = (  # the service's other changes (service/http_calls.py), on a job that exists or not
    ("POST", "/api/jobs/x/stop", {"now": True}),
    ("POST", "/api/jobs/x/preempt", {}),
    ("PUT", "/api/queues", {"config": None}),
    ("POST", "/api/users", {"name": "eve", "team": "ops", "role": "admin"}),
    ("DELETE", "/api/users/ada", {}),
)


async def _every_route(client, token: str) -> dict[str, int]:
    """Each route's status for `token`, sent as a bearer token and as the login cookie."""
    raw = token.encode("utf-8", "surrogateescape")
    sendable = all(ord(c) >= 32 for c in token)  # aiohttp's client sends no control characters
    statuses = {}
    for how, headers in (
        ("bearer", {"Authorization": b"Bearer " + raw}),
        ("cookie", {"Cookie": f"{COOKIE}=".encode() + raw}),
    )[: 2 if sendable else 0]:
        headers = {k: v.decode("latin-1") for k, v in headers.items()}  # the bytes as sent
        for path in READS + ("/api/jobs/x",):
            statuses[f"{how} GET {path}"] = (await client.get(path, headers=headers)).status
        for path in ("/api/users", "/api/audit?since=0", "/api/sweeps/x"):
            statuses[f"{how} GET {path}"] = (await client.get(path, headers=headers)).status
        reply = await client.post("/api/jobs", json=submission("shared"), headers=headers)
        statuses[f"{how} POST /api/jobs"] = reply.status
        for method, path, body in CHANGES:
            reply = await client.request(method, path, json=body, headers=headers)
            statuses[f"{how} {method} {path}"] = reply.status
    login = await client.post("/api/authenticate", data={"token": token}, allow_redirects=False)
    statuses["login"] = login.status
    return statuses


def test_a_header_past_the_http_servers_limit_is_its_4xx_before_any_route(service):
    beyond_loopback(service)

    async def body(client):
        reply = await client.get("/api/queue", headers=bearer("orch_" + "A" * 100_000))
        return reply.status

    assert 400 <= with_client(service, body) < 500  # aiohttp's own limit on a header's bytes
