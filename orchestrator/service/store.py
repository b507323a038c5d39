"""The durable job table: one JSON file per job on any pyarrow filesystem, and the lease.

    <store>/jobs/<job id>.json      a JobRecord, rewritten whole on every change
    <store>/service.json            the lease: which service instance owns the queue
    <store>/queues.json             the queue configuration applied last (if any)
    <store>/page.json               the port the service's page took when asked for any free one
    <store>/packages/<job id>.zip   the job's project directory, zipped, with its spec (the Ray
                                    Job's working_dir); one object, however many files

Why files and not a database: the store must outlive the head node, and the one place every
deployment already has that does is the checkpoint storage (NFS, S3, GCS, HDFS through
pyarrow); a database file would need a persistent volume of its own. Each write goes to a
temporary name first and is then moved into place, so a reader (or a service restarted
mid-write) sees the old record or the new one, never half of one. A job table of thousands
of small files loads in well under a second.

The lease makes sure that two services never schedule the same queue: a service takes the
lease with a generation number one higher than the last, renews it every few seconds, and a
second service refuses to start while the lease is fresh. On one Ray cluster the Ray Job
submission id of each attempt (`<job id>-a<attempt>`) is a second guard: Ray refuses a
duplicate.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import posixpath
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow.fs as pafs

from core import storage
from core.jobs import JobState
from core.ledger import Ledger
from core.spec import JobSpec

LEASE_TTL_S = 15.0  # a lease not renewed for this long is free


@dataclass
class JobRecord:
    id: str  # unique in the queue
    name: str  # the spec's name
    spec: JobSpec  # validated once, at submission; stored as JSON
    priority: int
    queue: str
    preemptible: bool
    workers: int
    per_worker: dict[str, float]  # Ray resources of one worker
    submitted_at: float
    run: str = ""  # the run name: checkpoints live in <checkpoint.storage>/<run>/
    state: JobState = JobState.QUEUED
    launched_by: str = "service"  # "service": the service starts each attempt's controller;
    # "driver": a record of an older version, whose own driver ran its attempts
    attempt: int = 0  # admissions so far
    submission_id: str | None = None  # the name of the attempt controller running it now
    driver_node: str | None = None  # where that controller runs: it ends with its attempt
    came_in_by: str | None = None  # the Ray Job that queued it (`ray job submit`), if one did
    placement: dict[str, int] = field(default_factory=dict)  # node id -> workers
    # with replica groups: each group's own placement ({} while a lost group waits for nodes);
    # `placement` is theirs together
    group_placements: list[dict[str, int]] = field(default_factory=list)
    replica_groups: dict[str, dict] = field(default_factory=dict)  # each group as its attempt reports it
    admitted_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    not_before: float = 0.0  # backoff: not admitted again before this time
    stop_requested: str | None = None  # "preempt" or "stop"
    stop_requested_at: float | None = None
    killed: bool = False  # its driver was stopped after the grace period
    failed_starts: int = 0  # in a row: sets the backoff
    last_seen: float = 0.0  # the driver's last call
    preemptions: int = 0
    resizes: int = 0  # restarts of an elastic job at another size
    resize_to: int | None = None  # the size a stop was asked for (None: a plain stop or preemption)
    node_losses: int = 0  # attempts ended by a node of theirs dying
    infrastructure_failures: int = 0  # attempts requeued after their collectives failed, nodes alive
    avoid_nodes: list[str] = field(default_factory=list)  # node ids it is not placed on again
    # (the nodes of stragglers it was restarted away from: `fault_tolerance.on_straggler`)
    unconfirmed_failure: dict[str, Any] | None = None  # a failed attempt's summary, held until
    # the service knows whether one of its nodes died (then it is requeued, not failed)
    steps_lost: int = 0
    # its owner: the user and team of the token that submitted it (users of a `las` queue
    # share it by attained service); a record from before tenants belongs to `unknown`
    user: str = "unknown"
    team: str = "unknown"
    attained_s: float = 0.0  # service over its ended attempts (las.service_rate x seconds held)
    step: int = 0  # the newest step the job reported
    total_steps: int | None = None
    step_time_s: float | None = None  # measured, for the remaining-time estimate
    waited_s: float = 0.0  # time spent waiting in the queue, over every wait that ended
    pending_since: float | None = None  # when its current wait began (None: first wait, or not waiting)
    last_checkpoint: str | None = None
    package: str | None = None  # where its working_dir is kept
    generation: int = 0  # the service generation that admitted it
    reason: str | None = None  # why it failed or stopped
    sweep: str | None = None  # the sweep it belongs to
    sweep_params: dict[str, Any] = field(default_factory=dict)  # this trial's values
    sweep_metric: str | None = None
    sweep_mode: str | None = None
    sweep_max_concurrent: int | None = None  # trials of its sweep that may run at once
    summary: dict[str, Any] | None = None  # the driver's final summary
    history: list[dict[str, Any]] = field(default_factory=list)
    ledger: Ledger | None = None  # where its time went (None: a record from before the ledger)

    def log(self, event: str, now: float | None = None, **detail) -> None:
        """One line of the job's history: queued, admitted, preempted at step N, ..."""
        self.history.append({"time": now if now is not None else time.time(), "event": event, **detail})

    @property
    def placement_size(self) -> int:
        """Workers it holds now (an elastic job: its current size)."""
        return sum(self.placement.values())

    @property
    def remaining_s(self) -> float | None:
        """Estimated seconds left while it runs, from this attempt's measured step times; None
        while unknown or not running (a queued job has no honest estimate)."""
        if self.state is not JobState.RUNNING or self.step_time_s is None or self.total_steps is None:
            return None
        return max(self.total_steps - self.step, 0) * self.step_time_s

    def waited(self, now: float) -> float:
        """Seconds spent waiting in the queue so far, the time it ran not counted."""
        if not self.state.is_pending:
            return self.waited_s
        return self.waited_s + max(now - (self.pending_since or self.submitted_at), 0.0)

    def to_json(self, spec: bool = True, history: bool = True, ledger: bool = True) -> dict[str, Any]:
        """The record as plain JSON, every container copied (what the store writes). A view
        leaves out the spec and the history, and shows its ledger otherwise (`views.py`): they
        are most of the bytes and of the time, and the queue shows thousands of jobs."""
        data = {}
        for name in _field_names():
            if name == "spec":
                data[name] = self.spec_json() if spec else None
            elif name == "state":
                data[name] = self.state.value
            elif (name == "history" and not history) or (name == "ledger" and not ledger):
                data[name] = None
            else:
                data[name] = _plain(getattr(self, name))
        for name, wanted in (("spec", spec), ("history", history)):
            if not wanted:
                del data[name]
        return data

    def spec_json(self) -> dict[str, Any]:
        return self.spec.model_dump(mode="json", by_alias=True)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobRecord:
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}  # fields of newer versions
        if "team" not in data:  # from before tenants: its `user` is what a client claimed
            values["user"] = values["team"] = "unknown"
        values["state"] = JobState(values["state"])
        values["spec"] = JobSpec.model_validate(values["spec"])  # written by `to_json`: a load, not a check
        if values.get("ledger") is not None:
            values["ledger"] = Ledger.from_dict(values["ledger"])
        return cls(**values)


