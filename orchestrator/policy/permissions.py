"""Who may do what: one table of roles and actions, and `decide`, the one function that reads it.

    role     submit          stop / preempt / resize   read   queues-apply   users-manage   audit-read
    admin    any queue       any job                   yes    yes            yes            yes
    member   its team's      its own jobs              yes    -              -              -
    viewer   -               -                         yes    -              -              -

The service asks `decide(identity, action, target)` before every call, whatever the route
(HTTP or an actor call), and acts only on `Allowed`. A `Refused` carries the HTTP status
(401: the caller is not known; 403: known, not allowed) and one line naming what is missing,
which the service sends back and writes to the audit log (`orchestrator/service/audit.py`).

Pure: no Ray, no I/O, nothing of the orchestrator outside this package. The identity comes
from the service's user registry (`orchestrator/service/tenants.py`), never from the request.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class _Named(str, enum.Enum):
    """A str enum that prints as its value (enum.StrEnum is Python 3.11+; we support 3.10)."""

    def __str__(self) -> str:
        return self.value


class Role(_Named):
    ADMIN = "admin"
    MEMBER = "member"
    VIEWER = "viewer"


class Action(_Named):
    SUBMIT = "submit"
    STOP = "stop"
    PREEMPT = "preempt"
    RESIZE = "resize"
    READ = "read"
    QUEUES_APPLY = "queues-apply"
    USERS_MANAGE = "users-manage"  # add, revoke and list users
    AUDIT_READ = "audit-read"  # the audit log names everyone's calls, refused ones too: admins'


@dataclass(frozen=True)
class Identity:
    """An authenticated caller, as the registry knows it."""

    user: str
    team: str
    role: Role


@dataclass(frozen=True)
class QueueTarget:
    """A queue a job is submitted to; `teams` None: every team may use it (a queue the queue
    file leaves open, or does not list)."""

    name: str
    teams: frozenset[str] | None = None


@dataclass(frozen=True)
class JobTarget:
    """A job acted on, by its owner (a job from before tenants: `tenants.UNKNOWN_OWNER`)."""

    job_id: str
    user: str
    team: str


Target = QueueTarget | JobTarget | None


@dataclass(frozen=True)
class Allowed:
    allowed = True


@dataclass(frozen=True)
class Refused:
    status: int  # 401: no valid token; 403: not allowed
    reason: str  # one line for a person: what is missing
    allowed = False


Verdict = Allowed | Refused


class Scope(enum.Enum):
    """How far a grant reaches."""

    ANY = "any"  # every target
    OWN_JOB = "own job"  # a job whose owner is the caller
    TEAM_QUEUE = "team queue"  # a queue that takes the caller's team


# The table. An action a role does not list is refused.
GRANTS: dict[Role, dict[Action, Scope]] = {
    Role.ADMIN: {action: Scope.ANY for action in Action},
    Role.MEMBER: {
        Action.SUBMIT: Scope.TEAM_QUEUE,
        Action.STOP: Scope.OWN_JOB,
        Action.PREEMPT: Scope.OWN_JOB,
        Action.RESIZE: Scope.OWN_JOB,
        Action.READ: Scope.ANY,
    },
    Role.VIEWER: {Action.READ: Scope.ANY},
}

# What each action is done to: the target `decide` must be handed (None: the whole service).
TARGET_KIND: dict[Action, type | None] = {
    Action.SUBMIT: QueueTarget,
    Action.STOP: JobTarget,
    Action.PREEMPT: JobTarget,
    Action.RESIZE: JobTarget,
    Action.READ: None,
    Action.QUEUES_APPLY: None,
    Action.USERS_MANAGE: None,
    Action.AUDIT_READ: None,
}

# How a refusal names an action the caller's role may not do at all.
DOING: dict[Action, str] = {
    Action.SUBMIT: "submit jobs",
    Action.STOP: "stop jobs",
    Action.PREEMPT: "preempt jobs",
    Action.RESIZE: "resize jobs",
    Action.READ: "read the queue",
    Action.QUEUES_APPLY: "apply a queue configuration",
    Action.USERS_MANAGE: "manage users",
    Action.AUDIT_READ: "read the audit log",
}

LOGIN_HINT = "log in with `orchestrator login`, or set ORCHESTRATOR_TOKEN"


def decide(
    identity: Identity | None, action: Action, target: Target = None, *, token_sent: bool = False
) -> Verdict:
    """Allowed, or Refused with its status and one line naming what is missing. `token_sent`:
    whether the call carried a token at all (it tells 'none sent' from 'unknown or revoked').
    A target of the wrong kind for `action` is a bug of the caller: ValueError."""
    _check_target(action, target)
    if identity is None:
        return unauthenticated(token_sent)
    scope = GRANTS[identity.role].get(action)
    if scope is None:
        return Refused(403, f"{_who(identity)} may not {DOING[action]}: {_roles_that_may(action)}")
    if scope is Scope.OWN_JOB and target.user != identity.user:
        return Refused(
            403,
            f"{_who(identity)} may not {action} job {target.job_id!r} of user {target.user!r}: "
            f"a {identity.role} may {action} only its own jobs; an admin may {action} any",
        )
    if scope is Scope.TEAM_QUEUE and target.teams is not None and identity.team not in target.teams:
        return Refused(
            403,
            f"{_who(identity)} may not {action} to queue {target.name!r}: it takes team(s) "
            f"{', '.join(sorted(target.teams))}, not {identity.team!r}",
        )
    return Allowed()


def unauthenticated(token_sent: bool) -> Refused:
    """401, saying whether no token came or the one that came is not (or no longer) valid."""
    if token_sent:
        return Refused(401, f"the token sent is unknown or revoked: a valid token is needed; {LOGIN_HINT}")
    return Refused(401, f"no token was sent: a valid token is needed; {LOGIN_HINT}")


def _check_target(action: Action, target: Target) -> None:
    kind = TARGET_KIND[action]
    if (kind is None and target is not None) or (kind is not None and not isinstance(target, kind)):
        wanted = kind.__name__ if kind else "no target"
        raise ValueError(f"{action} is decided on {wanted}, got {type(target).__name__}")


def _who(identity: Identity) -> str:
    return f"user {identity.user!r} ({identity.role}, team {identity.team!r})"


def _roles_that_may(action: Action) -> str:
    """'needs role admin', or 'needs role admin or member (own jobs)': who holds a grant of it."""
    names = [
        str(role) if scope is Scope.ANY else f"{role} ({scope.value}s)" for role, scope in _holders(action)
    ]
    return "needs role " + " or ".join(names)


def _holders(action: Action) -> list[tuple[Role, Scope]]:
    return [(role, grants[action]) for role, grants in GRANTS.items() if action in grants]
