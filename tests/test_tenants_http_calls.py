"""The service's other calls over HTTP (orchestrator/service/http_calls.py), through aiohttp's
own test client over the real service class without Ray (tests/tenant_harness.py): stop,
preempt, queues apply, users, audit and sweeps. Each is decided by the service's door on the
request's token: allowed; 401 without a valid one; 403 for a caller who may not; every change
and every refusal in the audit log with route `http`; nothing changed on a refusal. Then the
CLI itself over the service's page: a member with only its own token stops its job and is
refused another team's, without joining the cluster.
"""

import asyncio
import json

import pytest
from aiohttp.test_utils import TestClient, TestServer

from core.jobs import JobState
from orchestrator.monitoring.exporter import registry_for
from orchestrator.monitoring.page_view import PageView
from orchestrator.monitoring.web import make_app
from orchestrator.service.tenants import local_admin
from tests.tenant_harness import add_team_users, spec, start_service


@pytest.fixture
def service(tmp_path):
    svc = start_service(str(tmp_path / "store"))
    svc._closing.set()  # no scheduling passes: the tests set the jobs' states themselves
    svc._wake.set()
    try:
        yield svc
    finally:
        svc.shutdown()


@pytest.fixture
def tokens(service):
    service.door.tenants.default = None  # beyond loopback, as `up --metrics-host 0.0.0.0` makes it
    return add_team_users(service)


def with_client(service, body):
    app = make_app(
        PageView(service), registry_for(service), submitter=service, gate=service.door, calls=service
    )

    async def run():
        async with TestClient(TestServer(app)) as client:
            return await body(client)

    return asyncio.run(run())


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def submit(service, token: str, queue: str) -> str:
    return service.submit(spec(queue), {}, None, token)["id"]


def make_running(service, job_id: str) -> None:
    """As an admitted job whose workers started: no cluster in these tests admits one."""
    with service.lock:
        job = service.jobs[job_id]
        service.lifecycle.set_state(job, JobState.ADMITTED, 1.0, event="admitted")
        service.lifecycle.mark_running(job, job.attempt)


def entries(service, **match) -> list[dict]:
    return [e for e in service.audit(None, 0.0) if all(e.get(k) == v for k, v in match.items())]


async def answer(reply) -> tuple[int, object]:
    return reply.status, await reply.json()


def one_line(body: dict) -> str:
    line = body["error"]
    assert line and "\n" not in line
    return line


def test_stop_over_http_a_members_own_job_and_not_another_teams(service, tokens):
    anns, bobs = submit(service, tokens["ann"], "vision-gpu"), submit(service, tokens["bob"], "nlp-gpu")

    async def body(client):
        path = f"/api/jobs/{bobs}/stop"
        nobody = await answer(await client.post(path, json={"now": False}))
        theirs = await answer(await client.post(path, json={"now": False}, headers=bearer(tokens["ann"])))
        viewer = await answer(await client.post(path, json={}, headers=bearer(tokens["vic"])))
        ours = await answer(
            await client.post(f"/api/jobs/{anns}/stop", json={}, headers=bearer(tokens["ann"]))
        )
        unknown = await answer(
            await client.post("/api/jobs/nope/stop", json={}, headers=bearer(tokens["ann"]))
        )
        return nobody, theirs, viewer, ours, unknown

    nobody, theirs, viewer, ours, unknown = with_client(service, body)
    assert nobody[0] == 401 and "no token" in one_line(nobody[1])
    assert theirs[0] == 403 and bobs in one_line(theirs[1]) and "its own jobs" in theirs[1]["error"]
    assert viewer[0] == 403
    assert ours[0] == 200 and ours[1]["state"] == "stopped"
    assert unknown[0] == 404 and "nope" in one_line(unknown[1])
    assert service.jobs[bobs].state is JobState.QUEUED  # refused: nothing changed
    refusals = entries(service, action="stop", outcome="refused", route="http")
    assert sorted((e["user"] or "-", e["status"]) for e in refusals) == [
        ("-", 401),
        ("ann", 403),
        ("vic", 403),
    ]
    assert entries(service, action="stop", outcome="allowed", route="http", user="ann")


def test_stop_now_must_be_true_or_false_and_an_admin_stops_any_job_at_once(service, tokens):
    bobs = submit(service, tokens["bob"], "nlp-gpu")
    make_running(service, bobs)

    async def body(client):
        bad = await client.post(f"/api/jobs/{bobs}/stop", json={"now": "yes"}, headers=bearer(tokens["ada"]))
        now = await client.post(f"/api/jobs/{bobs}/stop", json={"now": True}, headers=bearer(tokens["ada"]))
        return await answer(bad), await answer(now)

    bad, now = with_client(service, body)
    assert bad[0] == 400 and "now" in one_line(bad[1])
    assert now[0] == 200 and now[1]["state"] == "stopped" and "at once" in now[1]["reason"]
    [entry] = entries(service, action="stop", user="ada")
    assert (entry["outcome"], entry["route"], entry["target"]) == ("allowed", "http", f"job {bobs} of bob")


