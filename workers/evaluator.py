"""The training loop's evaluator: when to evaluate, the evaluation itself, and early stopping.

It owns the cadence (`train.eval_every`; the last step's evaluation is the final one, made
after the loop), the loss and accuracy (and perplexity for a language model) over the eval
split summed over the ranks, early stopping (`train.early_stopping`, on the best eval loss
kept in the `TrainState`), and logging the eval records. The trainer hands it the parts it
evaluates with: the model, the datasets, the loss and the precision's autocast.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from core import records
from core.spec import JobSpec
from workers.context import RunContext
from workers.data import Datasets
from workers.loader import eval_batches
from workers.loss import Loss
from workers.precision import Precision
from workers.train_state import TrainState


def _all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(tensor)
    return tensor.tolist()


class Evaluator:
    def __init__(
        self,
        spec: JobSpec,
        ctx: RunContext,
        state: TrainState,
        *,
        datasets: Datasets,
        model: torch.nn.Module,
        loss: Loss,
        precision: Precision,
        micro_batch: int,
        total_steps: int,
        message: Callable[[str], None],
        log_record: Callable[[dict], None],
    ):
        """`micro_batch`: the eval batch size when the spec names none; `message`: shows a
        line to whoever watches the run (the progress reporter's); `log_record`: rank 0's
        records to the job's log (the metrics processor's)."""
        self.spec, self.ctx, self.state = spec, ctx, state
        self.datasets, self.model, self.loss, self.precision = datasets, model, loss, precision
        self.micro_batch, self.total_steps, self.message = micro_batch, total_steps, message
        self.log_record = log_record
        self.last: dict = {}  # the newest evaluation's metrics

    def should_evaluate(self, step: int) -> bool:
        every = self.spec.train.eval_every
        return bool(every) and step % every == 0 and step < self.total_steps

    @torch.no_grad()
    def evaluate(self) -> dict:
        """{eval_loss, eval_accuracy[, eval_perplexity]} over the eval split; {} without one."""
        spec, model = self.spec, self.model
        datasets, device = self.datasets, self.ctx.device
        if datasets.eval is None:
            return {}
        model.eval()
        loader = eval_batches(
            datasets.eval,
            self.ctx.rank,
            self.ctx.world_size,
            spec.data.eval_batch_size or self.micro_batch,
            spec.data.loader_workers,
            sharded=datasets.sharded,
        )
        loss_sum = correct = count = 0.0
        for i, (x, y) in enumerate(loader):
            if spec.train.eval_batches and i >= spec.train.eval_batches:
                break
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with self.precision.autocast():
                logits = model(x)
            n = y.numel()
            loss_sum += self.loss(logits, y, 0.0).item() * n
            correct += (logits.argmax(-1) == y).sum().item()
            count += n
        model.train()
        loss_sum, correct, count = _all_reduce_sum([loss_sum, correct, count], device)
        loss = loss_sum / max(count, 1)
        result = {"eval_loss": loss, "eval_accuracy": correct / max(count, 1)}
        if datasets.info.kind == "tokens":  # a language model
            result["eval_perplexity"] = math.exp(min(loss, 50.0))
        return result

    def evaluate_and_check(self) -> bool:
        """Evaluate and log it; True when early stopping says to stop."""
        metrics = self.evaluate()
        if not metrics:
            return False
        self._log(metrics)
        self.last = metrics
        early, state = self.spec.train.early_stopping, self.state
        if early is None:
            return False
        if metrics["eval_loss"] < state.best_eval_loss - early.min_delta:
            state.best_eval_loss = metrics["eval_loss"]
            state.evals_without_improvement = 0
            return False
        state.evals_without_improvement += 1
        return state.evals_without_improvement >= early.patience

    def final_metrics(self, status: str) -> dict:
        """The evaluation a run's summary reports: a fresh one after a finished run, the one
        just made when early stopping ended it, none otherwise."""
        if status == "stopped_early":
            return self.last
        if status != "succeeded":
            return {}
        metrics = self.evaluate()
        if metrics:
            self._log(metrics)
        return metrics

    def _log(self, metrics: dict) -> None:
        step = self.state.step
        record = {records.STEP: step, **metrics, records.TIME: time.time()}
        self.state.history.append(record)
        if self.ctx.is_main:
            self.log_record(record)
        self.message(f"eval at step {step}: {records.format_eval(metrics)}")
