"""`orchestrator login` and `orchestrator logout`: keep the caller's token on this machine.

`login` reads the token an admin gave you (from a prompt that does not echo it, or from stdin:
`orchestrator login < token.txt`), never from the command line, where `ps` and the shell's
history would show it. It is written to `client.token_path()` ($ORCHESTRATOR_HOME/token, else
~/.orchestrator/token) with mode 0600, in a folder of mode 0700, as ssh and kubectl keep
theirs; $ORCHESTRATOR_TOKEN, when set, takes precedence over the file (CI, containers). The
token is checked for its shape only: the service says whether it is valid, on the next call.
"""

from __future__ import annotations

import getpass
import os
import secrets
import sys

from orchestrator.client import MAX_TOKEN_CHARS, TOKEN_ENV, TOKEN_PREFIX, token_path
from orchestrator.errors import UsageError


def register(sub) -> None:
    login = sub.add_parser("login", help="keep your token (from `orchestrator users add`) on this machine")
    login.set_defaults(handler=handle_login)
    logout = sub.add_parser("logout", help="forget the token `orchestrator login` kept")
    logout.set_defaults(handler=handle_logout)


def read_token() -> str:
    if sys.stdin.isatty():
        return getpass.getpass("token (from `orchestrator users add`, not shown): ")
    return sys.stdin.readline()


def check_token(token: str) -> None:
    if not token:
        raise UsageError("login: no token given; paste the one `orchestrator users add` printed")
    if not token.startswith(TOKEN_PREFIX):
        raise UsageError(
            f"login: that is not an orchestrator token (they start with {TOKEN_PREFIX}); the Ray "
            "cluster's token is not one: ask an admin for yours (`orchestrator users add`)"
        )
    if len(token) > MAX_TOKEN_CHARS or any(c.isspace() or not c.isprintable() for c in token):
        raise UsageError("login: that token is not one line of printable characters; paste it again")


def save_token(token: str) -> str:
    """Write the token where `client.caller_token` finds it, readable by its owner only."""
    path = token_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".token-{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never readable by others
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
    os.replace(tmp, path)
    return str(path)


def handle_login(args) -> int:
    token = read_token().strip()
    check_token(token)
    path = save_token(token)
    print(f"token saved in {path} (readable by you only)")
    if os.environ.get(TOKEN_ENV):
        print(f"note: ${TOKEN_ENV} is set, and is used instead of this file while it is", file=sys.stderr)
    return 0


def handle_logout(args) -> int:
    path = token_path()
    try:
        path.unlink()
        print(f"token removed from {path}")
    except FileNotFoundError:
        print(f"no token kept in {path}")
    if os.environ.get(TOKEN_ENV):
        print(f"note: ${TOKEN_ENV} is still set in this shell", file=sys.stderr)
    return 0
