"""The service's calls behind the door (orchestrator/service/access.py), without Ray: the real
service class over a store folder (tests/tenant_harness.py). Who a token names decides what a
call may do; a refusal is one line, changes nothing and is written to the audit log; a job's
owner comes from the token, never from the options; a store from before reads as `unknown`'s.
"""

import json

import pytest

from core.queues import validate_queue_config
from orchestrator.service.access import Denied
from orchestrator.service.audit import ALLOWED, FAILED, REFUSED
from orchestrator.service.store import Store
from orchestrator.service.tenant_calls import SCRAPER, open_door
from orchestrator.service.tenants import CLUSTER_ADMIN, UNKNOWN
from tests.tenant_harness import add_team_users, spec, start_service


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


def entries(service, **match) -> list[dict]:
    found = service.audit(None, 0.0)
    return [e for e in found if all(e.get(k) == v for k, v in match.items())]


def refused(call, status: int) -> str:
    with pytest.raises(Denied) as caught:
        call()
    assert caught.value.status == status
    line = caught.value.reason
    assert line and "\n" not in line
    return line


def test_a_member_submits_to_its_teams_queue_as_itself_whatever_the_options_claim(service, tokens):
    view = service.submit(spec("vision-gpu"), {"user": "ada", "team": "ops"}, None, tokens["ann"])
    job = service.jobs[view["id"]]
    assert (job.user, job.team) == ("ann", "vision")
    assert (view["user"], view["team"]) == ("ann", "vision")
    shared = service.submit(spec("shared"), {}, None, tokens["bob"])  # a queue without teams
    assert service.jobs[shared["id"]].team == "nlp"
    [entry] = entries(service, action="submit", user="ann")
    assert (entry["outcome"], entry["target"], entry["route"]) == (ALLOWED, "queue vision-gpu", "actor")


def test_a_member_may_not_submit_to_another_teams_queue(service, tokens):
    before = set(service.jobs)
    line = refused(lambda: service.submit(spec("nlp-gpu"), {}, None, tokens["ann"]), 403)
    assert "ann" in line and "nlp-gpu" in line and "vision" in line
    assert set(service.jobs) == before
    [entry] = entries(service, action="submit", outcome=REFUSED)
    assert (entry["user"], entry["status"], entry["reason"]) == ("ann", 403, line)


def test_a_viewer_reads_and_submits_nothing(service, tokens):
    assert service.queue(token=tokens["vic"]) == []
    refused(lambda: service.submit(spec("shared"), {}, None, tokens["vic"]), 403)
    assert not service.jobs


def test_members_stop_and_preempt_only_their_own_jobs_and_admins_any(service, tokens):
    anns = service.submit(spec("vision-gpu"), {}, None, tokens["ann"])["id"]
    line = refused(lambda: service.stop(anns, False, tokens["bob"]), 403)
    assert f"job {anns!r} of user 'ann'" in line
    refused(lambda: service.preempt(anns, tokens["bob"]), 403)
    assert service.jobs[anns].state.value == "queued" and not service.jobs[anns].stop_requested
    # allowed, then it fails (a queued job cannot be preempted): a `failed` entry follows
    with pytest.raises(ValueError, match="only a running job"):
        service.preempt(anns, tokens["ann"])
    outcomes = [e["outcome"] for e in entries(service, action="preempt", user="ann")]
    assert outcomes == [ALLOWED, FAILED]
    assert service.stop(anns, False, tokens["ada"])["state"] == "stopped"  # an admin stops any job
    [stop] = entries(service, action="stop", outcome=ALLOWED)
    assert (stop["user"], stop["target"]) == ("ada", f"job {anns} of ann")


def test_an_unknown_job_is_not_found_and_an_unknown_caller_learns_nothing_of_it(service, tokens):
    with pytest.raises(KeyError, match="no job"):  # the CLI then asks Ray's Jobs API
        service.stop("no-such-job", False, tokens["ann"])
    refused(lambda: service.stop("no-such-job", False, "orch_not-a-token"), 401)