def test_preempt_over_http_a_members_own_running_job_and_not_another_teams(service, tokens):
    anns = submit(service, tokens["ann"], "vision-gpu")
    make_running(service, anns)

    async def body(client):
        path = f"/api/jobs/{anns}/preempt"
        nobody = await answer(await client.post(path, json={}))
        theirs = await answer(await client.post(path, json={}, headers=bearer(tokens["bob"])))
        assert service.jobs[anns].state is JobState.RUNNING and not service.jobs[anns].stop_requested
        bodiless = await client.post(path, headers=bearer(tokens["ann"]))  # what fetch() sends anywhere
        assert bodiless.status == 415 and not service.jobs[anns].stop_requested
        ours = await answer(await client.post(path, json={}, headers=bearer(tokens["ann"])))
        return nobody, theirs, ours

    nobody, theirs, ours = with_client(service, body)
    assert nobody[0] == 401 and theirs[0] == 403 and anns in one_line(theirs[1])
    assert (
        ours[0] == 200 and ours[1]["state"] == "stopping" and service.jobs[anns].stop_requested == "preempt"
    )
    outcomes = [(e["user"], e["outcome"]) for e in entries(service, action="preempt", route="http")]
    assert outcomes == [(None, "refused"), ("bob", "refused"), ("ann", "allowed")]


def test_preempting_a_queued_job_is_the_services_one_line_with_400(service, tokens):
    anns = submit(service, tokens["ann"], "vision-gpu")

    async def body(client):
        return await answer(
            await client.post(f"/api/jobs/{anns}/preempt", json={}, headers=bearer(tokens["ann"]))
        )

    status, reply = with_client(service, body)
    assert status == 400 and "only a running job" in one_line(reply)
    assert [e["outcome"] for e in entries(service, action="preempt")] == ["allowed", "failed"]


NEW_QUEUES = {"queues": {"vision-gpu": {"teams": ["vision"]}, "everyone": {}}}


def test_only_an_admin_applies_queues_over_http_and_a_bad_file_changes_nothing(service, tokens):
    before = service.store.load_queues()

    async def body(client):
        sent = {"config": NEW_QUEUES}
        nobody = await answer(await client.put("/api/queues", json=sent))
        member = await answer(await client.put("/api/queues", json=sent, headers=bearer(tokens["ann"])))
        bad = {"config": {"queues": {"q": {"order": "sideways"}}}}
        broken = await answer(await client.put("/api/queues", json=bad, headers=bearer(tokens["ada"])))
        shapeless = await answer(await client.put("/api/queues", json={}, headers=bearer(tokens["ada"])))
        assert service.store.load_queues() == before  # nothing changed yet
        admin = await answer(await client.put("/api/queues", json=sent, headers=bearer(tokens["ada"])))
        return nobody, member, broken, shapeless, admin

    nobody, member, broken, shapeless, admin = with_client(service, body)
    assert nobody[0] == 401 and member[0] == 403 and "admin" in one_line(member[1])
    assert broken[0] == 400 and "order" in one_line(broken[1]) and shapeless[0] == 400
    assert admin[0] == 200 and sorted(admin[1]["use"]) == ["everyone", "vision-gpu"]
    assert sorted(service.store.load_queues()["queues"]) == ["everyone", "vision-gpu"]
    outcomes = [(e["user"], e["outcome"]) for e in entries(service, action="queues-apply", route="http")]
    assert outcomes == [
        (None, "refused"),
        ("ann", "refused"),
        ("ada", "allowed"),
        ("ada", "failed"),
        ("ada", "allowed"),
    ]


def test_clearing_queues_over_http_sends_null(service, tokens):
    assert service.store.load_queues() is not None  # the harness's

    async def body(client):
        return await client.put("/api/queues", json={"config": None}, headers=bearer(tokens["ada"]))

    reply = with_client(service, body)
    assert reply.status == 200 and service.store.load_queues() is None and service.policy.queue_config is None


