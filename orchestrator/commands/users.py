"""`orchestrator users add NAME --team TEAM [--role R] | list | revoke NAME`: who may use the
service (an admin's commands; the service checks, whoever asks).

`add` prints the new user's token once, alone on stdout (so `> file` keeps only the token), and
what to do with it on stderr; the service keeps only its hash. `revoke` ends a token at once.
Names are checked here before anything is sent: a bad one is one line, exit status 2.

The calls go to the service's HTTP API with the caller's token (`client.caller_token()`), else
to the service actor (joining the cluster, with the Ray token): without a token of its own the
caller is then the Ray token's holder, the cluster's admin (docs/security.md). The service's
side is `add_user`, `list_users` and `revoke_user` (orchestrator/service/tenant_calls.py).
"""

from __future__ import annotations

import json
import re
import sys

from core.spec.schema import NAME_PATTERN
from orchestrator.commands.options import add_address, with_cluster_errors
from orchestrator.errors import UsageError
from orchestrator.policy.permissions import Role

NAME_RULE = "lowercase letters, digits, '-', '_' or '.', starting with a letter or digit (at most 63)"


def register(sub) -> None:
    users = sub.add_parser("users", help="the service's users: add, list, revoke (admins)")
    verbs = users.add_subparsers(dest="verb", metavar="VERB", required=True)
    add = verbs.add_parser("add", help="add a user; prints its token once")
    add.add_argument("name", metavar="NAME")
    add.add_argument("--team", required=True, help="the team whose queues it submits to")
    add.add_argument(
        "--role",
        choices=[str(r) for r in Role],
        default=str(Role.MEMBER),
        help="admin: everything; member: submits to its team's queues and manages its own jobs;"
        " viewer: reads (default: member)",
    )
    add_address(add)
    add.set_defaults(handler=with_cluster_errors(handle_add))
    listing = verbs.add_parser("list", help="the users, their teams and roles (revoked ones too)")
    listing.add_argument("--json", action="store_true", help="as JSON")
    add_address(listing)
    listing.set_defaults(handler=with_cluster_errors(handle_list))
    revoke = verbs.add_parser("revoke", help="end a user's token now")
    revoke.add_argument("name", metavar="NAME")
    add_address(revoke)
    revoke.set_defaults(handler=with_cluster_errors(handle_revoke))


def check_name(kind: str, name: str) -> None:
    if not re.fullmatch(NAME_PATTERN, name):
        raise UsageError(f"users: {kind} name {name!r} is not valid: {NAME_RULE}")


def call_service(address: str | None, verb: str, http: tuple, method: str, *params):
    """`method` of the service (over `http` where the page answers), with the caller's token
    first; its refusals are one line."""
    from orchestrator import client

    try:
        return client.through_service(address, http, method, client.caller_token(), *params)
    except client.Refused as err:
        raise client.Refused(f"users {verb}: {err}") from None


def handle_add(args) -> int:
    check_name("user", args.name)
    check_name("team", args.team)
    body = {"name": args.name, "team": args.team, "role": args.role}
    added = call_service(args.address, "add", ("POST", "users", body), "add_user", *body.values())
    print(added["token"])
    print(
        f"user {args.name} added (team {args.team}, {args.role}); the line above is its token, shown "
        f"this once: give it to {args.name}, who runs `orchestrator login` and pastes it "
        "(or sets ORCHESTRATOR_TOKEN)",
        file=sys.stderr,
    )
    return 0


def handle_list(args) -> int:
    users = call_service(args.address, "list", ("GET", "users"), "list_users")
    if args.json:
        print(json.dumps(users, indent=1, sort_keys=True))
        return 0
    if not users:
        print("no users yet: `orchestrator users add NAME --team TEAM` adds one")
        return 0
    for line in user_lines(users):
        print(line)
    return 0


def user_lines(users: list[dict]) -> list[str]:
    """A header and a line per user: name, team, role, and whether it is revoked."""
    width = max([4, *(len(u["name"]) for u in users)])
    team_width = max([4, *(len(u["team"]) for u in users)])
    lines = [f"{'NAME':<{width}}  {'TEAM':<{team_width}}  {'ROLE':<6}  STATE"]
    for user in users:
        state = "active" if user["active"] else f"revoked by {user.get('revoked_by') or '?'}"
        lines.append(f"{user['name']:<{width}}  {user['team']:<{team_width}}  {user['role']:<6}  {state}")
    return lines


def handle_revoke(args) -> int:
    check_name("user", args.name)
    call_service(args.address, "revoke", ("DELETE", f"users/{args.name}"), "revoke_user", args.name)
    print(f"user {args.name} revoked: its token no longer works")
    return 0