@functools.cache
def _field_names() -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(JobRecord))


_IMMUTABLE = frozenset({str, int, float, bool})


def _plain(value: Any) -> Any:
    """`value` copied as `dataclasses.asdict` copies a field, without its deep copy of every
    number and string (they are immutable): a record is copied on every save and view."""
    if value is None or type(value) in _IMMUTABLE:  # most fields: the cheapest test first
        return value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    return value


class LeaseHeld(RuntimeError):
    """Another service instance owns this store."""


def read_json(fs: pafs.FileSystem, path: str, tries: int = 5) -> Any:
    """A JSON file another process may be rewriting meanwhile. On object storage a read is a
    size, then ranged GETs: one that straddles a rewrite sees part of each version, so a
    document that does not parse is read again."""
    for attempt in range(tries):
        with fs.open_input_stream(path) as src:
            data = src.read()
        try:
            return json.loads(data)
        except ValueError:
            if attempt == tries - 1:
                raise
            time.sleep(0.1 * (attempt + 1))


def find(jobs: dict[str, JobRecord], job_id: str) -> JobRecord | None:
    """The job a person names, by its id or by the Ray Job id of one of its drivers: the one
    it came in by (`ray job submit`), the one running now, or one the service started
    (`<id>-a<attempt>`, the name Ray's dashboard shows). One job, whichever id was at hand."""
    if job_id in jobs:
        return jobs[job_id]
    for job in jobs.values():
        if job_id in (job.came_in_by, job.submission_id):
            return job
    base, marker, attempt = job_id.rpartition("-a")
    return jobs.get(base) if marker and attempt.isdigit() else None


