"""The per-worker training loop: the same code under a single process, torchrun and Ray Train.

`Trainer(spec, ctx)` builds data, model, optimizer and schedule from the spec; `run()` resumes
from the checkpoint the context names, trains, evaluates, checkpoints, and returns a summary
(`workers.run.train` makes one and runs it).
The trainer owns the model and the optimizer step; its components own the rest, each with
its own cadence, each handed the parts it needs: `Checkpointer` (saves and resuming),
`MetricsProcessor` (records, the sums over the ranks, stop requests) and `Evaluator`
(evaluation, early stopping).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import torch

from core import records
from core.spec import JobSpec
from workers import data, models, replicas, throughput
from workers.checkpointer import Checkpointer
from workers.context import RunContext
from workers.evaluator import Evaluator
from workers.loader import Layout, TrainBatches
from workers.loss import Loss
from workers.metrics_processor import STOP_CODES, MetricsProcessor, TrainingError
from workers.optim import build_optimizer, build_scheduler, clip_grad_norm_
from workers.parallel import no_gradient_sync, parallelize
from workers.precision import Precision
from workers.train_state import TrainState

__all__ = ["STOP_CODES", "Trainer", "TrainState", "TrainingError"]


class Trainer:
    """The model, its optimizer step and the loop; the components it is made of own the rest."""

    def __init__(self, spec: JobSpec, ctx: RunContext):
        self.spec, self.ctx = spec, ctx
        # when this process reached each stage of its start (wall clock): the summary's
        # `startup`, which bench/first_step.py reads to say where a start goes
        self.startup = {"process": throughput.process_started(), **ctx.started}
        ctx.setup()
        self.startup["process_group"] = time.time()
        self.device = ctx.device
        seed = spec.train.seed
        # with replica groups, each group trains on a share of the data of its own
        rank, world = replicas.data_position(spec, ctx)
        self.datasets = data.load(spec.data, seed=seed, rank=rank, world_size=world)
        self.startup["data"] = time.time()
        self.info = self.datasets.info
        self.is_lm = self.info.kind == "tokens"

        torch.manual_seed(seed)  # identical initial weights on every rank
        model = models.build(spec.model, self.info, kernels=spec.kernels.as_dict()).to(self.device)
        self.model = parallelize(model, spec, mesh=None)
        self.startup["model"] = time.time()
        torch.manual_seed(seed + 1 + rank)  # independent dropout streams per rank

        self.layout = Layout(
            spec.data.batch_size,
            world,
            rank,
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
        self.loss = Loss(spec)
        self.scheduler = build_scheduler(self.optimizer, spec.scheduler, self.total_steps)
        self.precision = Precision(spec.precision, self.device, strategy=spec.parallel.strategy)
        self.timer = throughput.PhaseTimer(self.device)
        self.grad_norm: torch.Tensor | None = None
        self.state = TrainState()
        # extension points (bench/metrics_overhead.py's A/B blocks, attached from outside by
        # `metrics_ab.attach_from_env`): called with each step's number after it; extra
        # summary entries, computed at the end
        self.step_hooks: list[Callable[[int], None]] = []
        self.summary_extras: dict[str, Callable[[], object]] = {}
        self._build_components()
        self.collective_wait = throughput.CollectiveWait(self.model, self.timer)
        # the quorum of the job's replica groups, or None for a job of one group
        self.replicas = replicas.join(
            spec,
            ctx,
            state=self.state,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            scaler=self.precision.scaler,
        )
        if self.replicas is not None:
            self.metrics.writes = lambda: self.replicas.leads
            self.metrics.log_from_here = self.replicas.log_from_here
            self.metrics.durable = self.replicas.lacked_by_a_joined_group

    def _build_components(self) -> None:
        """The checkpointer, the metrics processor and the evaluator, each handed its parts."""
        spec, ctx, state = self.spec, self.ctx, self.state
        self.checkpointer = Checkpointer(
            spec,
            ctx,
            state,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            scaler=self.precision.scaler,
        )
        self.metrics = MetricsProcessor(
            spec,
            ctx,
            state,
            info=self.info,
            total_steps=self.total_steps,
            steps_per_epoch=self.batches.steps_per_epoch,
            timer=self.timer,
            scheduler=self.scheduler,
            save_fields=self.checkpointer.take_save_fields,
        )
        self.evaluator = Evaluator(
            spec,
            ctx,
            state,
            datasets=self.datasets,
            model=self.model,
            loss=self.loss,
            precision=self.precision,
            micro_batch=self.layout.micro_batch,
            total_steps=self.total_steps,
            message=self.metrics.message,
            log_record=self.metrics.log_record,
        )

    # -- the step --------------------------------------------------------------------

    def step(self, micro_batches: list) -> torch.Tensor | None:
        """One optimizer step over the micro-batches; returns this rank's mean loss (a tensor),
        or None where a replica group was lost during the step (no group stepped)."""
        if self.replicas is not None:
            self.replicas.begin()  # a group behind its peers loads a peer's state first
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
            if self.replicas is not None:
                self.replicas.average(self.model)
            committed = self.replicas is None or self.replicas.commit()
            if committed:
                if self.spec.train.clip_grad_norm:
                    scaler.unscale_(self.optimizer)
                    # the norm before clipping, kept as a tensor: read only at logging steps
                    self.grad_norm = clip_grad_norm_(self.model, self.spec.train.clip_grad_norm)
                scaler.step(self.optimizer)
                scaler.update()
            self.optimizer.zero_grad(set_to_none=True)
        if committed:
            self.scheduler.step()
        self.timer.step_done()
        return total if committed else None

    # -- replica groups ------------------------------------------------------------------

    def _writes(self) -> bool:
        """Whether this group writes the job's checkpoints (all of them but with replica groups,
        where the leading group does)."""
        return self.replicas is None or self.replicas.leads

    def _after_healing(self, batches):
        """The batches from this group's step on, after it healed to a peer's step."""
        if self.replicas is None or not self.replicas.take_healed():
            return batches
        self.ctx.replica_healed(self.replicas.healed_at[-1])
        return self.batches.iterate(self.state.step)

    # -- the loop ----------------------------------------------------------------------

    def run(self) -> dict:
        self.checkpointer.resume()
        if self.replicas is not None:  # the quorum counts steps from the checkpoint's
            self.replicas.continue_from(self.state.step)
        self.metrics.begin()
        status, reason = "succeeded", None
        try:
            batches = self.batches.iterate(self.state.step)
            while self.state.step < self.total_steps:
                with self.timer.host("data"):
                    micro_batches = next(batches)
                loss = self.step(micro_batches)
                if loss is None:  # a group lost mid-step: the step again, with the groups left
                    batches = self._after_healing(batches)
                    continue
                self.state.step += 1
                batches = self._after_healing(batches)
                step = self.state.step
                self.startup.setdefault("first_step", time.time())
                for hook in self.step_hooks:  # e.g. bench/metrics_overhead.py's step timing
                    hook(step)
                save_now = self._writes() and self.checkpointer.should_save(step)
                eval_now = self.evaluator.should_evaluate(step)
                stop = self.metrics.step_done(
                    step, loss, settle=save_now or eval_now, grad_norm=self.grad_norm
                )
                if self.replicas is not None:  # a stop request reaches every group at this step
                    leave = stop == STOP_CODES["leave"]  # this group alone, after the step's agreement
                    stop = self.replicas.stop_agreed(0 if leave else stop)
                    if leave:  # the others' next quorum goes on without this group
                        self.replicas.shutdown()
                        status, reason = "left", f"left the job's replica groups at step {step}"
                        break
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
        if status not in ("failed", "left") and self._writes():
            self.checkpointer.save_final()  # or the step a preempted or stopped run resumes from
            self.ctx.settle_checkpoints()
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
            "startup": self.startup,
            # fp16: the loss scaler's scale at the end (halved at each step it skipped)
            "loss_scale": scaler.get_scale() if (scaler := self.precision.scaler).is_enabled() else None,
        }
        if self.replicas is not None:
            summary["replica_group"] = self.replicas.summary()
        summary.update({key: extra() for key, extra in self.summary_extras.items()})
        return summary
