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
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from core import storage
from core.run_folder import checkpoint_name, checkpoint_step, run_name
from core.spec import JobSpec
from workers import checkpoint_upload, cpu_priority
from workers.checkpoint import CheckpointError, checkpoint_group
from workers.checkpoint_files import damage_reason, has_checksums, incomplete_reason, newest_valid
from workers.replicas import GROUP_ENV
from workers.run_log import RunLog

log = logging.getLogger("workers")


class RunContext:
    """The interface the loop uses; subclasses fill in the transport."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    restarts: int = 0
    replica_group: int = 0  # with fault_tolerance.replica_groups: which group this worker is in
    shows_progress: bool = True  # False where someone else prints it (the Ray driver)
    # stages of this process's start the launcher saw before the loop did (wall clock): the
    # summary's `startup` begins with them
    started: dict[str, float] = {}
    # how often a rank other than 0 hands `log_rank_metrics` a record; None: nobody reads them
    rank_metrics_every_s: float | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def setup(self) -> None: ...

    run_uri: str = ""  # <checkpoint.storage>/<run>: where its checkpoints go
    # set by resume_from: {"checkpoint": uri, "step": n, "skipped": [...], "verified": bool,
    # "check_s": s} or None
    resumed_from: dict | None = None

    def resume_from(self) -> str | None:
        """A local directory holding the checkpoint to continue from, or None."""
        return None

    def stop_requested(self) -> str | None:
        """A request to checkpoint and stop ("preempt" or "stop"), to leave without one (a
        replica group its launcher judged lost: "leave"), or None. Called by rank 0
        whenever the ranks sum their logged losses; must return at once (no remote call on
        the training thread)."""
        return None

    def save_checkpoint(
        self,
        step: int,
        write: Callable[[str], None],
        metrics: dict,
        on_durable: Callable[[str], None],
    ) -> str:
        """Collective: `write(local_dir)` writes this rank's part; returns the checkpoint's URI.
        `on_durable(uri)` is called on rank 0 once every rank's part is in storage: before this
        returns, or later from an upload thread (on Ray: off the training path)."""
        raise NotImplementedError

    def log_metrics(self, record: dict) -> None:
        """Per-step metrics (called on rank 0 only); must not block training."""

    def log_rank_metrics(self, record: dict) -> None:
        """A record of a rank other than 0 (its step time split and memory), about every
        `rank_metrics_every_s`; must not block training."""

    def restore_metrics(self, history: list[dict]) -> None:
        """After a resume: the log as of the checkpoint replaces whatever came later."""

    def replica_healed(self, step: int) -> None:
        """This replica group loaded a peer's state and trains on from `step` (whoever watches
        the job's groups is told)."""

    def settle_checkpoints(self) -> None:
        """Before the summary of a run that did not fail: every save is durable and pruned
        (bounded), so the summary names what pruning left in place."""

    def flush_metrics(self) -> None:
        """What is buffered goes to the metrics log in storage now (the run has ended, or a
        record must not wait for the log's next flush)."""

    def finish(self, summary: dict) -> None: ...

    def teardown(self) -> None: ...


def checkpoint_to_resume(ctx: RunContext, resume: str | None = None) -> str | None:
    """Collective: the checkpoint a run continues from, per `resume` (default
    `checkpoint.resume`), noting in `ctx.resumed_from` which one and why (newer ones skipped as
    incomplete or damaged). Rank 0 chooses, since checking the bytes reads the whole
    checkpoint, and tells the others."""
    resume = resume or ctx.spec.checkpoint.resume
    if resume == "never":
        return None
    chosen = _from_rank_0(ctx, lambda: _choose(ctx.run_uri, resume))
    if chosen["checkpoint"] is not None or chosen["skipped"]:
        ctx.resumed_from = chosen
    return chosen["checkpoint"]


