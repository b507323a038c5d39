"""The tenants' commands as a user meets them, with no service running: `users add|list|revoke`,
`login`/`logout`, `audit`; how the client finds the caller's token; the one-line errors and
exit status 2 for bad input or no service. Where a command needs the service, a stand-in
answers the calls the service is to answer (`add_user`, `list_users`, `revoke_user`, `audit`,
each with the caller's token first): that is the contract the service's wiring keeps."""

import contextlib
import datetime
import stat
import sys
import time

import pytest

from orchestrator import cli, client
from orchestrator.commands.audit import entry_line, parse_since

TOKEN = "orch_" + "k" * 43


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A CLI with its own state folder, no token in the environment and no cluster known."""
    monkeypatch.setenv("ORCHESTRATOR_HOME", str(tmp_path / "home"))
    for name in ("ORCHESTRATOR_TOKEN", "RAY_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "home"


class StandIn:
    """The service's user calls, recorded: each is `method(token, *params)`."""

    def __init__(self):
        self.calls = []
        self.users = [
            {"name": "ann", "team": "vision", "role": "member", "active": True, "revoked_by": None},
            {"name": "bob", "team": "nlp", "role": "viewer", "active": False, "revoked_by": "root"},
        ]

    def add_user(self, token, name, team, role):
        self.calls.append(("add_user", token, name, team, role))
        return {"name": name, "team": team, "role": role, "token": "orch_new-token"}

    def list_users(self, token):
        self.calls.append(("list_users", token))
        return self.users

    def revoke_user(self, token, name):
        self.calls.append(("revoke_user", token, name))
        if name == "zed":
            raise client.ServiceError("no user 'zed'; `orchestrator users list` shows them")
        return {"name": name}

    def audit(self, token, since, until, user):
        self.calls.append(("audit", token, since, until, user))
        if token is None:
            raise client.ServiceError("user 'cy' (viewer, team 'nlp') may not read the audit log")
        return [{"time": 1e9, "user": "ann", "team": "vision", "action": "stop", "target": "job j-1 of ann",
                 "outcome": "allowed", "status": 200, "reason": None}]  # fmt: skip


@pytest.fixture
def service(monkeypatch):
    stand_in = StandIn()

    @contextlib.contextmanager
    def connected(address, required=False):
        yield stand_in

    monkeypatch.setattr(client, "connected_service", connected)
    monkeypatch.setattr(client, "call", lambda method, *params: method(*params))
    return stand_in


def test_the_caller_token_comes_from_the_environment_else_the_login_file(home, monkeypatch):
    assert client.caller_token() is None and client.auth_headers() == {}
    home.mkdir()
    (home / "token").write_text(TOKEN + "\n")
    assert client.token_path() == home / "token"
    assert client.caller_token() == TOKEN
    assert client.auth_headers() == {"Authorization": f"Bearer {TOKEN}"}
    monkeypatch.setenv("ORCHESTRATOR_TOKEN", " orch_from-env ")
    assert client.caller_token() == "orch_from-env"  # the environment wins, as RAY_AUTH_TOKEN does
    monkeypatch.setenv("ORCHESTRATOR_TOKEN", "")
    assert client.caller_token() == TOKEN  # set but empty: not set


def login(monkeypatch, text: str) -> int:
    monkeypatch.setattr(sys, "stdin", _Stdin(text))
    return cli.main(["login"])


class _Stdin:
    """A piped stdin (`orchestrator login < token.txt`)."""

    def __init__(self, text):
        self.text = text

    def isatty(self):
        return False

    def readline(self):
        return self.text.splitlines(keepends=True)[0] if self.text else ""


def test_login_keeps_the_token_readable_by_its_owner_only_and_logout_forgets_it(home, monkeypatch, capsys):
    assert login(monkeypatch, TOKEN + "\nignored second line\n") == 0
    path = home / "token"
    assert path.read_text() == TOKEN + "\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(home.stat().st_mode) == 0o700
    assert f"token saved in {path}" in capsys.readouterr().out
    assert client.caller_token() == TOKEN
    assert [p.name for p in home.iterdir()] == ["token"]  # no temporary left
    path.chmod(0o644)  # a later login replaces the file with a private one
    assert login(monkeypatch, "orch_second\n") == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and client.caller_token() == "orch_second"
    assert cli.main(["logout"]) == 0 and not path.exists()
    assert cli.main(["logout"]) == 0
    assert f"no token kept in {path}" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "login: no token given"),
        ("\n", "login: no token given"),
        ("ray-cluster-token-abc\n", "login: that is not an orchestrator token (they start with orch_)"),
        ("orch_two words\n", "login: that token is not one line of printable characters"),
        ("orch_" + "x" * 300 + "\n", "login: that token is not one line"),
    ],
)
def test_login_refuses_what_is_not_a_token_in_one_line(home, monkeypatch, capsys, text, words):
    assert login(monkeypatch, text) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: {words}")
    assert not (home / "token").exists()


def test_login_says_when_the_environment_overrides_the_file(home, monkeypatch, capsys):
    monkeypatch.setenv("ORCHESTRATOR_TOKEN", "orch_env")
    assert login(monkeypatch, TOKEN) == 0
    assert "$ORCHESTRATOR_TOKEN is set, and is used instead of this file" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["users", "add", "Ann", "--team", "vision"], "users: user name 'Ann' is not valid: lowercase"),
        (["users", "add", "ann", "--team", "Vision Team"], "users: team name 'Vision Team' is not valid"),
        (["users", "revoke", "-x-"], None),  # argparse: an option it does not know
        (["audit", "--since", "yesterday"], "audit: --since 'yesterday' is neither a duration"),
        (["users", "list"], "no orchestrator service known here: start one with `orchestrator up`"),
        (["users", "add", "ann", "--team", "vision"], "no orchestrator service known here"),
        (["users", "revoke", "ann"], "no orchestrator service known here"),
        (["audit"], "no orchestrator service known here"),
    ],
)
def test_bad_input_or_no_service_is_one_line_and_exit_2(home, capsys, argv, words):
    if words is None:
        with pytest.raises(SystemExit) as ended:
            cli.main(argv)
        assert ended.value.code == 2
        return
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert err.splitlines() == [f"error: {err.splitlines()[0].removeprefix('error: ')}"]
    assert err.startswith(f"error: {words}") and out == ""


