"""A submitted job becomes a queue record: its id, its run (named once, here), its resources,
and its project directory (zipped where it was submitted) unpacked into the store, where the
service starts it from. Imports neither Ray nor torch: the CLI packs here too."""

from __future__ import annotations

import io
import secrets
import time
import zipfile
from pathlib import Path

from core import run_folder, storage
from core.jobs import resources_for
from core.ledger import Ledger
from core.spec import JobSpec
from orchestrator.scheduler.runner import write_spec
from orchestrator.scheduler.store import JobRecord, Store, project_files


def new_job_id(name: str) -> str:
    return f"{name}-{time.strftime('%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def new_record(spec: JobSpec, job_id: str, options: dict, launched_by: str) -> JobRecord:
    """The queue's record of a spec validated at submission. Options: priority, user, sweep fields."""
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
        user=str(options.get("user") or "unknown"),
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


def unpack(store: Store, job_id: str, package: bytes | None, spec: JobSpec) -> str | None:
    """The zipped project directory, unpacked into the store with the spec beside it; its URI."""
    if package is None:
        return None
    uri = store.package_uri(job_id)
    fs, root = storage.resolve(uri)
    with zipfile.ZipFile(io.BytesIO(package)) as archive:
        for item in archive.infolist():
            if item.is_dir() or item.filename.startswith("/") or ".." in item.filename.split("/"):
                continue
            target = f"{root}/{item.filename}"
            fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
            with archive.open(item) as src, fs.open_output_stream(target) as out:
                out.write(src.read())
    write_spec(uri, spec)
    return uri


def zip_project(root: str | Path) -> bytes:
    """The project directory as a zip (the files git would ship), for the job's package."""
    root = Path(root).resolve()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for relative in project_files(root):
            archive.write(root / relative, relative.as_posix())
    return buffer.getvalue()