def test_only_admins_apply_queues_or_manage_users_or_read_the_audit_log(service, tokens):
    config = validate_queue_config({"queues": {"only": {}}})
    for who in ("ann", "vic"):
        refused(lambda who=who: service.set_queues(config, tokens[who]), 403)
        refused(lambda who=who: service.add_user(tokens[who], "eve", "vision", "admin"), 403)
        refused(lambda who=who: service.audit(tokens[who], 0.0), 403)
    assert set(service.queues_view()["use"]) == {"vision-gpu", "nlp-gpu", "shared"}  # unchanged
    assert "eve" not in {u["name"] for u in service.list_users(None)}
    assert service.set_queues(config, tokens["ada"])["use"].keys() == {"only"}
    assert {e["user"] for e in entries(service, action="queues-apply", outcome=REFUSED)} == {"ann", "vic"}


def test_a_revoked_token_is_refused_at_once_on_every_call(service, tokens):
    service.submit(spec("vision-gpu"), {}, None, tokens["ann"])
    service.revoke_user(tokens["ada"], "ann")
    line = refused(lambda: service.submit(spec("vision-gpu"), {}, None, tokens["ann"]), 401)
    assert "unknown or revoked" in line
    refused(lambda: service.queue(token=tokens["ann"]), 401)
    assert len(service.jobs) == 1


def test_no_token_on_an_actor_call_is_the_ray_tokens_holder(service):
    view = service.submit(spec("nlp-gpu"))  # any queue: the cluster's admin
    assert (view["user"], view["team"]) == (CLUSTER_ADMIN.user, CLUSTER_ADMIN.team)
    [entry] = entries(service, action="submit")
    assert entry["user"] == CLUSTER_ADMIN.user


def test_a_driver_registering_its_job_is_the_cluster_admin(service, tokens):
    view = service.register(spec("vision-gpu"), {"submission_id": "raysubmit_1", "user": "ann"})
    assert (view["user"], view["team"]) == (CLUSTER_ADMIN.user, CLUSTER_ADMIN.team)
    [entry] = entries(service, action="submit")
    assert (entry["route"], entry["user"]) == ("driver", CLUSTER_ADMIN.user)


def test_a_change_the_audit_log_cannot_record_is_not_made(service, tokens, monkeypatch):
    def broken(entry):
        raise OSError("the store is read-only")

    monkeypatch.setattr(service.door.audit, "append", broken)
    line = refused(lambda: service.submit(spec("vision-gpu"), {}, None, tokens["ann"]), 503)
    assert "audit log cannot be written" in line and not service.jobs


def test_the_scrape_token_is_a_viewers_and_each_up_rotates_it(service):
    first = service.scrape_token()
    assert service.door.identify(first, "http").role.value == "viewer"
    second = service.scrape_token()
    assert service.door.identify(first, "http") is None
    assert service.door.identify(second, "http").user == SCRAPER


def test_a_job_record_from_before_tenants_belongs_to_unknown_which_admins_manage(tmp_path, tokens, service):
    job = service.jobs[service.submit(spec("shared"), {}, None, tokens["ann"])["id"]]
    old_store = Store(str(tmp_path / "old"))
    old_store.save(job)
    path = tmp_path / "old" / "jobs" / f"{job.id}.json"
    record = json.loads(path.read_text())
    del record["team"]  # as a service before tenants wrote it: `user` was whatever the client said
    path.with_name("old-1.json").write_text(json.dumps({**record, "id": "old-1", "user": "ann"}))
    old = old_store.load_all()["old-1"]
    assert (old.user, old.team) == (UNKNOWN, UNKNOWN)
    service.jobs[old.id] = old
    refused(lambda: service.stop(old.id, False, tokens["ann"]), 403)  # not ann's, whatever it said
    assert service.stop(old.id, False, tokens["ada"])["state"] == "stopped"


def test_the_loopback_default_is_the_local_admin_and_only_on_loopback(tmp_path):
    class Config:
        store, single_user, web_host = str(tmp_path), True, "127.0.0.1"

    assert open_door(Config, None).identify(None, "http").role.value == "admin"
    Config.web_host = "0.0.0.0"
    assert open_door(Config, None).identify(None, "http") is None
    Config.web_host, Config.single_user = "127.0.0.1", False  # `up --require-login`
    assert open_door(Config, None).identify(None, "http") is None
    assert open_door(Config, None).identify(None, "actor") == CLUSTER_ADMIN  # the Ray token's


def test_las_counts_service_per_authenticated_user(service, tokens):
    from orchestrator.service.cycle import request

    ann = service.submit(spec("shared", "a"), {"user": "bob"}, None, tokens["ann"])["id"]
    # what the policy's LAS and fair share count by (LAS itself: tests/test_scheduler_las.py)
    assert request(service.jobs[ann]).user == "ann"
