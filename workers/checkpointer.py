"""The training loop's checkpointer: when to save, how, and what a run resumes from.

It owns the cadence (`checkpoint.every_steps`), the synchronous save and the asynchronous one
(shards written in the background to a staging folder, published at the next save or at the
end), pruning to `checkpoint.keep` once a save is durable (complete in storage; rank 0, one
rule in every launcher: `checkpoint_files.prune`), resuming, and the accounting: the time
training waits for saves, how many it made, the newest checkpoint and its step, and the newest
save's blocked time, time until durable and size, which join the next metrics record. What it
saves (model, optimizer, schedule, grad scaler, `TrainState`) the trainer hands it when it is
made; resuming loads into those same objects (the `TrainState` in place).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pyarrow.fs as pafs
import torch

from core import records, storage
from core.spec import JobSpec
from workers import checkpoint, checkpoint_files
from workers.context import RunContext
from workers.train_state import TrainState

log = logging.getLogger("workers")


def _size(uri: str) -> int | None:
    """Bytes under a checkpoint directory (any storage); None when it cannot be listed."""
    try:
        fs, path = storage.resolve(uri)
        infos = fs.get_file_info(pafs.FileSelector(path, recursive=True))
        return sum(i.size or 0 for i in infos if i.type == pafs.FileType.File)
    except Exception:  # accounting must never stop training
        return None


class Checkpointer:
    def __init__(
        self,
        spec: JobSpec,
        ctx: RunContext,
        state: TrainState,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        scaler: torch.amp.GradScaler,
    ):
        self.spec, self.ctx, self.state = spec, ctx, state
        self.model, self.optimizer, self.scheduler, self.scaler = model, optimizer, scheduler, scaler
        self.pending: checkpoint.PendingSave | None = None  # an async save being written
        self._pending_started = 0.0  # when it began (perf_counter)
        self.blocked_s, self.saves = 0.0, 0  # time training waited for saves; saves made
        self.last_checkpoint: str | None = None
        self.last_saved_step: int | None = None
        self._newest_save: dict = {}  # its times and size, for the next record
        self._newest_lock = threading.Lock()  # a save becomes durable on an upload thread
        self.left: dict[str, str] = {}  # folders pruning left in place: {name: why}

    def should_save(self, step: int) -> bool:
        every = self.spec.checkpoint.every_steps
        return bool(every) and step % every == 0

    def left_in_place(self) -> list[dict]:
        """[{"checkpoint", "reason"}] of the folders pruning left in place (the summary's
        `checkpoints_left`)."""
        return [{"checkpoint": name, "reason": reason} for name, reason in sorted(self.left.items())]

    def take_save_fields(self) -> dict:
        """The newest save's `checkpoint_save_s`, `checkpoint_durable_s` and `checkpoint_bytes`
        (those known by now), once: for the next record."""
        with self._newest_lock:
            fields, self._newest_save = self._newest_save, {}
        return fields

    def _note(self, **fields) -> None:
        with self._newest_lock:
            self._newest_save.update(fields)

    # -- saving ------------------------------------------------------------------------

    def save(self) -> None:
        """Checkpoint the current step; the time training waits here counts in `blocked_s`."""
        started = time.perf_counter()
        self._save(started)
        blocked = time.perf_counter() - started
        self.blocked_s += blocked
        self.saves += 1
        self._note(**{records.CHECKPOINT_SAVE_S: blocked})

    def _durable(self, step: int, uri: str, started: float) -> None:
        """The checkpoint of `step` is complete in storage (called on rank 0, maybe on an
        upload thread): prune older ones, and note how long it took and its size."""
        self._prune(step)
        if self.ctx.is_main:
            durable = time.perf_counter() - started
            self._note(**{records.CHECKPOINT_DURABLE_S: durable, records.CHECKPOINT_BYTES: _size(uri)})

    def save_final(self) -> None:
        """The run's last step (or the step a stopped run resumes from), unless just saved."""
        if self.last_saved_step != self.state.step:
            self.save()
            self.publish_pending()

    def _trainer_state(self) -> dict:
        state = self.state
        return {
            "step": state.step,
            "seed": self.spec.train.seed,
            "world_size": self.ctx.world_size,
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "best_eval_loss": state.best_eval_loss,
            "evals_without_improvement": state.evals_without_improvement,
            "model": json.dumps(self.spec.model.model_dump(mode="json")),  # for `orchestrator export`
            "model_config": self._model_config(),  # the model rebuilt for ONNX export
        }

    def _model_config(self) -> str:
        config = getattr(self.model, "module", self.model).config  # DDP wraps the model
        return json.dumps(dataclasses.asdict(config))

    def _save(self, started: float) -> None:
        state = self.state
        trainer_state = self._trainer_state()
        last = state.history[-1] if state.history else {}
        if self.spec.checkpoint.async_save:
            self._publish()  # the previous one (long finished, normally)
            self._pending_started = started
            self.pending = checkpoint.save_async(
                self._staging_dir(state.step),
                state.step,
                self.model,
                self.optimizer,
                trainer_state,
                state.history,
                self.ctx.rank,
                last,
            )
            return

        def write(directory: str) -> None:
            checkpoint.save(
                directory, self.model, self.optimizer, trainer_state, state.history, self.ctx.rank
            )

        step = state.step
        self.last_checkpoint = self.ctx.save_checkpoint(
            step, write, last, lambda uri: self._durable(step, uri, started)
        )
        self.last_saved_step = step

    def _staging_dir(self, step: int) -> Path:
        """Where async shard files are written first: next to the checkpoints when the storage
        is a local path (publishing is then a rename), else in local temporary space."""
        uri = self.spec.checkpoint.storage
        run = getattr(self.ctx, "name", self.spec.name)
        root = Path(storage.resolve(uri)[1]) if storage.is_local(uri) else Path(tempfile.gettempdir())
        return root / ".staging" / run / f"checkpoint_{step:08d}"

    def publish_pending(self) -> None:
        """Collective: wait for the background checkpoint write and hand the checkpoint over."""
        started = time.perf_counter()
        self._publish()
        self.blocked_s += time.perf_counter() - started

    def _publish(self) -> None:
        pending, self.pending = self.pending, None
        if pending is None:
            return
        pending.wait()
        step, started = pending.step, self._pending_started
        self.last_checkpoint = self.ctx.save_checkpoint(
            step, pending.publish, pending.metrics, lambda uri: self._durable(step, uri, started)
        )
        self.last_saved_step = step
        shutil.rmtree(pending.staging, ignore_errors=True)
        for empty in (pending.staging.parent, pending.staging.parent.parent):  # <run>, .staging
            with contextlib.suppress(OSError):
                empty.rmdir()

    def _prune(self, step: int) -> None:
        """Rank 0, once every rank's part of `step` is in storage: keep `checkpoint.keep`
        complete checkpoints; name each folder left in place, once."""
        if not self.ctx.is_main:
            return
        try:
            _, left = checkpoint_files.prune(self.ctx.run_uri, self.spec.checkpoint.keep, step)
        except Exception as err:  # storage trouble: keeping too much never stops training
            log.warning("could not prune old checkpoints in %s: %s", self.ctx.run_uri, err)
            return
        for item in left:
            if item["checkpoint"] not in self.left:
                log.warning(
                    "%s left in place: %s; it does not count towards checkpoint.keep",
                    item["checkpoint"],
                    item["reason"],
                )
        # the newest look is the truth: a save still being written when an older one became
        # durable (ahead of it, or incomplete then) is an ordinary checkpoint by now
        self.left = {item["checkpoint"]: item["reason"] for item in left}

    # -- resuming ------------------------------------------------------------------------

    def resume(self) -> None:
        """Load the checkpoint the context names into the model, optimizer, schedule, grad
        scaler and `TrainState` (in place); without one, start afresh."""
        directory = self.ctx.resume_from()
        # with replica groups the job's log starts where a group first leads (metrics_processor)
        one_group = self.spec.fault_tolerance.replica_groups == 1
        if directory is None:
            if one_group:
                self.ctx.restore_metrics([])
            return
        trainer_state, history = checkpoint.load(
            directory, self.model, self.optimizer, self.ctx.rank, self.ctx.world_size
        )
        self.scheduler.load_state_dict(trainer_state["scheduler"])
        self.scaler.load_state_dict(trainer_state["scaler"])
        state = self.state
        state.step = trainer_state["step"]
        state.best_eval_loss = trainer_state["best_eval_loss"]
        state.evals_without_improvement = trainer_state["evals_without_improvement"]
        state.history = history
        if one_group:
            self.ctx.restore_metrics(history)
        if self.ctx.is_main:
            log.info("resumed from %s at step %d", directory, state.step)
