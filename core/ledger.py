"""A job's time ledger: every second from its submission to its end in exactly one bucket.

    queued         waiting in the queue (queued or preempted): it holds nothing
    starting       admitted, until the first step of the attempt: workers start, data and the
                   checkpoint load, the first steps compile
    training       running, on steps that were kept
    evaluating     evaluations (from the eval records)
    checkpointing  training blocked on a checkpoint save (`checkpoint_save_s` of the records)
    stopping       from a stop or preemption request, or the run's last step, until the job
                   lets its resources go: the handshake, the final evaluation and checkpoint,
                   the driver's exit
    lost           training on steps that a rollback threw away, and the restart after it
                   (from the admission or the failure to the first step again); for a job
                   that failed for good, its training since its newest checkpoint
    stalled        running, but no step for longer than `stall_after_s` (the hang detector's
                   timeout), evaluations and checkpoint saves not counted

The ledger folds the moments the service already sees: state changes (`state`), the metrics
records the driver reports (`record`: train and eval records), checkpoints (`checkpointed`),
and the resume of a run from a checkpoint (`rewound`). One rule keeps the buckets summing to
the wall time: time enters a bucket only by moving the ledger's clock `at` forward (never
back: a record older than the clock charges nothing), and what a later fact reclassifies
(a rollback, a checkpoint save, an evaluation) moves between buckets without changing the sum.
So at any moment `sum(seconds) == at - submitted_at`, and the open interval up to now goes to
the current bucket, `mode`.

Rollback. The ledger keeps, for the recent train records and for each checkpoint, how much
training time had been spent when the run reached that step. A run resumed at step S below
the newest step it had reached moves the training time spent since the checkpoint at S to
`lost`, and the attempt's start (the time since its admission in `starting`) too; until its
first step after that, time goes to `lost`. A resume at the newest step (a preemption that
checkpointed where it stopped) loses nothing. Between checkpoints the record trail is thinned
(every other entry) beyond `TRAIL` entries: a rollback to a step no mark holds exactly counts
the training since the nearest earlier mark.

Goodput follows Google's ML Productivity Goodput (docs/monitoring.md, "Goodput"):
scheduling = the time the job held its resources / its wall time; runtime = training / the time
it held its resources; program = MFU where known. Their product without MFU, training / wall
time, is what `orchestrator_job_goodput_ratio` shows.

Pure: no torch, no Ray, no clock of its own (every method takes the time); JSON-serialisable
through `to_dict`/`from_dict`, so the ledger lives in the job record and survives a restart of
the service.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from core import records
from core.jobs import JobState

QUEUED, STARTING, TRAINING = "queued", "starting", "training"
EVALUATING, CHECKPOINTING, STOPPING = "evaluating", "checkpointing", "stopping"
LOST, STALLED = "lost", "stalled"
BUCKETS = (QUEUED, STARTING, TRAINING, EVALUATING, CHECKPOINTING, STOPPING, LOST, STALLED)
ALLOCATED = tuple(b for b in BUCKETS if b != QUEUED)  # the job held its resources

# the step-time split of a train record (workers/throughput.py StepTimer.means): one step's time
STEP_PHASES = ("data_s", "compute_s", "optimizer_s")
SYNC_PHASE = "sync_s"  # a DDP rank's wait for the others, split out of compute on CPUs (or absent)
TRAIL = 64  # train records kept to place a checkpoint reported after them; thinned beyond this
MARKS = 8  # checkpoints kept for rollbacks, the newest


@dataclass
class Ledger:
    submitted_at: float
    stall_after_s: float | None = None  # no step for this long while training: stalled
    workers: int = 1  # for GPU-seconds: the job's current size
    gpus_per_worker: float = 0.0
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(BUCKETS, 0.0))
    at: float | None = None  # the clock: everything before it is in `seconds`
    mode: str = QUEUED  # where time after `at` goes
    ended_at: float | None = None
    step: int | None = None  # the newest step kept (None: none known yet)
    progress_at: float | None = None  # when the step last advanced (the stall clock)
    stepped: bool = False  # this attempt took a step
    starting_mark: float = 0.0  # seconds["starting"] when this attempt was admitted
    after_failure: bool = False  # the next start is a restart after a failure: lost time
    marks: list[list[float]] = field(default_factory=list)  # [step, training s] per checkpoint
    trail: list[list[float]] = field(default_factory=list)  # [step, training s] per train record
    pending: list[int] = field(default_factory=list)  # checkpoints ahead of the records
    run: list | None = None  # the run (attempt, worker group) whose start `began` has seen
    group: list | None = None  # the newest worker group restart `regrouped` has seen
    # a job of replica groups that trained on without one of them: time beside the buckets
    # (it is training time, at less than the job's size), from the loss to the heal
    degraded_s: float = 0.0
    degraded_since: float | None = None

    def __post_init__(self):
        if self.at is None:
            self.at = self.submitted_at

    # -- the moments the service sees ---------------------------------------------------------

    def state(self, state: JobState | str, now: float) -> None:
        """The job changed state (`Lifecycle.set_state`)."""
        state = JobState(state)
        if self.ended_at is not None or state is JobState.RUNNING:
            # running changes no bucket (the first step ends `starting`): a record the driver
            # reports later with an earlier time still counts
            return
        self._charge(now)
        if state is JobState.FAILED:  # what it trained since its newest checkpoint is never kept
            self._discard(max((s for s, _ in self.marks), default=0))
        if state.is_terminal:
            self.close(now)
        elif state.is_pending:
            self.mode, self.stepped = QUEUED, False
        elif state is JobState.ADMITTED:
            start = LOST if self.after_failure else STARTING
            self.mode, self.stepped, self.starting_mark = start, False, self.seconds[STARTING]
        elif state is JobState.STOPPING:
            self.mode = STOPPING

    def record(self, record: dict, now: float | None = None) -> None:
        """A metrics record the driver reported: train and eval records count, others not.
        Times are the records' own, capped at `now` (the service's clock) when given."""
        kind = records.kind_of(record)
        time = record.get(records.TIME)
        if kind not in (records.TRAIN, records.EVAL) or not _number(time):
            return
        time = min(time, now) if now is not None else time
        if kind == records.EVAL:
            self.evaluated(time, step=record.get(records.STEP))
            return
        phases = [record.get(k) for k in STEP_PHASES]
        self.train(
            int(record[records.STEP]),
            time,
            step_s=sum(phases) + (record.get(SYNC_PHASE) or 0.0) if all(_number(p) for p in phases) else None,
            checkpoint_s=record.get(records.CHECKPOINT_SAVE_S),
            total_steps=record.get(records.TOTAL_STEPS),
        )

    def train(
        self,
        step: int,
        time: float,
        step_s: float | None = None,
        checkpoint_s: float | None = None,
        total_steps: int | None = None,
    ) -> None:
        """A train record: the run reached `step` at `time`. `step_s` is one step's time (for
        the first record of an attempt: how much of its interval trained), `checkpoint_s` the
        time the newest save blocked training since the previous record."""
        if self.ended_at is not None or (self.step is not None and step <= self.step):
            return  # a record replayed from before a rewind, or one already counted
        before = self.seconds[TRAINING]
        if self.mode in (STARTING, LOST):  # the attempt's first step
            trained = step - (self.step if self.step is not None else step - 1)
            part = min(max(time - self.at, 0.0), trained * step_s) if _number(step_s) else 0.0
            self._charge(time - part)
            self.mode, self.stepped, self.after_failure = TRAINING, True, False
            self._charge(time)
        else:  # training, or stopping: the handshake's steps are kept, its time stays its own
            if self.mode in (TRAINING, STOPPING) and _number(checkpoint_s) and checkpoint_s > 0:
                self._pause(time, CHECKPOINTING, checkpoint_s)
            self._charge(time)
        after = self.seconds[TRAINING]
        for p in [p for p in self.pending if p <= step]:
            self._mark(p, after if p == step else before)
            self.pending.remove(p)
        self._trail(step, after)
        self.step, self.progress_at = step, self.at
        if total_steps is not None and step >= total_steps and self.mode == TRAINING:
            self.mode = STOPPING  # the last step: what follows winds the run down

    def evaluated(self, time: float, duration_s: float | None = None, step: int | None = None) -> None:
        """An evaluation that ended at `time`. Without its duration, an eval record at the step
        of the newest train record took all the time since that record (the training loop
        logs the step, then evaluates)."""
        if self.ended_at is not None:
            return
        if self.mode not in (TRAINING, STOPPING):  # the final evaluation comes after the last step
            self._charge(time)
            return
        if duration_s is None:
            duration_s = max(time - self.at, 0.0) if step is not None and step == self.step else 0.0
        self._pause(time, EVALUATING, duration_s)

    def checkpointed(self, step: int) -> None:
        """A checkpoint at `step` exists (the run may resume from it)."""
        if self.step is not None and step <= self.step:
            earlier = [t for s, t in self.trail if s <= step]
            self._mark(step, earlier[-1] if earlier else self.seconds[TRAINING])
        elif step not in self.pending:
            self.pending.append(step)

    def failed(self) -> None:
        """An attempt failed (a driver or node died, a start failed) and the job goes back to
        the queue: its next start, from admission to its first step, is lost time. (What it
        trained since its newest checkpoint is lost when the next run begins below it.)"""
        self.after_failure = True

    def began(self, run: list, step: int, time: float) -> None:
        """A run (an attempt, or a new worker group within one) started at `step`: `rewound`
        once per run, however many reports repeat it."""
        if self.run != list(run):
            self.run = list(run)
            self.rewound(step, time)

    def regrouped(self, group: list, time: float) -> None:
        """Ray Train started a new worker group within the attempt, after a failure (once per
        group): from the old group's newest record to the new group's first step is lost,
        `time` being the earliest the service heard of the new group."""
        if self.ended_at is not None or self.group == list(group):
            return
        self.group = list(group)
        if self.mode in (STARTING, TRAINING):  # the old group died after its newest record
            self.mode, self.stepped = LOST, False
        self._charge(time)

    def rewound(self, step: int, now: float) -> None:
        """A run (re)started from the checkpoint at `step` (0: from scratch). Below the newest
        step reached, a rollback: the training since that checkpoint and this attempt's start
        are lost, and so is the time until the next step."""
        if self.ended_at is not None:
            return
        self._charge(now)
        if self.step is not None and step < self.step:
            self._discard(step)
            if self.mode == STARTING:
                self._move(STARTING, LOST, self.seconds[STARTING] - self.starting_mark)
            if self.mode in (STARTING, TRAINING):
                self.mode, self.stepped = LOST, False
            self.marks = [m for m in self.marks if m[0] <= step]
            self.trail = [t for t in self.trail if t[0] <= step]
            self.pending = [p for p in self.pending if p <= step]
        self.step, self.progress_at = step, None
        if not any(s == step for s, _ in self.marks):
            self._mark(step, self.seconds[TRAINING])

    def close(self, now: float) -> None:
        """The job ended at `now`: the ledger is final."""
        if self.ended_at is None:
            self._charge(now)
            self.ended_at = self.at

    # -- reading ------------------------------------------------------------------------------

    def buckets(self, now: float) -> dict[str, float]:
        """Seconds per bucket up to `now` (to the end, for an ended job)."""
        if self.ended_at is not None:
            return dict(self.seconds)
        live = dataclasses.replace(self, seconds=dict(self.seconds))
        live._charge(now)
        return live.seconds

    def wall_s(self, now: float) -> float:
        end = self.ended_at if self.ended_at is not None else max(now, self.at)
        return end - self.submitted_at

    def gpu_seconds(self, now: float) -> dict[str, float]:
        """GPU-seconds per bucket: seconds x workers x GPUs per worker (the current size)."""
        return {b: s * self.workers * self.gpus_per_worker for b, s in self.buckets(now).items()}

    def goodput(self, now: float, mfu: float | None = None) -> Goodput:
        return Goodput.of(self.buckets(now), mfu)

    def degraded(self, now: float) -> None:
        """A replica group was lost and the others train on."""
        if self.degraded_since is None:
            self.degraded_since = now

    def whole(self, now: float) -> None:
        """Every replica group trains again (or the attempt ended)."""
        if self.degraded_since is not None:
            self.degraded_s += max(now - self.degraded_since, 0.0)
            self.degraded_since = None

    def degraded_seconds(self, now: float) -> float:
        since = self.degraded_since
        return self.degraded_s + (max(now - since, 0.0) if since is not None else 0.0)

    def view(self, now: float, mfu: float | None = None) -> dict[str, Any]:
        """What the CLI, the page and the exporter show: {"buckets": {bucket: s}, "wall_s",
        "gpu_seconds" (all buckets), "goodput": {"scheduling", "runtime", "program", "time"}}."""
        buckets = self.buckets(now)
        wall_s = sum(buckets.values())
        return {
            "buckets": buckets,
            "wall_s": wall_s,
            "gpu_seconds": wall_s * self.workers * self.gpus_per_worker,
            "goodput": Goodput.of(buckets, mfu).as_dict(),  # of the same buckets, charged once
            "degraded_s": self.degraded_seconds(now),  # with fewer replica groups than it has
        }

    # -- storage ------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Ledger:
        known = {f.name for f in dataclasses.fields(cls)}
        ledger = cls(**{k: v for k, v in data.items() if k in known})
        ledger.seconds = {b: float(ledger.seconds.get(b, 0.0)) for b in BUCKETS}
        return ledger

    # -- the clock ----------------------------------------------------------------------------

    def _charge(self, until: float) -> None:
        """Time from the clock to `until` into the current bucket; training past the stall
        threshold into `stalled`."""
        end = max(until, self.at)
        if self.mode == TRAINING and self.stall_after_s is not None and self.progress_at is not None:
            stall_from = min(max(self.progress_at + self.stall_after_s, self.at), end)
            self.seconds[TRAINING] += stall_from - self.at
            self.seconds[STALLED] += end - stall_from
        else:
            self.seconds[self.mode] += end - self.at
        self.at = end

    def _pause(self, time: float, bucket: str, duration_s: float) -> None:
        """Training paused for `duration_s` (an evaluation, a checkpoint save) within the time
        up to `time`: that much goes to `bucket`, and the stall clock stops meanwhile."""
        paused = min(max(duration_s, 0.0), max(time - self.at, 0.0))
        self._charge(time - paused)
        self.seconds[bucket] += paused
        self.at += paused
        if self.progress_at is not None:
            self.progress_at += paused

    def _discard(self, step: int) -> None:
        """The training spent on steps past `step` is lost: since the mark nearest below it."""
        base = [t for s, t in self.marks + self.trail if s <= step]
        self._move(TRAINING, LOST, self.seconds[TRAINING] - (max(base) if base else 0.0))

    def _move(self, source: str, target: str, amount: float) -> None:
        amount = min(max(amount, 0.0), self.seconds[source])
        self.seconds[source] -= amount
        self.seconds[target] += amount

    def _mark(self, step: int, training: float) -> None:
        self.marks = sorted([m for m in self.marks if m[0] != step] + [[step, training]])[-MARKS:]

    def _trail(self, step: int, training: float) -> None:
        self.trail.append([step, training])
        if len(self.trail) > TRAIL:  # thin the older half: every other entry
            half = len(self.trail) // 2
            self.trail = self.trail[:half:2] + self.trail[half:]


@dataclass(frozen=True)
class Goodput:
    """Google's ML Productivity Goodput factors (docs/monitoring.md, "Goodput"); None where
    undefined (no time yet, no MFU)."""

    scheduling: float | None  # time holding resources / wall time
    runtime: float | None  # kept training / time holding resources
    program: float | None  # MFU, where the device's peak is known

    @property
    def time(self) -> float | None:
        """scheduling x runtime = kept training / wall time: `orchestrator_job_goodput_ratio`."""
        if self.scheduling is None or self.runtime is None:
            return None
        return self.scheduling * self.runtime

    @property
    def overall(self) -> float | None:
        """The product of all three; None without MFU."""
        return None if self.time is None or self.program is None else self.time * self.program

    def as_dict(self) -> dict[str, float | None]:
        factors = ("scheduling", "runtime", "program", "time")
        return {name: getattr(self, name) for name in factors}

    @classmethod
    def of(cls, seconds: dict[str, float], mfu: float | None = None) -> Goodput:
        wall = sum(seconds.values())
        held = sum(seconds[b] for b in ALLOCATED)
        return cls(
            scheduling=held / wall if wall > 0 else None,
            runtime=seconds[TRAINING] / held if held > 0 else None,
            program=mfu if _number(mfu) else None,
        )


def cluster_goodput(jobs: Iterable[tuple[Ledger, float | None]], now: float) -> Goodput:
    """The cluster's goodput over `(ledger, mfu)` pairs: each job's seconds weighted by the
    accelerators it asks for (workers x GPUs per worker; workers for a CPU-only job), MFU
    averaged over the weighted training time of the jobs that know it."""
    total = dict.fromkeys(BUCKETS, 0.0)
    mfu_weighted, mfu_weight = 0.0, 0.0
    for ledger, mfu in jobs:
        weight, seconds = ledger.workers * (ledger.gpus_per_worker or 1.0), ledger.buckets(now)
        for bucket, value in seconds.items():
            total[bucket] += value * weight
        if _number(mfu):
            trained = seconds[TRAINING] * weight
            mfu_weighted, mfu_weight = mfu_weighted + mfu * trained, mfu_weight + trained
    return Goodput.of(total, mfu_weighted / mfu_weight if mfu_weight > 0 else None)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
