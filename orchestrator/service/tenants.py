"""The users the service knows: who they are, their team and role, and how a token names them.

    <store>/users.json    {"format": 1, "users": {name: {team, role, token_sha256, created_at,
                           created_by, revoked_at, revoked_by}}}, rewritten whole on a change

An admin adds a user (`orchestrator users add NAME --team TEAM`); the user gets a token of its
own, shown once and kept here only as its SHA-256. A token is `secrets.token_urlsafe(32)`
(256 random bits) behind a prefix that secret scanners can match: for a secret that random a
plain SHA-256 is the standard way to keep it (GitHub and PyPI API tokens are kept so), since
no dictionary or brute force reaches it; a slow password hash (bcrypt, scrypt) only matters for
secrets a person chose, and would cost every call milliseconds. The service holds the table in
memory; `identify` compares the token's hash with every user's with `hmac.compare_digest`,
without stopping at the first match, so its time tells nothing of which hash came close.

One file, not one per user: users are few, only the service writes (it holds the store's
lease), and a whole-file rewrite through a temporary name works on every pyarrow filesystem,
S3 included (`documents.py`). A change is written before memory changes, so a failed write
changes nothing.

Three identities come from elsewhere than the file, each an explicit choice of the service:
- `local_admin()`: the single-user default on loopback, an admin named by the OS user, for a
  call without a token (`Tenants(..., default=local_admin())`): the quick start needs no login.
- `CLUSTER_ADMIN`: a caller holding the Ray cluster's token (an actor call, `ray job submit`);
  that token owns the cluster anyway (docs/security.md).
- `UNKNOWN_OWNER`: whose jobs a store from before tenants holds (`job_owner`); only admins
  act on them.
"""

from __future__ import annotations

import dataclasses
import getpass
import hashlib
import hmac
import ipaddress
import posixpath
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs

from core import storage
from core.spec.schema import NAME_PATTERN
from orchestrator.client import MAX_TOKEN_CHARS, TOKEN_PREFIX
from orchestrator.policy.permissions import Identity, JobTarget, Role
from orchestrator.service.documents import read_json, write_json

USERS_FILE = "users.json"
FORMAT = 1
# TOKEN_PREFIX: what a leaked token is recognised by (in logs, in a secret scanner's rules)

UNKNOWN = "unknown"  # the user and team of a job from before tenants
UNKNOWN_OWNER = (UNKNOWN, UNKNOWN)
CLUSTER_ADMIN = Identity("cluster-admin", "admins", Role.ADMIN)
RESERVED_NAMES = {UNKNOWN, CLUSTER_ADMIN.user}  # names the audit log would confuse


class UserError(ValueError):
    """An add or a revoke that cannot be done (a name taken, no such user): one line."""


