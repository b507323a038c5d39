"""A submitted job becomes a queue record: its id, its run (named once, here), its resources,
and its project directory (zipped where it was submitted), kept in the store as that zip with
the job's spec added, which the service starts it from. Imports neither Ray nor torch: the
CLI packs here too."""

from __future__ import annotations

import io
import json
import os
import secrets
import time
import zipfile

from core import run_folder, storage
from core.jobs import resources_for
from core.ledger import Ledger
from core.spec import JobSpec
from orchestrator.service.store import SPEC_IN_PACKAGE, JobRecord, Store


def new_job_id(name: str) -> str:
    return f"{name}-{time.strftime('%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def new_record(spec: JobSpec, job_id: str, options: dict, launched_by: str) -> JobRecord:
    """The queue's record of a spec validated at submission. Options: priority, user and team
    (the owner, from the caller's token), sweep fields."""
    priority = int(options.get("priority", spec.scheduling.priority))
    job = JobRecord(
        id=job_id,
        run=run_folder.run_name(spec),  # every later attempt of the job continues this run
        name=spec.name,
        spec=spec,
        priority=priority,
        queue=spec.scheduling.queue,
        preemptible=spec.scheduling.preemptible,
        workers=spec.resources.max_workers,  # an elastic job runs at one of spec.worker_sizes()
        per_worker=resources_for(spec),
        submitted_at=time.time(),
        launched_by=launched_by,
        user=str(options.get("user") or "unknown"),  # the service sets both from the token
        team=str(options.get("team") or "unknown"),
        sweep=options.get("sweep"),
        sweep_params=options.get("sweep_params") or {},
        sweep_metric=options.get("sweep_metric"),
        sweep_mode=options.get("sweep_mode"),
        sweep_max_concurrent=options.get("sweep_max_concurrent"),
        total_steps=spec.train.steps,
    )
    job.ledger = Ledger(job.submitted_at, workers=job.workers, gpus_per_worker=job.per_worker.get("GPU", 0.0))
    job.log("queued", job.submitted_at, priority=priority, by=launched_by)
    return job


def storage_refusal(spec: JobSpec, shared: list[str], nodes: int) -> str | None:
    """Why the job's `checkpoint.storage` cannot serve it on a cluster of `nodes` nodes (now,
    or once the autoscaler adds them), or None. A local path is a different disk on each
    machine: the ranks of a gang would each leave their part of a checkpoint on their own
    node, and a job restarted on other nodes (a preemption, a node loss) would find none of
    it, or half. Shared storage is a URI (s3://, gs://, hdfs://) or a path the operator
    declared mounted on every node (`orchestrator up --shared-storage PATH`)."""
    uri = spec.checkpoint.storage
    if nodes <= 1 or not storage.is_local(uri):
        return None
    path = os.path.normpath(uri.removeprefix("file://"))
    if any(path == root or path.startswith(root.rstrip("/") + "/") for root in shared):
        return None
    declared = f" (declared shared: {', '.join(shared)})" if shared else ""
    return (
        f"checkpoint.storage: '{uri}' is a local path, and each of this cluster's {nodes} nodes has "
        "a disk of its own: a job's ranks would leave their checkpoints on different machines and a "
        "restart on other nodes would find none of them; use storage every node reaches (s3://, "
        "gs://, hdfs://) or a path every node mounts, declared with `orchestrator up "
        f"--shared-storage PATH`{declared}"
    )


def store_package(store: Store, job_id: str, package: bytes | None, spec: JobSpec) -> str | None:
    """The zipped project directory with the spec added, as one object in the store; its URI.
    The driver the service starts loads the spec from there (`core.spec.load_stored`)."""
    if package is None:
        return None
    return store.put_package(job_id, with_spec(package, spec))


def with_spec(package: bytes, spec: JobSpec) -> bytes:
    """The package with `SPEC_IN_PACKAGE` in it, and only names that stay inside the folder
    it is unpacked into (an absolute name or `..` is dropped)."""
    safe = lambda name: not name.startswith("/") and ".." not in name.split("/")  # noqa: E731
    stored = json.dumps(spec.model_dump(mode="json", by_alias=True), indent=1)
    with zipfile.ZipFile(io.BytesIO(package)) as archive:
        names = [item.filename for item in archive.infolist()]
        if all(safe(name) for name in names) and SPEC_IN_PACKAGE not in names:
            buffer = io.BytesIO(package)  # appended to as it is: nothing decompressed
            with zipfile.ZipFile(buffer, "a", zipfile.ZIP_DEFLATED) as out:
                out.writestr(SPEC_IN_PACKAGE, stored)
            return buffer.getvalue()
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as out:
            for item in archive.infolist():
                if safe(item.filename) and item.filename != SPEC_IN_PACKAGE:
                    out.writestr(item, archive.read(item))
            out.writestr(SPEC_IN_PACKAGE, stored)
    return buffer.getvalue()
