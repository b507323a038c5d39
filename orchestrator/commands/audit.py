"""`orchestrator audit [--since 1h] [--user U] [--json]`: the audit log, oldest first.

Every state-changing call the service answered (submit, stop, preempt, resize, queue and user
changes): when, who (user and team), what, on what, and the outcome: allowed, refused (with the
line the caller got) or failed. The log is in the job store (orchestrator/service/audit.py);
admins read it through the service's `audit` call (over its HTTP API where `up` recorded the
page, else as an actor call), with the caller's token.
"""

from __future__ import annotations

import datetime
import json
import re
import time
import urllib.parse

from orchestrator.commands.options import add_address, with_cluster_errors
from orchestrator.errors import UsageError

DEFAULT_SINCE = "24h"
UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def register(sub) -> None:
    audit = sub.add_parser("audit", help="who changed what, and what was refused (admins)")
    audit.add_argument(
        "--since",
        default=DEFAULT_SINCE,
        metavar="WHEN",
        help=f"a duration back from now (90s, 30m, 1h, 2d, 1w) or a local date and time "
        f"(2024-05-01, 2024-05-01T13:00) (default: {DEFAULT_SINCE})",
    )
    audit.add_argument("--user", metavar="U", help="only this user's calls")
    audit.add_argument("--json", action="store_true", help="the entries as JSON")
    add_address(audit)
    audit.set_defaults(handler=with_cluster_errors(handle_audit))


def parse_since(text: str, now: float) -> float:
    """`--since` as a time in seconds since the epoch; UsageError naming the option."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text)
    if match:
        return now - float(match.group(1)) * UNITS_S[match.group(2)]
    try:
        return datetime.datetime.fromisoformat(text.strip()).timestamp()  # naive: local time
    except ValueError:
        raise UsageError(
            f"audit: --since {text!r} is neither a duration (90s, 30m, 1h, 2d, 1w) nor a date and "
            "time (2024-05-01T13:00)"
        ) from None


def entry_line(entry: dict) -> str:
    """One entry as a line: when, who, what, on what, outcome (and why)."""
    when = datetime.datetime.fromtimestamp(entry["time"]).strftime("%Y-%m-%d %H:%M:%S")
    who = f"{entry['user']} ({entry['team']})" if entry.get("user") else "(no valid token)"
    what = " ".join(filter(None, [entry["action"], entry.get("target")]))
    outcome = entry["outcome"]
    if outcome != "allowed":
        outcome += f" {entry['status']}: {entry.get('reason') or '?'}"
    return f"{when}  {who}  {what}  {outcome}"


def handle_audit(args) -> int:
    from orchestrator import client

    since = parse_since(args.since, time.time())
    query = urllib.parse.urlencode({"since": since, **({"user": args.user} if args.user else {})})
    route = ("GET", f"audit?{query}")
    try:
        entries = client.through_service(
            args.address, route, "audit", client.caller_token(), since, None, args.user
        )
    except client.Refused as err:
        raise client.Refused(f"audit: {err}") from None
    if args.json:
        print(json.dumps(entries, indent=1, sort_keys=True))
        return 0
    if not entries:
        who = f" by {args.user}" if args.user else ""
        print(f"no audited calls{who} since {datetime.datetime.fromtimestamp(since):%Y-%m-%d %H:%M:%S}")
        return 0
    for entry in entries:
        print(entry_line(entry))
    return 0
