"""Metrics on and off within one run, for `bench/metrics_overhead.py`.

Between separate runs, step times on a small shared machine drift by 10% and more, which
hides a cost of 1-2%. So with `ORCHESTRATOR_METRICS_AB_BLOCK=N` in the workers' environment,
the loop logs metrics only in every other block of N steps, and each step's wall time is filed
under its block's side: both sides are measured in the same processes, a few seconds apart.
The first steps of each block, which carry the switch, are left out.
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

    def logging_on(self, step: int) -> bool:
        return (step // self.block) % 2 == 0

    def step_done(self, step: int) -> None:
        now = time.perf_counter()
        if self._last is not None and step % self.block >= 2:
            self.step_s["on" if self.logging_on(step) else "off"].append(now - self._last)
        self._last = now

    def summary(self) -> dict:
        on, off = (statistics.median(v) if v else None for v in (self.step_s["on"], self.step_s["off"]))
        return {
            "block": self.block,
            "on_step_s": on,
            "off_step_s": off,
            "steps": {k: len(v) for k, v in self.step_s.items()},
        }
