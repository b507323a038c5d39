"""Hang detection, pure: when has a running attempt made no step progress for too long?

The service sees a job's progress as the newest logged step its driver reports (every 2 s,
from records rank 0 logs every `metrics.log_every` steps), so the unit of progress is the
interval between two logged steps. The rule, in one place:

    timeout  = fault_tolerance.hang_timeout_s, or else
               max(FLOOR_S, MULTIPLE x the p95 of this attempt's intervals between logged steps)
    start    = fault_tolerance.hang_timeout_s, or else max(START_FLOOR_S, the automatic timeout)
    hung     = armed (the worker group has stepped past the step it started or resumed at)
               and no new step for longer than the timeout, plus as much again when a
               checkpoint or an evaluation falls due before the next logged step (a save or an
               evaluation is not a hang), and never after the last step (the run is finishing);
               or, not armed yet, no step for longer than the start timeout since the group's
               workers all started, or since its run began (its checkpoint loaded), if later

A new worker group (a restart inside the attempt) starts a new clock. Starting, loading a
checkpoint and compiling are judged by the start timeout only, which the default sets well
above any normal start-up (torch.compile included).
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from core import records

FLOOR_S = 120.0  # the shortest automatic timeout: start-up hiccups, a slow storage write
START_FLOOR_S = 600.0  # the shortest automatic start timeout: workers to the first logged step
MULTIPLE = 10.0  # x the p95 interval between logged steps
KEEP_INTERVALS = 200  # the newest intervals the p95 is taken over


def p95(values: Iterable[float]) -> float | None:
    """The 95th percentile (nearest rank); None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[max(math.ceil(0.95 * len(ordered)) - 1, 0)]


def timeout_s(configured: float | None, p95_interval_s: float | None) -> float:
    """The no-progress time after which an attempt is hung (see the module's rule)."""
    if configured is not None:
        return configured
    return max(FLOOR_S, MULTIPLE * (p95_interval_s or 0.0))


def start_timeout_s(configured: float | None, p95_interval_s: float | None) -> float:
    """The time a worker group may take from its start to its first logged step."""
    if configured is not None:
        return configured
    return max(START_FLOOR_S, timeout_s(None, p95_interval_s))


def start_stuck(admitted_at: float | None, last_start: float, now: float, deadline_s: float) -> bool:
    """Whether an admitted job's start went `deadline_s` without progress: since its admission,
    or since another job last got all its workers started (`last_start`), whichever is later.
    Ray starts a node's worker processes a few at a time, so a start queued behind the others'
    is slow, not stuck, while they get through (8 jobs admitted at once on a 2-core head got
    their workers one after the other over 3 to 5 minutes)."""
    return now - max(admitted_at if admitted_at is not None else now, last_start) > deadline_s


def may_be_busy(step: int, log_every: int, every: Iterable[int | None], total_steps: int | None) -> bool:
    """Whether a checkpoint, an evaluation or the run's end falls after `step` and at or before
    the next logged step: the loop may be saving or evaluating, not stepping."""
    following = step + log_every
    if total_steps is not None and following >= total_steps:
        return True
    return any(n and following // n > step // n for n in every)


@dataclass
class StepClock:
    """One job's step progress as the service sees it, for the current worker group."""

    group: int | None = None  # the worker group (restarts so far in the attempt)
    step: int | None = None
    since: float = 0.0  # when `step` last changed, or the group started
    started: float | None = None  # when its workers were all up, or later its run began (None: not yet)
    began: bool = False  # its run began at its start step (a checkpoint's, or 0)
    armed: bool = False  # the group has stepped past its start
    fired: bool = False  # this stall was already handled
    intervals: collections.deque = field(default_factory=lambda: collections.deque(maxlen=KEEP_INTERVALS))
    _last_record: tuple[float, int] | None = None  # (time, step) of the newest train record

    def observe(
        self, step: int | None, group: int, now: float, start: int | None = None, workers_up: bool = False
    ) -> None:
        """A report: the newest step, the worker group it came from, the step that group
        started or resumed at (None while it is still starting), and whether its workers are up."""
        if group != self.group:  # a new worker group: a new clock
            self.group, self.step, self.since, self.armed, self.fired = group, None, now, False, False
            self.started, self.began, self._last_record = None, False, None
        if step is not None and step != self.step:
            self.step, self.since, self.fired = step, now, False
        began, self.began = start is not None and not self.began, self.began or start is not None
        if workers_up and (self.started is None or began):  # up, or done loading its start
            self.started = now
        self.armed = self.armed or (step is not None and start is not None and step > start)

    def add_records(self, batch: Iterable[dict]) -> None:
        """Train records: the intervals between logged steps, measured where they were logged."""
        for r in batch:
            if not records.is_train(r) or records.TIME not in r:
                continue
            now, step = float(r[records.TIME]), int(r[records.STEP])
            last = self._last_record
            if last is not None and step > last[1] and now >= last[0]:
                self.intervals.append(now - last[0])
            self._last_record = (now, step)

    def p95_interval_s(self) -> float | None:
        return p95(self.intervals)

    def stalled_s(self, now: float) -> float:
        """Seconds without progress: since the newest step, or before the group's first step,
        since its workers started or its run began, or its step last changed, whichever is latest."""
        if self.armed or self.started is None:
            return now - self.since
        return now - max(self.since, self.started)

    def hung(
        self,
        now: float,
        timeout: float,
        log_every: int,
        every: Iterable[int | None] = (),
        total_steps: int | None = None,
        start_timeout: float | None = None,
    ) -> bool:
        """Whether the group is hung now (the rule in the module's docstring)."""
        if self.fired or (total_steps is not None and self.step is not None and self.step >= total_steps):
            return False
        if not self.armed:  # no first step yet: only the start timeout applies
            started = self.started is not None and start_timeout is not None
            return started and self.stalled_s(now) > start_timeout
        if self.step is None:
            return False
        allowed = timeout * (2 if may_be_busy(self.step, log_every, every, total_steps) else 1)
        return self.stalled_s(now) > allowed
