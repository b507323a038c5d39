"""Metrics on and off within one run, for `bench/metrics_overhead.py`.

Between separate runs, step times on a small shared machine drift by 10% and more, which
hides a cost of 1-2%. So with `ORCHESTRATOR_METRICS_AB_BLOCK=N` in the workers' environment,
the loop logs metrics in some blocks of N steps and not in others, and each step's wall time is
filed under its block's side: both sides are measured in the same processes, a few seconds
apart. The first block is a warm-up (logging, not measured: steps get faster over a run's
first seconds), then the blocks go on, off, off, on, on, off, off, on, ...: over each four, a
steady drift in step time weighs on both sides alike, where on/off/on/off would charge it to
one side. The first steps of each block, which carry the switch, are left out. Each side's figure is
its mean step time: a cost paid every so many steps (a batch of records sent) counts in full,
where a median would hide it.
"""

from __future__ import annotations

import os
import statistics
import time

ENV = "ORCHESTRATOR_METRICS_AB_BLOCK"


def from_env() -> MetricsAB | None:
    block = int(os.environ.get(ENV) or 0)
    return MetricsAB(block) if block > 0 else None


class MetricsAB:
    def __init__(self, block: int):
        self.block = block
        self.step_s: dict[str, list[float]] = {"on": [], "off": []}
        self._last: float | None = None

    def side(self, step: int) -> str | None:
        """ "on" or "off" for the step's block; None in the warm-up block."""
        block = step // self.block - 1
        if block < 0:
            return None
        return "on" if (block + 1) // 2 % 2 == 0 else "off"

    def logging_on(self, step: int) -> bool:
        return self.side(step) != "off"

    def step_done(self, step: int) -> None:
        now = time.perf_counter()
        side = self.side(step)
        if self._last is not None and side is not None and step % self.block >= 2:
            self.step_s[side].append(now - self._last)
        self._last = now

    def summary(self) -> dict:
        on, off = self.step_s["on"], self.step_s["off"]
        return {
            "block": self.block,
            "on_step_s": statistics.fmean(on) if on else None,
            "off_step_s": statistics.fmean(off) if off else None,
            "on_median_s": statistics.median(on) if on else None,
            "off_median_s": statistics.median(off) if off else None,
            "steps": {k: len(v) for k, v in self.step_s.items()},
        }


def attach_from_env(trainer) -> MetricsAB | None:
    """With the variable set: file each step of `trainer`'s loop under its block's side, log
    only in "on" blocks, and report both sides in the summary's `metrics_ab`."""
    ab = from_env()
    if ab is not None:
        trainer.step_hooks.append(ab.step_done)
        trainer.metrics.logging_gates.append(ab.logging_on)
        trainer.summary_extras["metrics_ab"] = ab.summary
    return ab