def test_users_add_requires_a_team_and_a_known_role(home, capsys):
    for argv in (["users", "add", "ann"], ["users", "add", "ann", "--team", "t", "--role", "owner"]):
        with pytest.raises(SystemExit) as ended:
            cli.main(argv)
        assert ended.value.code == 2
    err = capsys.readouterr().err
    assert "the following arguments are required: --team" in err
    assert "argument --role: invalid choice: 'owner'" in err  # (how argparse lists the choices varies)


def test_users_add_prints_the_token_alone_on_stdout_and_sends_the_callers_token(
    home, service, capsys, monkeypatch
):
    monkeypatch.setenv("ORCHESTRATOR_TOKEN", TOKEN)
    assert cli.main(["users", "add", "cy", "--team", "nlp", "--role", "viewer"]) == 0
    out, err = capsys.readouterr()
    assert out == "orch_new-token\n"  # `users add ... > cy.token` keeps only the token
    assert "user cy added (team nlp, viewer)" in err and "orchestrator login" in err
    assert service.calls == [("add_user", TOKEN, "cy", "nlp", "viewer")]


def test_users_add_defaults_to_a_member_and_without_a_token_sends_none(home, service, capsys):
    assert cli.main(["users", "add", "cy", "--team", "nlp"]) == 0
    assert service.calls == [("add_user", None, "cy", "nlp", "member")]  # the Ray token's admin


def test_users_list_and_revoke(home, service, capsys):
    assert cli.main(["users", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "TEAM", "ROLE", "STATE"]
    assert lines[1].split() == ["ann", "vision", "member", "active"]
    assert lines[2].split() == ["bob", "nlp", "viewer", "revoked", "by", "root"]
    assert cli.main(["users", "list", "--json"]) == 0
    assert '"name": "ann"' in capsys.readouterr().out
    assert cli.main(["users", "revoke", "ann"]) == 0
    assert capsys.readouterr().out == "user ann revoked: its token no longer works\n"
    assert cli.main(["users", "revoke", "zed"]) == 2
    err = capsys.readouterr().err
    assert err == "error: users revoke: no user 'zed'; `orchestrator users list` shows them\n"
    service.users = []
    assert cli.main(["users", "list"]) == 0
    assert "no users yet" in capsys.readouterr().out


def test_audit_reads_through_the_service_and_a_refusal_is_one_line(home, service, capsys, monkeypatch):
    monkeypatch.setenv("ORCHESTRATOR_TOKEN", TOKEN)
    before = time.time()
    assert cli.main(["audit", "--since", "2h", "--user", "ann"]) == 0
    [(_, token, since, until, user)] = service.calls
    assert (token, until, user) == (TOKEN, None, "ann")
    assert before - 7200 <= since <= time.time() - 7200  # 2 h before the call, however long it took
    assert "ann (vision)  stop job j-1 of ann  allowed" in capsys.readouterr().out
    monkeypatch.delenv("ORCHESTRATOR_TOKEN")
    assert cli.main(["audit"]) == 2
    assert capsys.readouterr().err.startswith("error: audit: user 'cy' (viewer, team 'nlp') may not read")


@pytest.mark.parametrize(
    ("text", "back_s"),
    [("90s", 90), ("30m", 1800), ("1h", 3600), ("1.5h", 5400), ("2d", 172800), ("1w", 604800), (" 1h", 3600)],
)
def test_since_as_a_duration(text, back_s):
    assert parse_since(text, now=1_000_000.0) == 1_000_000.0 - back_s


def test_since_as_a_date_and_time_is_local_time():
    assert parse_since("2024-05-01T13:00", now=0) == datetime.datetime(2024, 5, 1, 13, 0).timestamp()
    assert parse_since("2024-05-01", now=0) == datetime.datetime(2024, 5, 1).timestamp()


def test_an_audit_line_says_when_who_what_and_why_refused():
    at = datetime.datetime(2024, 5, 1, 13, 0, 5).timestamp()
    refused = {
        "time": at,
        "user": None,
        "team": None,
        "action": "submit",
        "target": "queue gpu",
        "outcome": "refused",
        "status": 401,
        "reason": "no token was sent: a valid token is needed",
    }
    assert entry_line(refused) == (
        "2024-05-01 13:00:05  (no valid token)  submit queue gpu  "
        "refused 401: no token was sent: a valid token is needed"
    )
    allowed = {**refused, "user": "root", "team": "ops", "action": "users-manage", "target": ""}
    allowed["outcome"] = "allowed"
    assert entry_line(allowed) == "2024-05-01 13:00:05  root (ops)  users-manage  allowed"


def test_a_user_command_from_a_shell_has_no_traceback(cli, tmp_path):
    """One run as a user runs it (a subprocess), to see the exit status and stderr whole."""
    env = {"ORCHESTRATOR_HOME": str(tmp_path), "RAY_ADDRESS": "", "ORCHESTRATOR_TOKEN": ""}
    result = cli("users", "add", "ann", "--team", "vision", env=env, timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("error: no orchestrator service known here")
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1
