"""The audit log: every state-changing call (submit, stop, preempt, resize, queue and user
changes), who made it, when, on what, and what came of it: allowed, refused (and why), or
allowed and then failed (nothing changed). `orchestrator audit` reads it.

    <store>/audit/<YYYY-MM-DDTHH>/<YYYYMMDDTHHMMSS.ffffff>Z-<random>.json    one entry (UTC)

One small object per entry, in a folder per hour. Object storage cannot append, so a log
there is either many objects or segments rewritten whole; a segment rewritten on every call
costs a read and a write of all of it each time, and two writers (a service and its
successor during a takeover) lose each other's entries. One object per entry is durable the
moment the call returns, is never rewritten, and needs no lock; the state-changing calls are
few (people's commands, not the drivers' reports), so the objects stay few too. The folder per
hour keeps listings short: `--since 1h` lists one or two folders, not the whole history. The
names sort by time, so a listing is in order without reading an entry. (If a store ever holds
too many, an hour's entries can be folded into one file without changing the readers' API.)

The service writes the entry of an allowed call before it acts (no change without a record; a
write that fails refuses the call), and a second, `failed`, entry if the call then raises.
"""

from __future__ import annotations

import calendar
import dataclasses
import posixpath
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow.fs as pafs

from core import storage
from orchestrator.policy.permissions import Action, Identity, JobTarget, QueueTarget, Target, Verdict
from orchestrator.service.documents import is_temporary, read_json, write_json

AUDIT_DIR = "audit"
BUCKET_FORMAT = "%Y-%m-%dT%H"  # one folder per hour, UTC
BUCKET_S = 3600
READERS = 16  # entries fetched at once: one GET each on object storage

ALLOWED, REFUSED, FAILED = "allowed", "refused", "failed"


@dataclass(frozen=True)
class Entry:
    time: float
    user: str | None  # None: no identity (no token, or an unknown one)
    team: str | None
    role: str | None
    action: str
    target: str  # "queue gpu", "job j-1 of ann", "" (the service)
    outcome: str  # allowed, refused, failed
    status: int  # 200; 401 or 403 refused; 400 failed
    reason: str | None = None  # why refused or failed: the line the caller got
    route: str = ""  # how it came in: "http", "actor", "ray-job"
    detail: dict[str, Any] = field(default_factory=dict)  # e.g. the job id a submission made

    def failed(self, reason: str, now: float | None = None) -> Entry:
        """The entry to add when an allowed call then failed (a job too big, an unknown id)."""
        when = time.time() if now is None else now
        return dataclasses.replace(self, time=when, outcome=FAILED, status=400, reason=reason)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Entry:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})  # fields of newer versions


def entry_of(
    identity: Identity | None,
    action: Action,
    target: Target,
    verdict: Verdict,
    route: str,
    *,
    at: float | None = None,
    **detail: Any,
) -> Entry:
    """The entry of one decision (`permissions.decide`) on a call, at time `at` (now if None).
    `detail` is the call's own (a stop's `now`, say): never the entry's time."""
    return Entry(
        time=time.time() if at is None else at,
        user=identity.user if identity else None,
        team=identity.team if identity else None,
        role=str(identity.role) if identity else None,
        action=str(action),
        target=describe(target),
        outcome=ALLOWED if verdict.allowed else REFUSED,
        status=200 if verdict.allowed else verdict.status,
        reason=None if verdict.allowed else verdict.reason,
        route=route,
        detail=detail,
    )


def describe(target: Target) -> str:
    if isinstance(target, QueueTarget):
        return f"queue {target.name}"
    if isinstance(target, JobTarget):
        return f"job {target.job_id} of {target.user}"
    return ""


class AuditLog:
    def __init__(self, fs: pafs.FileSystem, root: str):
        self.fs, self.dir = fs, posixpath.join(root, AUDIT_DIR)
        self._made: set[str] = set()  # hour folders this process created (one call per hour)

    @classmethod
    def open(cls, store_uri: str) -> AuditLog:
        return cls(*storage.resolve(store_uri))

    def append(self, entry: Entry) -> str:
        """Write one entry as a new object; returns its path. Never touches another entry."""
        seconds = int(entry.time)
        bucket = posixpath.join(self.dir, time.strftime(BUCKET_FORMAT, time.gmtime(seconds)))
        if bucket not in self._made:
            self.fs.create_dir(bucket, recursive=True)  # a local path needs it; S3 keeps a marker
            self._made.add(bucket)
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(seconds))
        micros = min(int((entry.time - seconds) * 1e6), 999_999)  # truncated: names sort as times do
        path = posixpath.join(bucket, f"{stamp}.{micros:06d}Z-{secrets.token_hex(4)}.json")
        write_json(self.fs, path, entry.to_json())
        return path

    def read(
        self, since: float | None = None, until: float | None = None, user: str | None = None
    ) -> list[Entry]:
        """Entries with since <= time <= until (either open), of `user` if given, oldest first."""
        paths = [p for bucket in self._buckets(since, until) for p in self._entries_in(bucket)]
        with ThreadPoolExecutor(max_workers=READERS) as pool:
            entries = [Entry.from_json(data) for data in pool.map(lambda p: read_json(self.fs, p), paths)]
        wanted = [
            e
            for e in entries
            if (since is None or e.time >= since)
            and (until is None or e.time <= until)
            and (user is None or e.user == user)
        ]
        return sorted(wanted, key=lambda e: e.time)

    def _buckets(self, since: float | None, until: float | None) -> list[str]:
        """The hour folders that may hold entries between since and until."""
        found = []
        for info in self.fs.get_file_info(pafs.FileSelector(self.dir, allow_not_found=True)):
            start = _bucket_start(posixpath.basename(info.path))
            if info.type != pafs.FileType.Directory or start is None:
                continue
            if (since is None or start + BUCKET_S > since) and (until is None or start <= until):
                found.append(info.path)
        return sorted(found)

    def _entries_in(self, bucket: str) -> list[str]:
        infos = self.fs.get_file_info(pafs.FileSelector(bucket, allow_not_found=True))
        return sorted(
            i.path
            for i in infos
            if i.type == pafs.FileType.File and i.path.endswith(".json") and not is_temporary(i.path)
        )


def _bucket_start(name: str) -> float | None:
    """The UTC second an hour folder starts at; None for a name that is not one."""
    try:
        return float(calendar.timegm(time.strptime(name, BUCKET_FORMAT)))
    except ValueError:
        return None