@dataclass(frozen=True)
class User:
    name: str
    team: str
    role: Role
    token_sha256: str
    created_at: float
    created_by: str
    revoked_at: float | None = None
    revoked_by: str | None = None

    @property
    def active(self) -> bool:
        return self.revoked_at is None

    def identity(self) -> Identity:
        return Identity(self.name, self.team, self.role)

    def view(self) -> dict[str, Any]:
        """What `users list` shows: everything but the token's hash."""
        data = dataclasses.asdict(self)
        del data["token_sha256"]
        return {**data, "role": str(self.role), "active": self.active}

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "role": str(self.role)}

    @classmethod
    def from_json(cls, name: str, data: dict[str, Any]) -> User:
        names = {f.name for f in dataclasses.fields(cls)} - {"name"}
        values = {k: v for k, v in data.items() if k in names}  # fields of newer versions
        return cls(name=name, **{**values, "role": Role(values["role"])})


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Tenants:
    """The registry of users in a store. `default`: who a call without a token is (None: no
    one, it is refused); the service passes `local_admin()` when it listens on loopback only."""

    def __init__(self, fs: pafs.FileSystem, root: str, default: Identity | None = None):
        self.fs, self.path, self.default = fs, posixpath.join(root, USERS_FILE), default
        self._users = self._load()

    @classmethod
    def open(cls, store_uri: str, default: Identity | None = None) -> Tenants:
        fs, root = storage.resolve(store_uri)
        fs.create_dir(root, recursive=True)
        return cls(fs, root, default)

    def _load(self) -> dict[str, User]:
        try:
            data = read_json(self.fs, self.path)
        except FileNotFoundError:
            return {}  # a store from before tenants, or a new one
        return {name: User.from_json(name, entry) for name, entry in data["users"].items()}

    def _save(self, users: dict[str, User]) -> None:
        """Write first, then take it as the table: a failed write changes nothing."""
        body = {name: user.to_json() for name, user in sorted(users.items())}
        write_json(self.fs, self.path, {"format": FORMAT, "users": body})
        self._users = users

    def add(
        self, name: str, team: str, role: Role | str = Role.MEMBER, by: str = "", now: float | None = None
    ) -> str:
        """Add a user and return its token: the only time it exists in the clear. A revoked
        name may be added again (with a new token); an active one may not."""
        role = _role(role)
        _check_name("user", name)
        _check_name("team", team)
        if name in RESERVED_NAMES:
            raise UserError(f"the user name {name!r} is reserved; choose another")
        existing = self._users.get(name)
        if existing is not None and existing.active:
            raise UserError(
                f"there is already a user {name!r} (team {existing.team}); "
                "`orchestrator users revoke` it first to give it a new token"
            )
        token = new_token()
        created = time.time() if now is None else now
        user = User(name, team, role, token_digest(token), created, by)
        self._save({**self._users, name: user})
        return token

    def revoke(self, name: str, by: str = "", now: float | None = None) -> User:
        """The user's token stops working at once; the user stays listed, as revoked."""
        user = self._users.get(name)
        if user is None:
            raise UserError(f"no user {name!r}; `orchestrator users list` shows them")
        if not user.active:
            return user  # a retried call: already done
        revoked = dataclasses.replace(user, revoked_at=time.time() if now is None else now, revoked_by=by)
        self._save({**self._users, name: revoked})
        return revoked

    def list_users(self, include_revoked: bool = True) -> list[dict[str, Any]]:
        return [u.view() for _, u in sorted(self._users.items()) if include_revoked or u.active]

    def identify(self, token: str | None) -> Identity | None:
        """Who holds `token`: an active user, the default for no token, else None (refused)."""
        if token is None or token == "":
            return self.default
        if len(token) > MAX_TOKEN_CHARS:
            return None
        digest = token_digest(token).encode()
        found = None
        for user in self._users.values():  # every one, no early exit: constant time per table
            if hmac.compare_digest(digest, user.token_sha256.encode()) and user.active:
                found = user
        return found.identity() if found is not None else None


def local_admin() -> Identity:
    """The single-user default on loopback: an admin named by the OS user running the service."""
    try:
        name = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container running as a bare uid)
        name = "local"
    return Identity(name, "local", Role.ADMIN)


def is_loopback(host: str) -> bool:
    """Whether the service's page listens on this machine only (then `local_admin` may apply)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name, or "" / 0.0.0.0-like wildcards: reachable from elsewhere
        return False


def job_owner(job_id: str, user: str | None, team: str | None) -> JobTarget:
    """A job as the permissions see it. A record from before tenants has no team: its user
    field is what a client claimed, not who it was, so it belongs to `unknown` (admins')."""
    if not team or not user:
        return JobTarget(job_id, *UNKNOWN_OWNER)
    return JobTarget(job_id, user, team)


def _role(role: Role | str) -> Role:
    try:
        return Role(role)
    except ValueError:
        raise UserError(f"role {role!r} is not one of {', '.join(map(str, Role))}") from None


def _check_name(kind: str, name: str) -> None:
    if not re.fullmatch(NAME_PATTERN, name or ""):
        raise UserError(
            f"{kind} name {name!r}: use lowercase letters, digits, '-', '_' or '.', "
            "starting with a letter or digit (at most 63)"
        )
