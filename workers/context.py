"""Where the training loop runs: how it learns its rank, saves checkpoints and finds the one
to resume from. The loop is identical everywhere; only this small adapter differs.

`LocalContext` serves a single process and torchrun (it reads RANK/WORLD_SIZE/LOCAL_RANK).
The Ray Train adapter lives with the driver and implements the same methods.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from core import storage
from core.run_folder import checkpoint_name, checkpoint_step, run_name
from core.spec import JobSpec
from workers.checkpoint import incomplete_reason, newest_complete
from workers.run_log import RunLog

log = logging.getLogger("workers")


class RunContext:
    """The interface the loop uses; subclasses fill in the transport."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    restarts: int = 0
    shows_progress: bool = True  # False where someone else prints it (the Ray driver)
    # how often a rank other than 0 hands `log_rank_metrics` a record; None: nobody reads them
    rank_metrics_every_s: float | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def setup(self) -> None: ...

    # set by resume_from: {"checkpoint": uri, "step": n, "skipped": [...]} or None
    resumed_from: dict | None = None

    def resume_from(self) -> str | None:
        """A local directory holding the checkpoint to continue from, or None."""
        return None

    def stop_requested(self) -> str | None:
        """A request to checkpoint and stop ("preempt" or "stop"), or None. Called by rank 0
        whenever the ranks sum their logged losses; must return at once (no remote call on
        the training thread)."""
        return None

    def save_checkpoint(self, step: int, write: Callable[[str], None], metrics: dict) -> str:
        """Collective: `write(local_dir)` writes this rank's part; returns the checkpoint's URI."""
        raise NotImplementedError

    def log_metrics(self, record: dict) -> None:
        """Per-step metrics (called on rank 0 only); must not block training."""

    def log_rank_metrics(self, record: dict) -> None:
        """A record of a rank other than 0 (its step time split and memory), about every
        `rank_metrics_every_s`; must not block training."""

    def restore_metrics(self, history: list[dict]) -> None:
        """After a resume: the log as of the checkpoint replaces whatever came later."""

    def flush_metrics(self) -> None:
        """The run has ended: what is buffered goes to the metrics log now."""

    def finish(self, summary: dict) -> None: ...

    def teardown(self) -> None: ...


def checkpoint_to_resume(ctx: RunContext, resume: str | None = None) -> str | None:
    """The checkpoint a run continues from, per `resume` (default `checkpoint.resume`), noting
    in `ctx.resumed_from` which one and why (newer ones skipped as incomplete)."""
    resume = resume or ctx.spec.checkpoint.resume
    if resume == "never":
        return None
    if resume == "auto":
        uri, skipped = newest_complete(ctx.run_uri)
        for s in skipped:
            log.warning("skipping %s: incomplete checkpoint (%s)", s["checkpoint"], s["reason"])
    else:
        uri, skipped = resume, []
        if not storage.exists(uri):
            raise FileNotFoundError(f"checkpoint.resume: no checkpoint at '{uri}'")
        reason = incomplete_reason(uri)
        if reason is not None:
            raise FileNotFoundError(f"checkpoint.resume: '{uri}' is not a complete checkpoint: {reason}")
    if uri is not None or skipped:
        ctx.resumed_from = {"checkpoint": uri, "step": checkpoint_step(uri) if uri else 0, "skipped": skipped}
    return uri


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
        self._log: RunLog | None = None  # rank 0's metrics log

    def setup(self) -> None:
        # torchrun on a GPU machine trains on GPUs; gpus_per_worker only sizes Ray reservations
        self.device = pick_device(torch.cuda.is_available(), self.local_rank)
        if self.world_size > 1 and not dist.is_initialized():
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            dist.init_process_group(backend, device_id=self.device if backend == "nccl" else None)
        if self.is_main:
            storage.check_writable(self.run_uri)
            self._log = RunLog(self.run_uri, tensorboard=self.spec.metrics.tensorboard)

    # -- checkpoints --------------------------------------------------------------

    def resume_from(self) -> str | None:
        uri = checkpoint_to_resume(self)
        if uri is None:
            return None
        if storage.is_local(uri):
            return storage.resolve(uri)[1]
        local = self._tmp / "resume"
        storage.download(uri, local)
        return str(local)

    def save_checkpoint(self, step: int, write: Callable[[str], None], metrics: dict) -> str:
        uri = storage.join(self.run_uri, checkpoint_name(step))
        if storage.is_local(uri):
            write(storage.resolve(uri)[1])
        else:
            local = self._tmp / checkpoint_name(step)
            write(str(local))
            storage.upload(local, uri)  # each rank uploads its own shard files
            shutil.rmtree(local, ignore_errors=True)
        if dist.is_initialized():
            dist.barrier()
        if self.is_main:
            self._prune()
        return uri

    def _prune(self) -> None:
        names = sorted(n for n in storage.list_dirs(self.run_uri) if checkpoint_step(n) is not None)
        for name in names[: -self.spec.checkpoint.keep]:
            storage.delete_dir(storage.join(self.run_uri, name))

    # -- metrics --------------------------------------------------------------------

    def log_metrics(self, record: dict) -> None:
        if self._log is not None:
            self._log.append([record])

    def restore_metrics(self, history: list[dict]) -> None:
        if self._log is not None:
            self._log.rewind(history)

    def flush_metrics(self) -> None:
        if self._log is not None:
            self._log.flush()

    def teardown(self) -> None:
        if self._log is not None:
            self._log.close()
        shutil.rmtree(self._tmp, ignore_errors=True)
        if dist.is_initialized():
            dist.destroy_process_group()
