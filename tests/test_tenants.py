"""The user registry (orchestrator/service/tenants.py): tokens made, shown once and kept only as
hashes; who a token names; revocation; the identities that come from elsewhere (the loopback
default, the Ray token's admin, the `unknown` owner of old jobs); and the file in the store.

Every test runs on a local store folder; `test_..._object_storage` also on a filesystem that,
like S3, cannot append (tests/object_store_fs.py). On S3 proper the same tests run by opening
the registry on the session's moto server instead of `tmp_path`, e.g.
`Tenants.open(s3.uri("tenants"))` with the `s3` fixture of tests/conftest.py (not done here:
this module starts no server).
"""

import hashlib
import hmac
import json

import pytest

from orchestrator.policy.permissions import Identity, JobTarget, Role
from orchestrator.service import tenants as tenants_module
from orchestrator.service.store import Store
from orchestrator.service.tenants import (
    CLUSTER_ADMIN,
    TOKEN_PREFIX,
    UNKNOWN_OWNER,
    Tenants,
    UserError,
    is_loopback,
    job_owner,
    local_admin,
)
from tests.object_store_fs import append_free


@pytest.fixture
def registry(tmp_path):
    return Tenants.open(str(tmp_path))


def test_a_token_names_its_user_and_is_kept_only_as_its_hash(registry, tmp_path):
    token = registry.add("ann", "vision", "member", by="root", now=100.0)
    assert token.startswith(TOKEN_PREFIX) and len(token) >= len(TOKEN_PREFIX) + 43  # 256 random bits
    assert registry.identify(token) == Identity("ann", "vision", Role.MEMBER)
    stored = (tmp_path / "users.json").read_text()
    assert token not in stored and token.removeprefix(TOKEN_PREFIX) not in stored
    assert json.loads(stored)["users"]["ann"]["token_sha256"] == hashlib.sha256(token.encode()).hexdigest()
    [view] = registry.list_users()
    assert view == {
        "name": "ann",
        "team": "vision",
        "role": "member",
        "created_at": 100.0,
        "created_by": "root",
        "revoked_at": None,
        "revoked_by": None,
        "active": True,
    }


def test_each_user_gets_a_token_of_its_own(registry):
    tokens = {name: registry.add(name, "nlp", role) for name, role in [("bob", "admin"), ("cy", "viewer")]}
    assert tokens["bob"] != tokens["cy"]
    assert registry.identify(tokens["bob"]).role is Role.ADMIN
    assert registry.identify(tokens["cy"]) == Identity("cy", "nlp", Role.VIEWER)


@pytest.mark.parametrize(
    "token",
    ["", None, "orch_" + "x" * 43, "not-a-token", "orch_" + "a" * 5000],
    ids=["empty", "none", "unknown", "foreign", "huge"],
)
def test_a_token_no_user_holds_names_no_one_without_a_default(registry, token):
    registry.add("ann", "vision")
    assert registry.identify(token) is None


def test_a_revoked_token_stops_working_and_the_name_can_be_given_a_new_one(registry):
    old = registry.add("ann", "vision")
    revoked = registry.revoke("ann", by="root", now=200.0)
    assert (revoked.revoked_at, revoked.revoked_by, revoked.active) == (200.0, "root", False)
    assert registry.identify(old) is None
    assert registry.revoke("ann", by="someone else", now=300.0).revoked_at == 200.0  # a retry: done
    assert [u["active"] for u in registry.list_users()] == [False]
    assert registry.list_users(include_revoked=False) == []
    new = registry.add("ann", "nlp", "viewer")
    assert registry.identify(new) == Identity("ann", "nlp", Role.VIEWER)
    assert registry.identify(old) is None


@pytest.mark.parametrize(
    ("name", "team", "role", "words"),
    [
        ("Ann", "vision", "member", "user name 'Ann': use lowercase letters"),
        ("ann", "Vision Team", "member", "team name 'Vision Team': use lowercase"),
        ("ann\n", "vision", "member", "user name 'ann\\n'"),
        ("", "vision", "member", "user name '':"),
        ("ann", "vision", "owner", "role 'owner' is not one of admin, member, viewer"),
        ("unknown", "vision", "member", "the user name 'unknown' is reserved"),
        ("cluster-admin", "vision", "admin", "the user name 'cluster-admin' is reserved"),
        ("bob", "nlp", "member", "there is already a user 'bob' (team nlp); `orchestrator users revoke`"),
    ],
)
def test_a_refused_add_is_one_line_and_changes_nothing(registry, tmp_path, name, team, role, words):
    registry.add("bob", "nlp")
    before = (tmp_path / "users.json").read_bytes()
    with pytest.raises(UserError) as err:
        registry.add(name, team, role)
    assert words in str(err.value) and "\n" not in str(err.value)
    assert (tmp_path / "users.json").read_bytes() == before
    assert [u["name"] for u in registry.list_users()] == ["bob"]