def _choose(run_uri: str, resume: str) -> dict:
    started = time.perf_counter()
    if resume == "auto":
        uri, skipped = newest_valid(run_uri)
        for s in skipped:
            log.warning("skipping %s: %s", s["checkpoint"], s["reason"])
    else:
        uri, skipped = resume, []
        if not storage.exists(uri):
            raise FileNotFoundError(f"checkpoint.resume: no checkpoint at '{uri}'")
        reason = incomplete_reason(uri)
        if reason is not None:
            raise FileNotFoundError(f"checkpoint.resume: '{uri}' is not a complete checkpoint: {reason}")
        reason = damage_reason(uri)
        if reason is not None:
            raise CheckpointError(f"checkpoint.resume: '{uri}' is damaged: {reason}")
    verified = uri is not None and has_checksums(uri)
    if uri is not None and not verified:
        log.warning("resuming from %s, saved without checksums: its bytes cannot be checked", uri)
    return {
        "checkpoint": uri,
        "step": checkpoint_step(uri) if uri else 0,
        "skipped": skipped,
        "verified": verified,
        "check_s": time.perf_counter() - started,  # how long finding and checking it took
    }


def _from_rank_0(ctx: RunContext, compute: Callable[[], dict]) -> dict:
    """`compute()` on rank 0, its result (or its exception) on every rank."""
    if ctx.world_size == 1 or not dist.is_initialized():
        return compute()
    box: list = [None]
    if ctx.rank == 0:
        try:
            box[0] = compute()
        except Exception as err:
            box[0] = err
    dist.broadcast_object_list(box, src=0, group=checkpoint_group())
    if isinstance(box[0], Exception):
        raise box[0]
    return box[0]


def pick_device(want_gpu: bool, local_rank: int) -> torch.device:
    if want_gpu and torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


class LocalContext(RunContext):
    """One process, or one of several started by torchrun; checkpoints go straight to storage."""

    def __init__(self, spec: JobSpec, background_cpu: bool = False):
        """`background_cpu`: this process exists to train (torchrun's, `run --local`'s), so on a
        CPU its training thread becomes background work, as on a machine people use
        (workers/cpu_priority.py); not for a caller that goes on in the same thread after."""
        self.spec = spec
        self.background_cpu = background_cpu
        self.rank = int(os.environ.get("RANK", 0))
        self.world_size = int(os.environ.get("WORLD_SIZE", 1))
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.replica_group = int(os.environ.get(GROUP_ENV, 0))  # one torchrun per group
        self.name = run_name(spec)
        self.run_uri = storage.join(spec.checkpoint.storage, self.name)
        self._tmp = Path(tempfile.mkdtemp(prefix="orchestrator-"))
        self._log: RunLog | None = None  # rank 0's metrics log
        self._priority: cpu_priority.Governor | None = None

    def setup(self) -> None:
        # torchrun on a GPU machine trains on GPUs; gpus_per_worker only sizes Ray reservations
        self.device = pick_device(torch.cuda.is_available(), self.local_rank)
        if self.world_size > 1 and not dist.is_initialized():
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            dist.init_process_group(backend, device_id=self.device if backend == "nccl" else None)
        if self.background_cpu:  # this process only trains: every thread of it is training's
            peers = cpu_priority.local_peer_pids() if self.device.type == "cpu" else ()
            self._priority = cpu_priority.start(self.device.type, True, peers, protected=set())
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

    def save_checkpoint(
        self,
        step: int,
        write: Callable[[str], None],
        metrics: dict,
        on_durable: Callable[[str], None],
    ) -> str:
        uri = storage.join(self.run_uri, checkpoint_name(step))
        if storage.is_local(uri):
            write(storage.resolve(uri)[1])
        else:
            local = self._tmp / checkpoint_name(step)
            write(str(local))
            checkpoint_upload.upload(local, *storage.resolve(uri))  # each rank its own part
            shutil.rmtree(local, ignore_errors=True)
        if dist.is_initialized():
            dist.barrier()
        if self.is_main:
            on_durable(uri)
        return uri

    # -- metrics --------------------------------------------------------------------

    def log_metrics(self, record: dict) -> None:
        if self._log is not None:
            self._log.append([record])

    def restore_metrics(self, history: list[dict]) -> None:
        if self._log is not None:
            self._log.rewind(history)

    def settle_checkpoints(self) -> None:
        """Before the summary of a run that did not fail: every save is durable and pruned
        (bounded), so the summary names what pruning left in place."""

    def flush_metrics(self) -> None:
        if self._log is not None:
            self._log.flush()

    def teardown(self) -> None:
        if self._priority is not None:
            self._priority.stop()
        if self._log is not None:
            self._log.close()
        shutil.rmtree(self._tmp, ignore_errors=True)
        if dist.is_initialized():
            dist.destroy_process_group()
