"""The service's one door: who a call's token names, whether `permissions.decide` lets it do
what it asks, and the audit entry of every state-changing call, refusals included.

Every entry point of the service goes through a `Door`, whatever the route: the actor's
methods (`actor.py`) and the HTTP routes (`monitoring/web_auth.py`, through the actor). The
identity comes from the token only, never from a name the request carries:

    route    no token                                  a token
    actor    the Ray token's holder: `CLUSTER_ADMIN`   the Ray token: `CLUSTER_ADMIN`;
    driver   (whoever calls the actor holds it)        else the user it names (or nobody)
    http     the registry's default: the local admin
             on loopback, else nobody (401)

A state-changing call is written to the audit log before it acts: if the entry cannot be
written, the call is refused (no change without a record); if the call then fails, a second
`failed` entry follows. Reads are checked, not logged. Pure of Ray: the unit tests drive it
with a store folder.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
from collections.abc import Callable, Iterator

from orchestrator.policy.permissions import Action, Identity, Target, Verdict, decide, unauthenticated
from orchestrator.service.audit import AuditLog, Entry, entry_of
from orchestrator.service.tenants import CLUSTER_ADMIN, Tenants

log = logging.getLogger("orchestrator.service")

ACTOR, DRIVER, HTTP = "actor", "driver", "http"  # how a call came in (the audit log's `route`)
AUDITED = {
    Action.SUBMIT,
    Action.STOP,
    Action.PREEMPT,
    Action.RESIZE,
    Action.QUEUES_APPLY,
    Action.USERS_MANAGE,
}


class Denied(PermissionError):
    """A refused call: one line for a person, and the HTTP status (401 or 403) it answers with.
    Both travel in `args`, so it crosses Ray's pickling and the client reads `args[0]`."""

    def __init__(self, reason: str, status: int = 403):
        super().__init__(reason, status)

    @property
    def reason(self) -> str:
        return self.args[0]

    @property
    def status(self) -> int:
        return self.args[1]


class Door:
    """`tenants`: the user registry (its default is who an HTTP call without a token is);
    `audit`: the log; `cluster_token`: the Ray cluster's token, whose holder is the admin."""

    def __init__(self, tenants: Tenants, audit: AuditLog, cluster_token: str | None = None):
        self.tenants, self.audit, self.cluster_token = tenants, audit, cluster_token

    def identify(self, token: str | None, route: str) -> Identity | None:
        """Who holds `token` on `route`; None: nobody the service knows (refused with 401). An
        empty token is one sent (an empty `Authorization` header): checked, and refused."""
        if token is None:
            return self.tenants.default if route == HTTP else CLUSTER_ADMIN
        if not token or not token.isascii() or not token.isprintable():  # none of ours, nor Ray's
            return None
        if self.cluster_token and hmac.compare_digest(token.encode(), self.cluster_token.encode()):
            return CLUSTER_ADMIN
        return self.tenants.identify(token)

    def verdict(self, token: str | None, route: str, action: Action, target: Target = None) -> Verdict:
        """The decision alone: for reads, which are not logged."""
        return decide(self.identify(token, route), action, target, token_sent=token is not None)

    def check_read(self, token: str | None, route: str, action: Action = Action.READ) -> Identity:
        """The reader's identity; Denied if it may not read (nothing is logged)."""
        identity = self.identify(token, route)
        verdict = decide(identity, action, None, token_sent=token is not None)
        if not verdict.allowed:
            raise Denied(verdict.reason, verdict.status)
        return identity

    def authenticate(self, token: str | None, route: str, action: Action, **detail) -> Identity:
        """The caller's identity; Denied (401), and the refusal logged, when there is none."""
        identity = self.identify(token, route)
        if identity is None:
            self._refuse(entry_of(None, action, None, unauthenticated(token is not None), route, **detail))
        return identity

    @contextlib.contextmanager
    def acting(
        self,
        token: str | None,
        route: str,
        action: Action,
        target: Target | Callable[[], Target] = None,
        **detail,
    ) -> Iterator[Identity]:
        """`with door.acting(...) as identity:` the call's body runs only when allowed, after
        its audit entry is written. `target` may be a function, called once the caller is
        known (an unknown caller learns nothing of the job it names). Denied when refused;
        a body that raises adds a `failed` entry, and its exception goes on."""
        identity = self.authenticate(token, route, action, **detail)
        wanted = target() if callable(target) else target
        verdict = decide(identity, action, wanted, token_sent=token is not None)
        entry = entry_of(identity, action, wanted, verdict, route, **detail)
        if not verdict.allowed:
            self._refuse(entry)
        self._record(entry, required=action in AUDITED)
        try:
            yield identity
        except Exception as err:
            if action in AUDITED:
                self._record(entry.failed(_first_line(err)), required=False)
            raise

    def _refuse(self, entry: Entry) -> None:
        self._record(entry, required=False)  # refused either way: a failed write changes nothing
        raise Denied(entry.reason, entry.status)

    def _record(self, entry: Entry, required: bool) -> None:
        if entry.action not in {str(a) for a in AUDITED}:
            return
        try:
            self.audit.append(entry)
        except OSError as err:
            log.error("audit entry not written (%s %s): %s", entry.action, entry.outcome, err)
            if required:
                raise Denied(
                    f"the audit log cannot be written ({_first_line(err)}): nothing was done", 503
                ) from None

    def read_audit(self, token: str | None, route: str, since, until, user) -> list[dict]:
        self.check_read(token, route, Action.AUDIT_READ)
        return [entry.to_json() for entry in self.audit.read(since, until, user)]


def _first_line(err: BaseException) -> str:
    text = str(err.args[0] if isinstance(err, KeyError) and err.args else err).strip()
    return text.splitlines()[0] if text else type(err).__name__