def test_revoking_no_such_user_says_where_the_users_are(registry):
    with pytest.raises(UserError, match="no user 'zed'; `orchestrator users list` shows them"):
        registry.revoke("zed")


def test_a_write_that_fails_changes_nothing_in_memory_either(registry, monkeypatch):
    token = registry.add("ann", "vision")

    def broken(*args):
        raise OSError("store unreachable")

    monkeypatch.setattr(tenants_module, "write_json", broken)
    with pytest.raises(OSError):
        registry.revoke("ann")
    with pytest.raises(OSError):
        registry.add("bob", "nlp")
    assert registry.identify(token) is not None and [u["name"] for u in registry.list_users()] == ["ann"]


def test_identify_compares_with_every_user_in_constant_time(registry, monkeypatch):
    """Each stored hash is compared with hmac.compare_digest, and the first match does not end
    the loop: the time taken does not depend on which user (if any) the token is."""
    tokens = [registry.add(f"user-{i}", "t") for i in range(5)]
    calls = []
    real = hmac.compare_digest
    monkeypatch.setattr(tenants_module.hmac, "compare_digest", lambda a, b: calls.append(b) or real(a, b))
    for token in (tokens[0], tokens[4], "orch_nobody"):
        calls.clear()
        registry.identify(token)
        assert len(calls) == 5


def test_a_restarted_service_reads_the_same_users(registry, tmp_path):
    token = registry.add("ann", "vision", "admin")
    registry.add("bob", "nlp")
    registry.revoke("bob")
    again = Tenants.open(str(tmp_path))
    assert again.identify(token) == Identity("ann", "vision", Role.ADMIN)
    assert again.list_users() == registry.list_users()


def test_a_store_from_before_tenants_opens_with_no_users_and_its_jobs_still_load(tmp_path):
    """Migration: the job files stay as they are; no users.json means no users yet; its jobs
    (records with no team) belong to `unknown`, which only admins act on."""
    Store(str(tmp_path))  # the store as it was
    registry = Tenants.open(str(tmp_path))
    assert registry.list_users() == [] and registry.identify("orch_anything") is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jobs", "packages"]  # nothing written yet
    assert job_owner("old-1", "ada", None) == JobTarget("old-1", *UNKNOWN_OWNER)
    assert job_owner("old-2", None, None) == JobTarget("old-2", "unknown", "unknown")
    assert job_owner("new-1", "ann", "vision") == JobTarget("new-1", "ann", "vision")


def test_fields_of_a_newer_version_are_ignored(tmp_path):
    user = {"team": "t", "role": "viewer", "token_sha256": "0" * 64, "created_at": 1.0, "created_by": ""}
    (tmp_path / "users.json").write_text(json.dumps({"format": 2, "users": {"ann": {**user, "mfa": True}}}))
    assert Tenants.open(str(tmp_path)).list_users()[0]["role"] == "viewer"


def test_the_loopback_default_is_an_explicit_choice(tmp_path):
    """Without a token: nobody by default; the local admin when the service chooses it. A
    token sent is always checked: a wrong one is refused even where the default applies."""
    me = local_admin()
    assert me.role is Role.ADMIN and me.user and me.team == "local"
    quick_start = Tenants.open(str(tmp_path), default=me)
    assert quick_start.identify(None) == me and quick_start.identify("") == me
    assert quick_start.identify("orch_wrong") is None
    assert Tenants.open(str(tmp_path)).identify(None) is None


def test_the_ray_token_admin_is_an_admin_whose_name_no_user_can_take(registry):
    assert CLUSTER_ADMIN.role is Role.ADMIN
    with pytest.raises(UserError, match="reserved"):
        registry.add(CLUSTER_ADMIN.user, "admins", "admin")


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("10.0.0.5", False),
        ("head.example.org", False),
    ],
)
def test_what_counts_as_listening_on_loopback_only(host, loopback):
    assert is_loopback(host) is loopback


def test_the_registry_on_object_storage_writes_whole_files_and_never_appends(tmp_path):
    fs, handler = append_free()  # open_append_stream raises, as on S3
    registry = Tenants(fs, str(tmp_path))
    token = registry.add("ann", "vision")
    registry.add("bob", "nlp")
    registry.revoke("bob")
    users = str(tmp_path / "users.json")
    assert handler.moves[users] == 3 and handler.writes[users] == 0  # written aside, moved into place
    assert Tenants(fs, str(tmp_path)).identify(token) == Identity("ann", "vision", Role.MEMBER)
    assert [p.name for p in tmp_path.iterdir()] == ["users.json"]  # no temporary left behind
