"""The per-worker training loop: the same code under a single process, torchrun and Ray Train.

`train(spec, ctx)` builds data, model, optimizer and schedule from the spec, resumes from
the checkpoint the context names, trains, evaluates, checkpoints, and returns a summary.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.fs as pafs
import torch
import torch.distributed as dist

import kernels
from orchestrator.spec import JobSpec
from workers import checkpoint, data, metrics_ab, models, storage, throughput
from workers import compile as compile_
from workers.context import RunContext
from workers.loader import Layout, TrainBatches, eval_batches
from workers.optim import build_optimizer, build_scheduler, clip_grad_norm_
from workers.parallel import no_gradient_sync, parallelize
from workers.precision import Precision
from workers.progress import ProgressReporter
from workers.step_sums import StepSums

log = logging.getLogger("workers")


def padded_logits(logits: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(the tensor to compute the loss on, the number of classes).

    A model with a padded vocabulary (GPT's `vocab_multiple`) returns its logits as the
    first `vocab_size` columns of a wider buffer. Taking the loss on that buffer, with
    `classes`, keeps the slice out of the autograd graph: its backward would zero-fill a
    buffer-sized gradient and copy into it (~2.5 ms a step for GPT-2 small on an H100)."""
    base = logits._base
    if (
        base is not None
        and base.dim() == logits.dim()
        and base.shape[:-1] == logits.shape[:-1]
        and base.shape[-1] > logits.shape[-1]
        and base.stride() == logits.stride()
        and base.storage_offset() == logits.storage_offset()
        and base.dtype == logits.dtype
    ):
        return base, logits.shape[-1]
    return logits, logits.shape[-1]


def _size(uri: str) -> int | None:
    """Bytes under a checkpoint directory (any storage); None when it cannot be listed."""
    try:
        fs, path = storage.resolve(uri)
        infos = fs.get_file_info(pafs.FileSelector(path, recursive=True))
        return sum(i.size or 0 for i in infos if i.type == pafs.FileType.File)
    except Exception:  # accounting must never stop training
        return None


# what rank 0 puts into the all-reduce for a stop request
STOP_CODES = {None: 0, "stop": 1, "preempt": 2}


class TrainingError(RuntimeError):
    """The run cannot go on (non-finite loss, ...); its last good checkpoint is kept."""


@dataclass
class TrainState:
    step: int = 0
    best_eval_loss: float = math.inf
    evals_without_improvement: int = 0
    history: list[dict] = field(default_factory=list)


def _all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(tensor)
    return tensor.tolist()


