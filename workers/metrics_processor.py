"""The training loop's metrics: which steps are logged, and the sums over the ranks that
complete their records without making training wait.

It owns the cadence (`metrics.log_every`, and always the last step, unless a logging gate
says no), rank 0's record of a logged step and the other ranks' records of themselves (every
`ctx.rank_metrics_every_s`), the samples/s between logged steps, the throughput meter, the
non-blocking step sums (`workers.step_sums`) with the non-finite check and rank 0's stop
request folded into them, the history and `ctx.log_metrics` for finished records, and the
progress reporter. The trainer hands it what its records read: the `TrainState`, the data's
description, the step timer, the schedule (for the learning rate) and the checkpointer's newest
save fields; each step's loss and gradient norm come with `step_done`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import torch

from core import records
from core.spec import JobSpec
from workers import throughput
from workers.context import RunContext
from workers.data import DataInfo
from workers.progress import ProgressReporter
from workers.step_sums import StepSums
from workers.train_state import TrainState

log = logging.getLogger("workers")

# what rank 0 puts into the sum for a stop request; "leave": this replica group alone ends
# (its launcher judged it lost), without a checkpoint, while the others train on
STOP_CODES = {None: 0, "stop": 1, "preempt": 2, "leave": 3}


class TrainingError(RuntimeError):
    """The run cannot go on (non-finite loss, ...); its last good checkpoint is kept."""


class MetricsProcessor:
    def __init__(
        self,
        spec: JobSpec,
        ctx: RunContext,
        state: TrainState,
        *,
        info: DataInfo,
        total_steps: int,
        steps_per_epoch: int,
        timer: throughput.PhaseTimer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        save_fields: Callable[[], dict],
    ):
        """`save_fields`: the newest checkpoint save's fields, once (`Checkpointer.take_save_fields`)."""
        self.spec, self.ctx, self.state, self.info = spec, ctx, state, info
        self.total_steps, self.steps_per_epoch = total_steps, steps_per_epoch
        self.timer, self.scheduler, self.save_fields = timer, scheduler, save_fields
        self.is_lm = info.kind == "tokens"
        # each may veto logging a step (bench/metrics_overhead.py turns logging off in blocks)
        self.logging_gates: list[Callable[[int], bool]] = []
        self.meter = throughput.Meter(
            ctx.device,
            spec.data.batch_size,
            info.seq_len if self.is_lm else 1,
            # the job's workers: with replica groups, every group's (they step together)
            ctx.world_size * spec.fault_tolerance.replica_groups,
            self._flops_per_sample(),
            spec.precision.dtype,
            compiled=spec.precision.compile,
        )
        self.rate = 0.0  # samples/s between the last two logged steps
        # whether this rank 0 writes the job's log now; None: always. With replica groups, the
        # leading group's (workers/replicas.py): a group that comes to lead starts a version of
        # the log of its own from its history, which supersedes the last leader's
        self.writes: Callable[[], bool] | None = None
        self.log_from_here: Callable[[], list[dict]] = lambda: list(self.state.history)
        # whether a step's record must be in storage as soon as it is logged (replica groups:
        # a record a group that joined lacks)
        self.durable: Callable[[int], bool] = lambda step: False
        self._writing = False

    def _flops_per_sample(self) -> int | None:
        try:
            return throughput.train_flops_per_sample(self.spec.model, self.info)
        except Exception as err:  # accounting must never stop training
            log.warning("cannot count model FLOPs (%s); throughput without FLOP/s", err)
            return None

    def should_log(self, step: int) -> bool:
        if step == self.total_steps:
            return True
        return step % self.spec.metrics.log_every == 0 and all(gate(step) for gate in self.logging_gates)

    def paused(self):
        """A context in which time (an evaluation, a save) does not count toward throughput."""
        return self.meter.pause()

    # -- the run -------------------------------------------------------------------------

    def begin(self) -> None:
        """Before the first step (after any resume)."""
        ctx, step, device = self.ctx, self.state.step, self.ctx.device
        self.progress = ProgressReporter(
            self.spec.name, self.total_steps, step, enabled=ctx.is_main and ctx.shows_progress
        )
        if step and ctx.is_main:
            self.progress.message(f"resuming at step {step}")
        self.started = time.perf_counter()
        self.meter.restart()  # throughput excludes the first step (warm-up, compile) and eval/saves
        self._last_log = (self.started, step)
        self._nonfinite = torch.zeros((), dtype=torch.bool, device=device)
        self.sums = StepSums(device, ctx.world_size, ctx.is_main)
        self._rank_sent = -math.inf  # ranks but 0: when they last sent their own record
        self.timer.enabled = ctx.is_main or ctx.rank_metrics_every_s is not None  # else unread

    def message(self, text: str) -> None:
        """Show a line to whoever watches the run (after `begin`)."""
        self.progress.message(text)

    def step_done(
        self, step: int, loss: torch.Tensor, settle: bool, grad_norm: torch.Tensor | None = None
    ) -> int:
        """After each step: log it if due (with the step's gradient norm, a tensor, or None
        without clipping), and sum over the ranks when due. With `settle` (a
        checkpoint or an evaluation follows) wait for the sum. Returns rank 0's stop code as
        every rank learns it (0: go on); raises TrainingError on a non-finite loss."""
        self._nonfinite |= ~torch.isfinite(loss)
        self.meter.step_done()
        # a sum started one step ago is finished by now: its records are logged here
        stop = self._take_sums()
        if self.should_log(step):
            self._log(step, loss, grad_norm)
        # before a checkpoint, an evaluation or the end, the log and the checkpoint's history
        # must hold every record so far: sum now and wait for it
        settle = settle or bool(stop) or step == self.total_steps
        if settle or self.sums.due(step):
            # rank 0 folds a stop request into a sum made anyway: every rank learns of it at
            # the same step, for no extra communication
            stop_code = STOP_CODES.get(self.ctx.stop_requested(), 0) if self.ctx.is_main else 0
            self.sums.start(step, self._nonfinite, stop_code)
        if settle:
            stop = self._take_sums() or stop
        return stop

    def log_record(self, record: dict) -> None:
        """Rank 0's finished record (already in the history) to the job's log, if it writes it."""
        if self.writes is None:
            self.ctx.log_metrics(record)
            return
        writes = self.writes()
        if writes and not self._writing:
            self.ctx.restore_metrics(self.log_from_here())
        elif writes:
            self.ctx.log_metrics(record)
            if self.durable(record[records.STEP]):
                self.ctx.flush_metrics()
        self._writing = writes

    def close(self) -> None:
        self.sums.discard()  # after a failure: nothing more to log or wait for
        self.progress.close()

    # -- records ---------------------------------------------------------------------------

    def _log(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor | None) -> None:
        now = time.perf_counter()
        last_time, last_step = self._last_log
        self.rate = (step - last_step) * self.spec.data.batch_size / max(now - last_time, 1e-9)
        self._last_log = (now, step)
        if self.ctx.is_main:
            # the gradient norm stays a tensor until the sum completes: no host sync
            on_device = None if grad_norm is None else {records.GRAD_NORM: grad_norm}
            self.sums.add(self._record(step), loss, on_device)
            return
        self.sums.add(None, loss)  # only rank 0's records are kept; the others add their loss
        every = self.ctx.rank_metrics_every_s
        if every is not None and now - self._rank_sent >= every:
            self.ctx.log_rank_metrics(self._rank_record(step))
            self._rank_sent = now

    def _record(self, step: int) -> dict:
        """Rank 0's record of a logged step; the loss and gradient norm join it with the sum."""
        record = {
            records.STEP: step,
            "epoch": step / self.steps_per_epoch,
            records.TOTAL_STEPS: self.total_steps,
            "rank": 0,
        }
        record.update(self.timer.means())  # the step time split over the interval
        record.update(throughput.memory_fields(self.ctx.device))
        record.update(self.save_fields())  # the newest save, once
        record[records.LR] = self.scheduler.get_last_lr()[0]
        record[records.SAMPLES_PER_S] = self.rate
        record.update(self.meter.log_fields(self.rate))  # tokens/s, TFLOP/s, MFU
        record[records.TIME] = time.time()
        return record

    def _rank_record(self, step: int) -> dict:
        """What the other ranks report of themselves: their step time split and memory."""
        return {
            records.STEP: step,
            "rank": self.ctx.rank,
            **self.timer.means(),
            **throughput.memory_fields(self.ctx.device),
            records.TIME: time.time(),
        }

    def _take_sums(self) -> int:
        """Finish the sum in flight: log the records it completes, raise on a non-finite loss,
        and return rank 0's stop code."""
        finished = self.sums.finish()
        if finished is None:
            return 0
        step, completed, nonfinite, stop = finished
        if nonfinite:
            raise TrainingError(f"loss is not finite at or before step {step}")
        for record in completed:  # rank 0's: the other ranks keep none (only rank 0 checkpoints them)
            self.state.history.append(record)
            self.log_record(record)
        if completed:
            last = completed[-1]
            self.progress.update(
                last[records.STEP], last[records.LOSS], last[records.SAMPLES_PER_S], last[records.LR]
            )
        return stop
