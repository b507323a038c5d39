"""The audit log (orchestrator/service/audit.py): one object per entry in a folder per hour,
read back in order with the `since`, `until` and `user` filters, never appended to or
rewritten (so it works on S3), and the entries the permissions' decisions make.

On a local store folder and on a filesystem that, like S3, cannot append
(tests/object_store_fs.py). On S3 proper the same runs with `AuditLog.open(s3.uri("audit"))`
and the `s3` fixture of tests/conftest.py (moto; not started by this module).
"""

import json

import pytest

from orchestrator.policy.permissions import Action, Identity, JobTarget, QueueTarget, Role, decide
from orchestrator.service.audit import ALLOWED, FAILED, REFUSED, AuditLog, describe, entry_of
from tests.object_store_fs import append_free

T0 = 1_714_568_400.0  # 2024-05-01 13:00:00 UTC
ANN = Identity("ann", "vision", Role.MEMBER)
ROOT = Identity("root", "ops", Role.ADMIN)
GPU = QueueTarget("gpu", frozenset({"nlp"}))


ANNS_JOB = JobTarget("j-1", "ann", "vision")


def entry(at: float, who: Identity | None = ANN, action=Action.STOP, target=ANNS_JOB):
    return entry_of(who, action, target, decide(who, action, target), route="http", at=at)


@pytest.fixture(params=["local", "append-free"])
def log(request, tmp_path):
    if request.param == "local":
        return AuditLog.open(str(tmp_path))
    fs, handler = append_free()
    audit = AuditLog(fs, str(tmp_path))
    audit.handler = handler  # for the test that counts writes
    return audit


def test_entries_come_back_in_order_and_filtered(log):
    times = [T0 + 5, T0 + 3600 * 2 + 1, T0 + 1, T0 + 3600 + 0.5, T0 + 1.000001]
    for i, t in enumerate(times):
        log.append(entry(t, who=ANN if i % 2 == 0 else ROOT))
    everything = log.read()
    assert [e.time for e in everything] == sorted(times)
    assert [e.time for e in log.read(since=T0 + 3600)] == [T0 + 3600 + 0.5, T0 + 3600 * 2 + 1]
    assert [e.time for e in log.read(until=T0 + 5)] == [T0 + 1, T0 + 1.000001, T0 + 5]
    assert [e.time for e in log.read(since=T0 + 2, until=T0 + 3601)] == [T0 + 5, T0 + 3600 + 0.5]
    assert {e.user for e in log.read(user="root")} == {"root"} and len(log.read(user="root")) == 2
    assert log.read(user="nobody") == [] and log.read(since=T0 + 10**6) == []


def test_each_entry_is_one_object_in_its_hour_never_rewritten(log, tmp_path):
    for t in (T0 + 1, T0 + 1, T0 + 59 * 60, T0 + 3600):  # two in the same microsecond
        log.append(entry(t))
    hours = sorted(p.name for p in (tmp_path / "audit").iterdir())
    assert hours == ["2024-05-01T13", "2024-05-01T14"]
    names = sorted(p.name for p in (tmp_path / "audit" / "2024-05-01T13").iterdir())
    assert len(names) == 3 and names[0].startswith("20240501T130001.000000Z-")
    handler = getattr(log, "handler", None)
    if handler is not None:  # on the append-free filesystem: each object written once, moved once
        assert all(n == 1 for n in handler.writes.values()) and all(n == 1 for n in handler.moves.values())
        assert len(handler.moves) == 4


def test_an_entry_says_who_when_what_and_the_outcome():
    allowed = entry(T0, who=ANN)
    assert (allowed.user, allowed.team, allowed.role, allowed.action) == ("ann", "vision", "member", "stop")
    assert (allowed.target, allowed.outcome, allowed.status) == ("job j-1 of ann", ALLOWED, 200)
    assert allowed.reason is None
    refused = entry(T0, who=ANN, action=Action.SUBMIT, target=GPU)
    assert (refused.outcome, refused.status, refused.target) == (REFUSED, 403, "queue gpu")
    assert "may not submit to queue 'gpu'" in refused.reason
    nobody = entry(T0, who=None)
    assert (nobody.user, nobody.team, nobody.status, nobody.outcome) == (None, None, 401, REFUSED)
    failed = allowed.failed("no job 'j-1' in the queue", now=T0 + 1)
    assert (failed.outcome, failed.status, failed.time, failed.user) == (FAILED, 400, T0 + 1, "ann")
    assert describe(None) == "" and entry(T0, ROOT, Action.USERS_MANAGE, None).target == ""


def test_what_was_written_is_what_is_read(log, tmp_path):
    made = entry_of(ROOT, Action.SUBMIT, GPU, decide(ROOT, Action.SUBMIT, GPU), "actor", at=T0, job_id="x-1")
    path = log.append(made)
    assert json.loads(open(path).read())["detail"] == {"job_id": "x-1"}
    assert log.read() == [made]


def test_temporary_names_and_strangers_in_the_folder_are_skipped(log, tmp_path):
    log.append(entry(T0 + 1))
    hour = tmp_path / "audit" / "2024-05-01T13"
    (hour / "20240501T130002.000000Z-abcd.json.tmp-1234").write_text("{half")  # an interrupted write
    (tmp_path / "audit" / "notes").mkdir()  # not an hour folder
    (tmp_path / "audit" / "README").write_text("hello")
    assert [e.time for e in log.read()] == [T0 + 1]


def test_a_store_without_an_audit_log_reads_as_empty(tmp_path):
    assert AuditLog.open(str(tmp_path / "never-written")).read(since=0) == []


def test_reading_since_an_hour_lists_only_the_folders_it_needs(log, tmp_path, monkeypatch):
    for hour in range(48):
        log.append(entry(T0 + hour * 3600 + 10))
    listed = []
    real = log._entries_in
    monkeypatch.setattr(log, "_entries_in", lambda bucket: listed.append(bucket) or real(bucket))
    recent = log.read(since=T0 + 47 * 3600 - 60)  # the last minute of hour 46, and hour 47
    assert [e.time for e in recent] == [T0 + 47 * 3600 + 10]
    assert len(listed) == 2


def test_a_calls_own_now_is_a_detail_never_the_entrys_time():
    """`orchestrator stop` sends now=False: it once became the entry's time (1970), and
    `audit --since` never showed the stop."""
    made = entry_of(ROOT, Action.STOP, ANNS_JOB, decide(ROOT, Action.STOP, ANNS_JOB), "http", now=False)
    assert made.time > T0 and made.detail == {"now": False}