class Trainer:
    def __init__(self, spec: JobSpec, ctx: RunContext):
        self.spec, self.ctx = spec, ctx
        ctx.setup()
        self.device = ctx.device
        seed = spec.train.seed
        self.datasets = data.load(spec.data, seed=seed, rank=ctx.rank, world_size=ctx.world_size)
        self.info = self.datasets.info
        self.is_lm = self.info.kind == "tokens"

        torch.manual_seed(seed)  # identical initial weights on every rank
        model = models.build(spec.model, self.info, kernels=spec.kernels.as_dict()).to(self.device)
        self.model = parallelize(model, spec, mesh=None)
        torch.manual_seed(seed + 1 + ctx.rank)  # independent dropout streams per rank

        self.layout = Layout(
            spec.data.batch_size,
            ctx.world_size,
            ctx.rank,
            spec.train.grad_accum,
            sharded=self.datasets.sharded,
        )
        self.batches = TrainBatches(
            self.datasets.train,
            self.layout,
            seed,
            spec.data.loader_workers,
            pin_memory=self.device.type == "cuda",
            augment=spec.data.augment,
        )
        self.total_steps = spec.train.steps or spec.train.epochs * self.batches.steps_per_epoch
        self.optimizer = build_optimizer(self.model, spec.optimizer)
        self.builtin_loss = compile_.builtin_loss(spec)
        self.scheduler = build_scheduler(self.optimizer, spec.scheduler, self.total_steps)
        self.precision = Precision(spec.precision, self.device, strategy=spec.parallel.strategy)
        self.meter = throughput.Meter(
            self.device,
            spec.data.batch_size,
            self.info.seq_len if self.is_lm else 1,
            ctx.world_size,
            self._flops_per_sample(),
            spec.precision.dtype,
            compiled=spec.precision.compile,
        )
        self.pending_save: checkpoint.PendingSave | None = None
        self.timer = throughput.PhaseTimer(self.device)
        self.grad_norm: torch.Tensor | None = None
        self.saved: dict = {}  # the newest checkpoint save's time and size, for the next record
        self.last_eval: dict = {}
        self.checkpoint_blocked_s, self.checkpoint_saves = 0.0, 0
        self.state = TrainState()
        self.last_checkpoint: str | None = None
        self.last_saved_step: int | None = None

    # -- loss and evaluation ------------------------------------------------------------

    def loss(self, logits: torch.Tensor, target: torch.Tensor, label_smoothing: float) -> torch.Tensor:
        """Mean cross-entropy in fp32, from logits of any precision (never copied to fp32 first)."""
        logits, classes = padded_logits(logits)
        logits, target = logits.reshape(-1, logits.shape[-1]), target.reshape(-1)
        impl = kernels.resolve("cross_entropy", self.spec.kernels.cross_entropy, logits, vocab=classes)
        if impl == "triton":
            # the logits are dead after the loss: their memory takes the gradient
            return kernels.cross_entropy(
                logits, target, label_smoothing, impl="triton", inplace_backward=True, classes=classes
            )
        return self.builtin_loss(logits, target, label_smoothing, classes=classes)

    @torch.no_grad()
    def evaluate(self) -> dict:
        if self.datasets.eval is None:
            return {}
        self.model.eval()
        batch_size = self.spec.data.eval_batch_size or self.layout.micro_batch
        loader = eval_batches(
            self.datasets.eval,
            self.ctx.rank,
            self.ctx.world_size,
            batch_size,
            self.spec.data.loader_workers,
            sharded=self.datasets.sharded,
        )
        loss_sum = correct = count = 0.0
        for i, (x, y) in enumerate(loader):
            if self.spec.train.eval_batches and i >= self.spec.train.eval_batches:
                break
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            with self.precision.autocast():
                logits = self.model(x)
            n = y.numel()
            loss_sum += self.loss(logits, y, 0.0).item() * n
            correct += (logits.argmax(-1) == y).sum().item()
            count += n
        self.model.train()
        loss_sum, correct, count = _all_reduce_sum([loss_sum, correct, count], self.device)
        loss = loss_sum / max(count, 1)
        result = {"eval_loss": loss, "eval_accuracy": correct / max(count, 1)}
        if self.is_lm:
            result["eval_perplexity"] = math.exp(min(loss, 50.0))
        return result

    def _flops_per_sample(self) -> int | None:
        try:
            return throughput.train_flops_per_sample(self.spec.model, self.info)
        except Exception as err:  # accounting must never stop training
            log.warning("cannot count model FLOPs (%s); throughput without FLOP/s", err)
            return None

    # -- checkpoints -----------------------------------------------------------------

    def save(self) -> None:
        """Checkpoint the current step; the time training waits here is `checkpoint_blocked_s`."""
        started = time.perf_counter()
        self._save()
        blocked = time.perf_counter() - started
        self.checkpoint_blocked_s += blocked
        self.checkpoint_saves += 1
        self.saved["checkpoint_save_s"] = blocked
        if self.ctx.is_main and self.last_checkpoint and self.last_saved_step == self.state.step:
            self.saved["checkpoint_bytes"] = _size(self.last_checkpoint)

    def _record(self, step: int, samples_per_s: float) -> dict:
        """Rank 0's record of a logged step; the loss and gradient norm join it with the sum."""
        record = {
            "step": step,
            "epoch": step / self.batches.steps_per_epoch,
            "total_steps": self.total_steps,
            "rank": 0,
        }
        record.update(self.timer.means())  # the step time split over the interval
        record.update(throughput.memory_fields(self.device))
        if self.saved:  # the newest checkpoint save, once
            record.update(self.saved)
            self.saved = {}
        record["lr"] = self.scheduler.get_last_lr()[0]
        record["samples_per_s"] = samples_per_s
        record.update(self.meter.log_fields(samples_per_s))  # tokens/s, TFLOP/s, MFU
        record["time"] = time.time()
        return record

    def _rank_record(self, step: int) -> dict:
        """What the other ranks report of themselves: their step time split and memory."""
        return {
            "step": step,
            "rank": self.ctx.rank,
            **self.timer.means(),
            **throughput.memory_fields(self.device),
            "time": time.time(),
        }

    def _save(self) -> None:
        trainer_state = {
            "step": self.state.step,
            "seed": self.spec.train.seed,
            "world_size": self.ctx.world_size,
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.precision.scaler.state_dict(),
            "best_eval_loss": self.state.best_eval_loss,
            "evals_without_improvement": self.state.evals_without_improvement,
            "model": json.dumps(self.spec.model.model_dump(mode="json")),  # for `orchestrator export`
        }
        last = self.state.history[-1] if self.state.history else {}
        if self.spec.checkpoint.async_save:
            self._publish()  # the previous one (long finished, normally)
            self.pending_save = checkpoint.save_async(
                self._staging_dir(self.state.step),
                self.state.step,
                self.model,
                self.optimizer,
                trainer_state,
                self.state.history,
                self.ctx.rank,
                last,
            )
            return

        def write(directory: str) -> None:
            checkpoint.save(
                directory, self.model, self.optimizer, trainer_state, self.state.history, self.ctx.rank
            )

        self.last_checkpoint = self.ctx.save_checkpoint(self.state.step, write, last)
        self.last_saved_step = self.state.step

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
        self.checkpoint_blocked_s += time.perf_counter() - started

    def _publish(self) -> None:
        pending, self.pending_save = self.pending_save, None
        if pending is None:
            return
        pending.wait()
        self.last_checkpoint = self.ctx.save_checkpoint(pending.step, pending.publish, pending.metrics)
        self.last_saved_step = pending.step
        shutil.rmtree(pending.staging, ignore_errors=True)
        for empty in (pending.staging.parent, pending.staging.parent.parent):  # <run>, .staging
            with contextlib.suppress(OSError):
                empty.rmdir()

    def resume(self) -> None:
        directory = self.ctx.resume_from()
        if directory is None:
            self.ctx.restore_metrics([])
            return
        trainer_state, history = checkpoint.load(
            directory, self.model, self.optimizer, self.ctx.rank, self.ctx.world_size
        )
        self.scheduler.load_state_dict(trainer_state["scheduler"])
        self.precision.scaler.load_state_dict(trainer_state["scaler"])
        self.state = TrainState(
            step=trainer_state["step"],
            best_eval_loss=trainer_state["best_eval_loss"],
            evals_without_improvement=trainer_state["evals_without_improvement"],
            history=history,
        )
        self.ctx.restore_metrics(history)
        if self.ctx.is_main:
            log.info("resumed from %s at step %d", directory, self.state.step)

    # -- the loop ------------------------------------------------------------------

    def step(self, micro_batches: list) -> torch.Tensor:
        """One optimizer step over the micro-batches; returns this rank's mean loss (a tensor)."""
        accum = len(micro_batches)
        total = torch.zeros((), device=self.device)
        for i, (x, y) in enumerate(micro_batches):
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            last = i == accum - 1
            with no_gradient_sync(self.model) if not last else contextlib.nullcontext():
                with self.timer.device("compute"), self.precision.autocast():
                    logits = self.model(x)
                with self.timer.device("compute"):
                    loss = self.loss(logits, y, self.spec.train.label_smoothing) / accum
                    self.precision.scaler.scale(loss).backward()
            total += loss.detach()
        scaler = self.precision.scaler
        with self.timer.device("optimizer"):
            if self.spec.train.clip_grad_norm:
                scaler.unscale_(self.optimizer)
                # the norm before clipping, kept as a tensor: read only at logging steps
                self.grad_norm = clip_grad_norm_(self.model, self.spec.train.clip_grad_norm)
            scaler.step(self.optimizer)
            scaler.update()
            self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.timer.step_done()
        return total

    def run(self) -> dict:
        spec, ctx, state = self.spec, self.ctx, self.state
        self.resume()
        state = self.state
        progress = ProgressReporter(
            spec.name, self.total_steps, state.step, enabled=ctx.is_main and ctx.shows_progress
        )
        if state.step and ctx.is_main:
            progress.message(f"resuming at step {state.step}")
        status, reason = "succeeded", None
        start = time.perf_counter()
        meter = self.meter  # throughput excludes the first step (warm-up, compile) and eval/saves
        meter.restart()
        last_log_time, last_log_step = start, state.step
        nonfinite = torch.zeros((), dtype=torch.bool, device=self.device)
        samples_per_step = spec.data.batch_size * (self.info.seq_len if self.is_lm else 1)
        rate = 0.0
        self.sums = StepSums(self.device, ctx.world_size, ctx.is_main)
        ab = metrics_ab.from_env()  # only under bench/metrics_overhead.py
        rank_every, rank_sent = ctx.rank_metrics_every_s, -math.inf  # ranks but 0: their own record
        self.timer.enabled = ctx.is_main or rank_every is not None  # else nobody reads it
        try:
            batches = self.batches.iterate(state.step)
            while state.step < self.total_steps:
                with self.timer.host("data"):
                    micro_batches = next(batches)
                loss = self.step(micro_batches)
                nonfinite |= ~torch.isfinite(loss)
                state.step += 1
                meter.step_done()
                if ab is not None:
                    ab.step_done(state.step)
                # a sum started one step ago is finished by now: its records are logged here
                stop = self._take_sums(progress)
                logging_now = state.step % spec.metrics.log_every == 0 and (
                    ab is None or ab.logging_on(state.step)
                )
                logging_now = logging_now or state.step == self.total_steps
                checkpoint_now = bool(spec.checkpoint.every_steps) and (
                    state.step % spec.checkpoint.every_steps == 0
                )
                eval_now = bool(spec.train.eval_every) and state.step % spec.train.eval_every == 0
                if logging_now:
                    now = time.perf_counter()
                    rate = (
                        (state.step - last_log_step) * spec.data.batch_size / max(now - last_log_time, 1e-9)
                    )
                    last_log_time, last_log_step = now, state.step
                    if ctx.is_main:
                        # the gradient norm stays a tensor until the sum completes: no host sync
                        on_device = None if self.grad_norm is None else {"grad_norm": self.grad_norm}
                        self.sums.add(self._record(state.step, rate), loss, on_device)
                    else:  # only rank 0's records are kept; the others add their loss to the sum
                        self.sums.add(None, loss)
                        if rank_every is not None and now - rank_sent >= rank_every:
                            ctx.log_rank_metrics(self._rank_record(state.step))
                            rank_sent = now
                # before a checkpoint, an evaluation or the end, the log and the checkpoint's
                # history must hold every record so far: sum now and wait for it
                settle = stop or checkpoint_now or eval_now or state.step == self.total_steps
                if settle or self.sums.due(state.step):
                    # rank 0 folds a stop request into a sum made anyway: every rank learns of it
                    # at the same step, for no extra communication
                    stop_code = STOP_CODES.get(ctx.stop_requested(), 0) if ctx.is_main else 0
                    self.sums.start(state.step, nonfinite, stop_code)
                if settle:
                    stop = self._take_sums(progress) or stop
                if stop and state.step < self.total_steps:  # at the last step: just finish
                    status = "preempted" if stop == STOP_CODES["preempt"] else "stopped"
                    reason = f"{status} at step {state.step}"
                    break
                if eval_now and state.step < self.total_steps:
                    with meter.pause():
                        stop = self.evaluate_and_check(progress)
                    if stop:
                        status = "stopped_early"
                        break
                if checkpoint_now:
                    with meter.pause():
                        self.save()
        except TrainingError as err:
            status, reason = "failed", str(err)
        finally:
            self.sums.discard()  # after a failure: nothing more to log or wait for
            progress.close()

        rates = meter.summary()
        self.publish_pending()  # an async checkpoint still being written (a good one, even on failure)
        elapsed = time.perf_counter() - start
        eval_metrics = {}
        if status == "succeeded":
            eval_metrics = self.evaluate()
            if eval_metrics:
                self._log_eval(eval_metrics, progress)
        elif status == "stopped_early":  # it just evaluated this very step
            eval_metrics = self.last_eval
        if status != "failed" and self.last_saved_step != state.step:
            self.save()  # the final step; or the step a preempted or stopped run resumes from
            self.publish_pending()
        ctx.flush_metrics()
        samples_per_s = rates["samples_per_s"] or rate
        train_losses = [r["loss"] for r in state.history if "loss" in r]
        summary = {
            "job": spec.name,
            "run": getattr(ctx, "name", spec.name),
            "status": status,
            "reason": reason,
            "steps": state.step,
            "total_steps": self.total_steps,
            "final_train_loss": train_losses[-1] if train_losses else None,
            "eval": eval_metrics,
            "samples_per_s": samples_per_s,
            "tokens_per_s": samples_per_s * self.info.seq_len if self.is_lm else None,
            "samples_per_step": samples_per_step,
            "world_size": ctx.world_size,
            "checkpoint": self.last_checkpoint,
            "restarts": ctx.restarts,
            "resumed_from": ctx.resumed_from,
            "elapsed_s": elapsed,
            "throughput": rates,
            "compile_s": rates.get("compile_s"),
            "checkpoint_blocked_s": self.checkpoint_blocked_s,
            "checkpoint_saves": self.checkpoint_saves,
        }
        if ab is not None:
            summary["metrics_ab"] = ab.summary()
        return summary

    def _take_sums(self, progress: ProgressReporter) -> int:
        """Finish the sum in flight: log the records it completes, raise on a non-finite loss,
        and return rank 0's stop code."""
        finished = self.sums.finish()
        if finished is None:
            return 0
        step, records, nonfinite, stop = finished
        if nonfinite:
            raise TrainingError(f"loss is not finite at or before step {step}")
        for record in records:  # rank 0's: the other ranks keep none (only rank 0 checkpoints them)
            self.state.history.append(record)
            self.ctx.log_metrics(record)
        if records:
            last = records[-1]
            progress.update(last["step"], last["loss"], last["samples_per_s"], last["lr"])
        return stop

    def evaluate_and_check(self, progress: ProgressReporter) -> bool:
        """Evaluate; True when early stopping says to stop."""
        metrics = self.evaluate()
        if not metrics:
            return False
        self._log_eval(metrics, progress)
        self.last_eval = metrics
        early = self.spec.train.early_stopping
        if early is None:
            return False
        if metrics["eval_loss"] < self.state.best_eval_loss - early.min_delta:
            self.state.best_eval_loss = metrics["eval_loss"]
            self.state.evals_without_improvement = 0
            return False
        self.state.evals_without_improvement += 1
        return self.state.evals_without_improvement >= early.patience

    def _log_eval(self, metrics: dict, progress: ProgressReporter) -> None:
        record = {"step": self.state.step, **metrics, "time": time.time()}
        self.state.history.append(record)
        if self.ctx.is_main:
            self.ctx.log_metrics(record)
        progress.message(
            "eval at step {}: {}".format(
                self.state.step, "  ".join(f"{k.removeprefix('eval_')} {v:.4f}" for k, v in metrics.items())
            )
        )


def train(spec: JobSpec, ctx: RunContext) -> dict:
    trainer = Trainer(spec, ctx)
    return trainer.run()