def test_users_over_http_only_for_admins(service, tokens):
    async def body(client):
        new = {"name": "cid", "team": "vision", "role": "member"}
        nobody = await answer(await client.post("/api/users", json=new))
        member = await answer(await client.post("/api/users", json=new, headers=bearer(tokens["ann"])))
        listed_by_viewer = await answer(await client.get("/api/users", headers=bearer(tokens["vic"])))
        added = await answer(await client.post("/api/users", json=new, headers=bearer(tokens["ada"])))
        again = await answer(await client.post("/api/users", json=new, headers=bearer(tokens["ada"])))
        cids = await client.get("/api/queue", headers=bearer(added[1]["token"]))
        revoked_by_member = await client.delete("/api/users/cid", json={}, headers=bearer(tokens["ann"]))
        revoked = await answer(await client.delete("/api/users/cid", json={}, headers=bearer(tokens["ada"])))
        cids_after = await client.get("/api/queue", headers=bearer(added[1]["token"]))
        listed = await answer(await client.get("/api/users", headers=bearer(tokens["ada"])))
        statuses = (cids.status, revoked_by_member.status, cids_after.status)
        return nobody, member, listed_by_viewer, added, again, revoked, listed, statuses

    nobody, member, viewer, added, again, revoked, listed, statuses = with_client(service, body)
    assert (nobody[0], member[0], viewer[0]) == (401, 403, 403)
    assert added[0] == 201 and added[1]["token"].startswith("orch_")
    assert again[0] == 400 and "already a user" in one_line(again[1])
    assert revoked[0] == 200 and statuses == (200, 403, 401)
    assert listed[0] == 200 and {u["name"]: u["active"] for u in listed[1]}["cid"] is False
    outcomes = [(e["user"], e["outcome"]) for e in entries(service, action="users-manage", route="http")]
    assert outcomes == [
        (None, "refused"),
        ("ann", "refused"),
        ("ada", "allowed"),
        ("ada", "allowed"),
        ("ada", "failed"),
        ("ann", "refused"),
        ("ada", "allowed"),
    ]


def test_the_audit_log_over_http_only_for_admins_and_by_time_and_user(service, tokens):
    submit(service, tokens["ann"], "vision-gpu")

    async def body(client):
        member = await client.get("/api/audit?since=0", headers=bearer(tokens["ann"]))
        nobody = await client.get("/api/audit?since=0")
        bad = await client.get("/api/audit?since=yesterday", headers=bearer(tokens["ada"]))
        anns = await answer(await client.get("/api/audit?since=0&user=ann", headers=bearer(tokens["ada"])))
        late = await answer(await client.get("/api/audit?since=9999999999", headers=bearer(tokens["ada"])))
        return member.status, nobody.status, bad.status, anns, late

    member, nobody, bad, anns, late = with_client(service, body)
    assert (member, nobody, bad) == (403, 401, 400)
    assert anns[0] == 200 and [e["action"] for e in anns[1]] == ["submit"] and late[1] == []


def test_a_sweeps_trials_over_http_for_readers(service, tokens):
    async def body(client):
        reader = await answer(await client.get("/api/sweeps/none-such", headers=bearer(tokens["vic"])))
        nobody = await client.get("/api/sweeps/none-such")
        return reader, nobody.status

    reader, nobody = with_client(service, body)
    assert reader == (200, []) and nobody == 401


def test_a_change_that_is_not_json_is_refused_before_the_service_hears_of_it(service, tokens):
    """On loopback no token is the local admin: a form another site's page posts must not
    stop anything."""
    service.door.tenants.default = local_admin()
    anns = submit(service, tokens["ann"], "vision-gpu")

    async def body(client):
        form = await client.post(f"/api/jobs/{anns}/stop", data={"now": "true"})
        text = await client.post(
            f"/api/jobs/{anns}/stop", data='{"now": true}', headers={"Content-Type": "text/plain"}
        )
        submit_form = await client.post("/api/jobs", data={"specs": "[]"})
        return form.status, text.status, submit_form.status

    assert with_client(service, body) == (415, 415, 415)
    assert service.jobs[anns].state is JobState.QUEUED and not entries(service, action="stop")


# -- the CLI over the page: a member's own token, no cluster ---------------------------------------


@pytest.fixture
def member_cli(service, tokens, tmp_path, monkeypatch):
    """`orchestrator ARGS` in this process as a user with only its own token: `up`'s record
    names the service's page; joining the cluster (the Ray token's way in) fails the test."""
    from orchestrator import client

    home = tmp_path / "home"
    home.mkdir()
    (home / "cluster.json").write_text(json.dumps({"status_page": service.page_url}))
    monkeypatch.setenv("ORCHESTRATOR_HOME", str(home))
    for name in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)

    def no_cluster(*args, **kwargs):
        raise AssertionError("the CLI joined the cluster: a member has no Ray token")

    monkeypatch.setattr(client, "connected_service", no_cluster)

    def run(user: str, *args: str) -> int:
        from orchestrator.cli import main

        monkeypatch.setenv("ORCHESTRATOR_TOKEN", tokens[user])
        return main(list(args))

    return run


