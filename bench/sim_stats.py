"""Statistics the scheduling simulators share (`scheduler_sim.py`, `trace_sim.py`)."""

from __future__ import annotations

import math
import statistics


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile, interpolated between the two nearest ranks; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = q / 100 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def decision_summary(decision_ms: list[float]) -> dict:
    """How long the policy's passes took, in milliseconds."""
    return {
        "events": len(decision_ms),
        "mean": statistics.fmean(decision_ms),
        "p50": percentile(decision_ms, 50),
        "p99": percentile(decision_ms, 99),
        "max": max(decision_ms),
    }
