"""The per-worker training loop: the same code under a single process, torchrun and Ray Train.

`train(spec, ctx)` builds data, model, optimizer and schedule from the spec, resumes from
the checkpoint the context names, trains, evaluates, checkpoints, and returns a summary.
The trainer owns the model and the optimizer step; its components own the rest, each with
its own cadence: `Checkpointer` (saves and resuming), `MetricsProcessor` (records, the sums
over the ranks, stop requests) and `Evaluator` (evaluation, early stopping).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import torch

import kernels
from core import records
from core.spec import JobSpec
from workers import compile as compile_
from workers import data, faults, metrics_ab, models, throughput
from workers.checkpointer import Checkpointer, TrainState
from workers.context import RunContext
from workers.evaluator import Evaluator
from workers.loader import Layout, TrainBatches
from workers.metrics_processor import STOP_CODES, MetricsProcessor, TrainingError
from workers.optim import build_optimizer, build_scheduler, clip_grad_norm_
from workers.parallel import no_gradient_sync, parallelize
from workers.precision import Precision

__all__ = ["STOP_CODES", "Trainer", "TrainState", "TrainingError", "padded_logits", "train"]


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


class Trainer:
    """The model, its optimizer step and the loop; the components it is made of own the rest."""

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
        self.timer = throughput.PhaseTimer(self.device)
        self.grad_norm: torch.Tensor | None = None
        self.state = TrainState()
        # extension points (bench/metrics_overhead.py's A/B blocks): called with each step's
        # number after it; extra summary entries, computed at the end
        self.step_hooks: list[Callable[[int], None]] = []
        self.summary_extras: dict[str, Callable[[], object]] = {}
        self.checkpointer = Checkpointer(spec, ctx, self)
        self.metrics = MetricsProcessor(spec, ctx, self)
        self.evaluator = Evaluator(spec, ctx, self)
        self.collective_wait = throughput.CollectiveWait(self.model, self.timer)
        faults.apply(self, spec.name)  # only in the tests of hang and straggler detection

    # -- the step --------------------------------------------------------------------

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
            if last:  # its wait for the other ranks is not its compute
                self.collective_wait.backward_done()
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

    # -- the loop ----------------------------------------------------------------------

    def run(self) -> dict:
        self.checkpointer.resume()
        self.metrics.begin()
        status, reason = "succeeded", None
        try:
            batches = self.batches.iterate(self.state.step)
            while self.state.step < self.total_steps:
                with self.timer.host("data"):
                    micro_batches = next(batches)
                loss = self.step(micro_batches)
                self.state.step += 1
                step = self.state.step
                for hook in self.step_hooks:  # e.g. bench/metrics_overhead.py's step timing
                    hook(step)
                save_now, eval_now = self.checkpointer.should_save(step), self.evaluator.should_evaluate(step)
                stop = self.metrics.step_done(step, loss, settle=save_now or eval_now)
                if stop and step < self.total_steps:  # at the last step: just finish
                    status = "preempted" if stop == STOP_CODES["preempt"] else "stopped"
                    reason = f"{status} at step {step}"
                    break
                if eval_now:
                    with self.metrics.paused():
                        if self.evaluator.evaluate_and_check():
                            status = "stopped_early"
                            break
                if save_now:
                    with self.metrics.paused():
                        self.checkpointer.save()
        except TrainingError as err:
            status, reason = "failed", str(err)
        finally:
            self.metrics.close()
        return self._end(status, reason)

    def _end(self, status: str, reason: str | None) -> dict:
        """After the loop: the pending save, the final evaluation and checkpoint, the summary."""
        rates = self.metrics.meter.summary()
        self.checkpointer.publish_pending()  # an async save still being written (a good one, even on failure)
        elapsed = time.perf_counter() - self.metrics.started
        eval_metrics = self.evaluator.final_metrics(status)
        if status != "failed":
            self.checkpointer.save_final()  # or the step a preempted or stopped run resumes from
        self.ctx.flush_metrics()
        return self._summary(status, reason, rates, elapsed, eval_metrics)

    def _summary(
        self, status: str, reason: str | None, rates: dict, elapsed: float, eval_metrics: dict
    ) -> dict:
        """The run's summary (`core.summary` prints and writes it)."""
        spec, ctx, checkpointer = self.spec, self.ctx, self.checkpointer
        seq_len = self.info.seq_len if self.is_lm else 1
        samples_per_s = rates["samples_per_s"] or self.metrics.rate
        last_train = next((r for r in reversed(self.state.history) if records.is_train(r)), None)
        summary = {
            "job": spec.name,
            "run": getattr(ctx, "name", spec.name),
            "status": status,
            "reason": reason,
            "steps": self.state.step,
            "total_steps": self.total_steps,
            "final_train_loss": last_train[records.LOSS] if last_train else None,
            "eval": eval_metrics,
            "samples_per_s": samples_per_s,
            "tokens_per_s": samples_per_s * seq_len if self.is_lm else None,
            "samples_per_step": spec.data.batch_size * seq_len,
            "world_size": ctx.world_size,
            "checkpoint": checkpointer.last_checkpoint,
            "restarts": ctx.restarts,
            "resumed_from": ctx.resumed_from,
            "elapsed_s": elapsed,
            "throughput": rates,
            "compile_s": rates.get("compile_s"),
            "checkpoint_blocked_s": checkpointer.blocked_s,
            "checkpoint_saves": checkpointer.saves,
            "checkpoints_left": checkpointer.left_in_place(),
        }
        summary.update({key: extra() for key, extra in self.summary_extras.items()})
        return summary


def train(spec: JobSpec, ctx: RunContext) -> dict:
    trainer = Trainer(spec, ctx)
    metrics_ab.attach_from_env(trainer)  # only under bench/metrics_overhead.py
    return trainer.run()