def test_a_member_stops_its_own_job_through_the_page_and_is_refused_another_teams(
    service, member_cli, tokens, capsys
):
    anns, bobs = submit(service, tokens["ann"], "vision-gpu"), submit(service, tokens["bob"], "nlp-gpu")
    make_running(service, bobs)
    assert member_cli("ann", "stop", bobs) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("error: ") and bobs in error[0]
    assert member_cli("ann", "preempt", bobs) == 2
    assert service.jobs[bobs].state is JobState.RUNNING and not service.jobs[bobs].stop_requested
    assert member_cli("ann", "stop", anns) == 0
    assert f"{anns}: stopped" in capsys.readouterr().out
    assert member_cli("bob", "preempt", bobs) == 0 and service.jobs[bobs].stop_requested == "preempt"
    routes = {(e["user"], e["action"], e["outcome"], e["route"]) for e in service.audit(None, 0.0)}
    assert {
        ("ann", "stop", "refused", "http"),
        ("ann", "preempt", "refused", "http"),
        ("ann", "stop", "allowed", "http"),
        ("bob", "preempt", "allowed", "http"),
    } <= routes


def test_a_member_may_not_apply_queues_or_manage_users_through_the_page_and_an_admin_may(
    service, member_cli, tmp_path, capsys
):
    path = tmp_path / "queues.yaml"
    path.write_text("queues:\n  everyone: {}\n")
    assert member_cli("ann", "queues", "apply", str(path)) == 2
    assert (
        "queues apply:" in capsys.readouterr().err and "everyone" not in service.store.load_queues()["queues"]
    )
    assert member_cli("ada", "queues", "apply", str(path)) == 0
    assert list(service.store.load_queues()["queues"]) == ["everyone"]
    capsys.readouterr()
    assert member_cli("ann", "users", "add", "eve", "--team", "vision") == 2
    assert member_cli("ada", "users", "add", "eve", "--team", "vision") == 0
    assert capsys.readouterr().out.strip().startswith("orch_")  # the token alone on stdout
    assert member_cli("ann", "audit") == 2 and member_cli("ada", "audit", "--user", "ann", "--json") == 0
    logged = json.loads(capsys.readouterr().out)
    assert {(e["action"], e["outcome"]) for e in logged} >= {
        ("queues-apply", "refused"),
        ("users-manage", "refused"),
    }
    assert member_cli("ann", "users", "list") == 2 and member_cli("ada", "users", "revoke", "eve") == 0


def test_a_member_on_another_machine_finds_the_page_by_orchestrator_url(
    service, member_cli, tokens, tmp_path, monkeypatch, capsys
):
    """No record of `up` on a user's own machine: $ORCHESTRATOR_URL names the page."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.setenv("ORCHESTRATOR_HOME", str(elsewhere))
    monkeypatch.setenv("ORCHESTRATOR_URL", service.page_url)
    anns = submit(service, tokens["ann"], "vision-gpu")
    assert member_cli("ann", "queue") == 0 and anns in capsys.readouterr().out
    assert member_cli("ann", "stop", anns) == 0 and service.jobs[anns].state is JobState.STOPPED


def test_the_ray_tokens_holder_without_a_token_of_its_own_is_the_admin_where_every_call_needs_one(
    service, member_cli, tokens, monkeypatch, capsys
):
    """`up --require-login`: the CLI, refused (401) without a token, asks again with the Ray
    token from this machine, whose holder is the cluster's admin."""
    from tests.tenant_harness import RAY_TOKEN

    anns = submit(service, tokens["ann"], "vision-gpu")
    monkeypatch.setenv("ORCHESTRATOR_TOKEN", "")
    monkeypatch.setattr("orchestrator.client.caller_token", lambda: None)
    monkeypatch.setenv("RAY_AUTH_TOKEN", RAY_TOKEN)
    from orchestrator.cli import main

    assert main(["stop", anns]) == 0 and service.jobs[anns].state is JobState.STOPPED
    stops = [(e["user"], e["outcome"]) for e in entries(service, action="stop")]
    assert stops == [(None, "refused"), ("cluster-admin", "allowed")]
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    monkeypatch.setenv("HOME", "/nonexistent")  # no ~/.ray/auth_token either
    assert main(["queue"]) == 2 and "no token was sent" in capsys.readouterr().err