class Store:
    def __init__(self, uri: str):
        self.uri = uri
        self.fs, self.root = storage.resolve(uri)
        for sub in ("jobs", "packages"):
            self.fs.create_dir(posixpath.join(self.root, sub), recursive=True)

    # -- job records ---------------------------------------------------------------------

    def _job_path(self, job_id: str) -> str:
        return posixpath.join(self.root, "jobs", f"{job_id}.json")

    def _write_atomic(self, path: str, data: dict) -> None:
        tmp = f"{path}.tmp-{secrets.token_hex(4)}"
        with self.fs.open_output_stream(tmp) as out:
            out.write(json.dumps(data, indent=1, sort_keys=True).encode())
        self.fs.move(tmp, path)

    def _read_json(self, path: str) -> Any:
        return read_json(self.fs, path)

    def save(self, record: JobRecord) -> None:
        self._write_atomic(self._job_path(record.id), record.to_json())

    def load(self, job_id: str) -> JobRecord | None:
        try:
            return JobRecord.from_json(self._read_json(self._job_path(job_id)))
        except FileNotFoundError:
            return None

    def load_all(self) -> dict[str, JobRecord]:
        selector = pafs.FileSelector(posixpath.join(self.root, "jobs"), allow_not_found=True)
        records = {}
        for info in self.fs.get_file_info(selector):
            if info.type != pafs.FileType.File or not info.path.endswith(".json"):
                continue  # a temporary file of an interrupted write
            record = JobRecord.from_json(self._read_json(info.path))
            records[record.id] = record
        return records

    def exists(self, job_id: str) -> bool:
        return self.fs.get_file_info(self._job_path(job_id)).type == pafs.FileType.File

    # -- the queue configuration (`orchestrator queues apply`, `up --queues`) ----------------

    def _queues_path(self) -> str:
        return posixpath.join(self.root, "queues.json")

    def save_queues(self, config: dict | None) -> None:
        """The applied queue configuration as JSON (a restarted service reloads it); None: none."""
        path = self._queues_path()
        if config is not None:
            self._write_atomic(path, config)
        elif self.fs.get_file_info(path).type == pafs.FileType.File:
            self.fs.delete_file(path)

    def load_queues(self) -> dict | None:
        try:
            return self._read_json(self._queues_path())
        except FileNotFoundError:
            return None

    # -- the lease ------------------------------------------------------------------------

    def _lease_path(self) -> str:
        return posixpath.join(self.root, "service.json")

    def read_lease(self) -> dict | None:
        try:
            return self._read_json(self._lease_path())
        except FileNotFoundError:
            return None

    def acquire_lease(self, owner: str, now: float | None = None) -> int:
        """Take the lease for `owner`; returns the new generation. Raises LeaseHeld when
        another owner renewed it within LEASE_TTL_S."""
        now = time.time() if now is None else now
        lease = self.read_lease()
        if lease and lease["owner"] != owner and now - lease["renewed_at"] < LEASE_TTL_S:
            raise LeaseHeld(
                f"the job store {self.uri} is in use by another orchestrator service "
                f"({lease['owner']}, generation {lease['generation']}); stop it first, or wait "
                f"{LEASE_TTL_S:.0f} s after it died"
            )
        generation = (lease["generation"] if lease else 0) + 1
        self._write_atomic(self._lease_path(), {"owner": owner, "generation": generation, "renewed_at": now})
        return generation

    def renew_lease(self, owner: str, generation: int, now: float | None = None) -> None:
        lease = self.read_lease()
        if lease is None or lease["owner"] != owner or lease["generation"] != generation:
            raise LeaseHeld(f"the job store {self.uri} was taken over by another orchestrator service")
        lease["renewed_at"] = time.time() if now is None else now
        self._write_atomic(self._lease_path(), lease)

    def release_lease(self, owner: str) -> None:
        lease = self.read_lease()
        if lease and lease["owner"] == owner:
            lease["renewed_at"] = 0.0
            self._write_atomic(self._lease_path(), lease)

    # -- the page's port -----------------------------------------------------------------------

    def page_port(self) -> int | None:
        """The port an earlier instance of this store's service served its page on, when it
        was asked for any free one (None: none recorded)."""
        try:
            port = self._read_json(posixpath.join(self.root, "page.json")).get("port")
        except (FileNotFoundError, ValueError, AttributeError):
            return None
        return port if isinstance(port, int) and 0 < port < 65536 else None

    def keep_page_port(self, port: int) -> None:
        self._write_atomic(posixpath.join(self.root, "page.json"), {"port": port})

    # -- packages (working directories) ----------------------------------------------------

    def package_uri(self, job_id: str) -> str:
        return storage.join(self.uri, "packages", f"{job_id}.zip")

    def put_package(self, job_id: str, zipped: bytes) -> str:
        """The job's package as one object: a project of hundreds of files is one write, not one
        per file (on object storage each is a request: 343 files took 25 s under load)."""
        uri = self.package_uri(job_id)
        fs, path = storage.resolve(uri)
        with fs.open_output_stream(path) as out:
            out.write(zipped)
        return uri


SPEC_IN_PACKAGE = ".orchestrator/job.json"  # the job's spec, inside its package (the driver loads it)
