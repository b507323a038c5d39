"""Where the training loop runs: how it learns its rank, saves checkpoints and finds the one
to resume from. The loop is identical everywhere; only this small adapter differs.

`LocalContext` serves a single process and torchrun (it reads RANK/WORLD_SIZE/LOCAL_RANK).
The Ray Train adapter lives with the driver and implements the same methods.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from orchestrator.spec import JobSpec
from workers import storage

log = logging.getLogger("workers")

CHECKPOINT_PATTERN = re.compile(r"^checkpoint_(\d{8})$")


def run_name(spec: JobSpec) -> str:
    """`resume: never` starts fresh under a new run name, so no earlier checkpoint is touched."""
    if spec.checkpoint.resume == "never":
        return f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    return spec.name


class RunContext:
    """The interface the loop uses; subclasses fill in the transport."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    restarts: int = 0
    shows_progress: bool = True  # False where someone else prints it (the Ray driver)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def setup(self) -> None: ...

    def resume_from(self) -> str | None:
        """A local directory holding the checkpoint to continue from, or None."""
        return None

    def save_checkpoint(self, step: int, write: Callable[[str], None], metrics: dict) -> str:
        """Collective: `write(local_dir)` writes this rank's part; returns the checkpoint's URI."""
        raise NotImplementedError

    def log_metrics(self, record: dict) -> None:
        """Per-step metrics (called on rank 0 only); must not block training."""

    def restore_metrics(self, history: list[dict]) -> None:
        """After a resume: the log as of the checkpoint replaces whatever came later."""

    def finish(self, summary: dict) -> None: ...

    def teardown(self) -> None: ...


def pick_device(want_gpu: bool, local_rank: int) -> torch.device:
    if want_gpu and torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


class LocalContext(RunContext):
    """One process, or one of several started by torchrun; checkpoints go straight to storage."""

    def __init__(self, spec: JobSpec):
        self.spec = spec
        self.rank = int(os.environ.get("RANK", 0))
        self.world_size = int(os.environ.get("WORLD_SIZE", 1))
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.name = run_name(spec)
        self.run_uri = storage.join(spec.checkpoint.storage, self.name)
        self._tmp = Path(tempfile.mkdtemp(prefix="orchestrator-"))
        self._metrics_path: Path | None = None

    def setup(self) -> None:
        # torchrun on a GPU machine trains on GPUs; gpus_per_worker only sizes Ray reservations
        self.device = pick_device(torch.cuda.is_available(), self.local_rank)
        if self.world_size > 1 and not dist.is_initialized():
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            dist.init_process_group(backend, device_id=self.device if backend == "nccl" else None)
        if self.is_main:
            storage.check_writable(self.run_uri)
            if storage.is_local(self.run_uri):
                self._metrics_path = Path(storage.resolve(self.run_uri)[1]) / "metrics.jsonl"

    # -- checkpoints --------------------------------------------------------------

    def _checkpoints(self) -> list[str]:
        """Complete checkpoints of this run, oldest first."""
        names = [n for n in storage.list_dirs(self.run_uri) if CHECKPOINT_PATTERN.match(n)]
        return [n for n in names if storage.exists(storage.join(self.run_uri, n, "trainer.pt"))]

    def resume_from(self) -> str | None:
        resume = self.spec.checkpoint.resume
        if resume == "never":
            return None
        if resume == "auto":
            found = self._checkpoints()
            if not found:
                return None
            uri = storage.join(self.run_uri, found[-1])
        else:
            uri = resume
            if not storage.exists(uri):
                raise FileNotFoundError(f"checkpoint.resume: no checkpoint at '{uri}'")
        if storage.is_local(uri):
            return storage.resolve(uri)[1]
        local = self._tmp / "resume"
        storage.download(uri, local)
        return str(local)

    def save_checkpoint(self, step: int, write: Callable[[str], None], metrics: dict) -> str:
        uri = storage.join(self.run_uri, f"checkpoint_{step:08d}")
        if storage.is_local(uri):
            write(storage.resolve(uri)[1])
        else:
            local = self._tmp / f"checkpoint_{step:08d}"
            write(str(local))
            storage.upload(local, uri)  # each rank uploads its own shard files
            shutil.rmtree(local, ignore_errors=True)
        if dist.is_initialized():
            dist.barrier()
        if self.is_main:
            self._prune()
        return uri

    def _prune(self) -> None:
        for name in self._checkpoints()[: -self.spec.checkpoint.keep]:
            storage.delete_dir(storage.join(self.run_uri, name))

    # -- metrics --------------------------------------------------------------------

    def log_metrics(self, record: dict) -> None:
        if self._metrics_path is not None:
            with open(self._metrics_path, "a") as out:
                out.write(json.dumps(record) + "\n")

    def restore_metrics(self, history: list[dict]) -> None:
        if self._metrics_path is not None:
            with open(self._metrics_path, "w") as out:
                out.writelines(json.dumps(r) + "\n" for r in history)

    def teardown(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)
        if dist.is_initialized():
            dist.destroy_process_group()
