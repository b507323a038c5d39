"""A run's folder: where a job's checkpoints and metrics live, and how they are named.

    <checkpoint.storage>/<run>/
        checkpoint_00000500/     one checkpoint per saved step (layout: workers/checkpoint.py)
        metrics/                 the Parquet metrics log (core/metrics_log.py)
        tensorboard/             with metrics.tensorboard, for local storage
        hangs/attempt-N-step-S/rank-K.txt
                                 each rank's Python stack when the service found the job hung
                                 (docs/monitoring.md, "Hangs")
        checkpoint_manager_snapshot.json
                                 Ray Train's own list of the checkpoints it registered, which
                                 nothing of ours reads: see `forget_ray_index`
    <checkpoint.storage>/.staging/<run>/checkpoint_NNNNNNNN/
                                 async saves, before they are published (local storage)

A run is named once, when the job is first submitted (`run_name`), and every later attempt
of the job continues it.
"""

from __future__ import annotations

import posixpath
import re
import time
from typing import TYPE_CHECKING

from core import storage

if TYPE_CHECKING:
    from core.spec import JobSpec

CHECKPOINT_PATTERN = re.compile(r"^checkpoint_(\d{8})$")
METRICS_DIR = "metrics"
TENSORBOARD_DIR = "tensorboard"
HANGS_DIR = "hangs"
STAGING_DIR = ".staging"
RAY_INDEX_FILE = "checkpoint_manager_snapshot.json"


def run_name(spec: JobSpec, now: float | None = None) -> str:
    """The spec's name, so that running a job again resumes it; with `resume: never` a new run
    of its own, so that no earlier checkpoint is touched."""
    if spec.checkpoint.resume == "never":
        return f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}"
    return spec.name


def run_uri(spec: JobSpec, run: str) -> str:
    return storage.join(spec.checkpoint.storage, run)


def hang_folder(run: str, attempt: int, step: int) -> str:
    """Where the stacks of a hang of `attempt` at `step` go (one file per rank)."""
    return storage.join(run, HANGS_DIR, f"attempt-{attempt}-step-{step}")


def checkpoint_name(step: int) -> str:
    """The directory name of the checkpoint at `step` (sorts by step)."""
    return f"checkpoint_{step:08d}"


def checkpoint_step(name: str) -> int | None:
    """The step of a checkpoint's name or URI; None for anything else."""
    match = CHECKPOINT_PATTERN.match(posixpath.basename(name.rstrip("/").partition("?")[0]))
    return int(match.group(1)) if match else None


def checkpoints(run: str) -> list[str]:
    """URIs of the checkpoint folders of a run (complete or not), oldest first."""
    names = [n for n in storage.list_dirs(run) if checkpoint_step(n) is not None]
    return [storage.join(run, n) for n in sorted(names)]


def forget_ray_index(run: str) -> None:
    """Remove Ray Train's list of the checkpoints it registered in a run folder, before a Ray run.

    The next `fit()` reloads that list and stops before any worker starts if a checkpoint on it
    is gone, deleted by pruning or by hand. Nothing of ours reads it (a run resumes from the
    newest valid checkpoint in storage), so each Ray run starts without it."""
    import pyarrow.fs as pafs  # at the call: the CLI's reads never need pyarrow

    fs, path = storage.resolve(storage.join(run, RAY_INDEX_FILE))
    if fs.get_file_info(path).type == pafs.FileType.File:
        fs.delete_file(path)
