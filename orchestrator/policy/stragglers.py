"""Straggler detection, pure: which ranks of a job compute slower than the others?

Every rank reports the mean time per step of its own compute (`compute_s`: forward and
backward, its wait for the other ranks in the gradient all-reduce taken out) over an interval
of steps: rank 0 in each logged record, the others in a record of their own every few
seconds. Per rank, the window is its newest intervals that cover at least `WINDOW_STEPS`
steps, and its compute is the step-weighted mean over them. The rule, in one place:

    ratio(rank) = compute(rank) / median over the ranks of compute(rank)
    straggler   = ratio > THRESHOLD, once every rank reporting has a full window

A rank's first record is not counted: the interval it covers (from the start of the run,
with warm-up and compilation) is unknown. A new worker group starts new windows.
"""

from __future__ import annotations

import collections
import statistics
from dataclasses import dataclass, field

WINDOW_STEPS = 50
THRESHOLD = 1.2  # 20% over the median rank


@dataclass
class RankWindow:
    last_step: int | None = None  # of the newest record seen (the first one only sets it)
    intervals: collections.deque = field(default_factory=collections.deque)  # (steps, seconds)
    steps: int = 0  # covered by `intervals`
    seconds: float = 0.0

    def add(self, step: int, compute_s: float, window: int) -> None:
        last, self.last_step = self.last_step, step
        if last is None or step <= last:
            return
        steps = step - last
        self.intervals.append((steps, compute_s * steps))
        self.steps += steps
        self.seconds += compute_s * steps
        while self.intervals and self.steps - self.intervals[0][0] >= window:
            old_steps, old_seconds = self.intervals.popleft()
            self.steps -= old_steps
            self.seconds -= old_seconds

    def mean(self) -> float:
        return self.seconds / self.steps


class StragglerWindow:
    """The per-rank compute windows of one job's current worker group."""

    def __init__(self, window_steps: int = WINDOW_STEPS, threshold: float = THRESHOLD):
        self.window_steps, self.threshold = window_steps, threshold
        self.ranks: dict[int, RankWindow] = {}

    def add(self, rank: int, step: int, compute_s: float | None) -> None:
        if compute_s is None or compute_s < 0:
            return
        self.ranks.setdefault(rank, RankWindow()).add(step, compute_s, self.window_steps)

    def ratios(self) -> dict[int, float]:
        """Each rank's compute over the median rank's; {} until every rank has a full window."""
        if len(self.ranks) < 2 or any(w.steps < self.window_steps for w in self.ranks.values()):
            return {}
        means = {rank: w.mean() for rank, w in self.ranks.items()}
        median = statistics.median(means.values())
        if median <= 0:
            return {}
        return {rank: mean / median for rank, mean in sorted(means.items())}

    def stragglers(self) -> dict[int, float]:
        """The flagged ranks and their ratios."""
        return {rank: ratio for rank, ratio in self.ratios().items() if ratio > self.threshold}
