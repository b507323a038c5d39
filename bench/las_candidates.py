"""The LAS orders tried in issue 51's sweep of load (`scheduler_philly.py --sweep --orders`).

Each is a queue file's `las:` block with `las-share`'s tuning, built like `las-share` by
`trace_sim.make_policy`. `issue-34` is `las-share` as issue 34 shipped it (no wait before
preempting); the other names say what they change from it. `wait-1h` won the sweep and is
what `las-share`, the default, now is (`core.queues.LAS_SHARE_DEFAULTS`): `default` and
`wait-1h` replay the same. Kept so that the sweep's tables can be replayed.

Only what the queue file can say is here. The candidates that needed knobs of their own (a
minimum run grown with the run before it, a starvation limit in time, promotion that stops no
peers) lost and left the product with their knobs; their figures in docs/scheduler.md were
measured at commit 7dc4287, whose copy of this file has them.
"""

from __future__ import annotations

from orchestrator.policy.las import LAS_SHARE_SETTINGS, LAS_SHARE_TUNING

HOUR = 3600.0
ISSUE_34 = {**LAS_SHARE_SETTINGS.model_dump(), "preempt_after_s": 0.0}


def _candidate(las: dict | None = None) -> tuple[dict, object]:
    return {**ISSUE_34, **(las or {})}, LAS_SHARE_TUNING


CANDIDATES = {
    "issue-34": _candidate(),
    # a longer minimum run before LAS stops an attempt (KAI's min-runtime; kueue#12791)
    "minrun-1h": _candidate({"min_run_s": HOUR}),
    "minrun-2h": _candidate({"min_run_s": 2 * HOUR}),
    "minrun-4h": _candidate({"min_run_s": 4 * HOUR}),
    # a head waits before it stops anyone: running jobs often make room by then
    "wait-30m": _candidate({"preempt_after_s": 0.5 * HOUR}),
    "wait-1h": _candidate({"preempt_after_s": HOUR}),
    "wait-2h": _candidate({"preempt_after_s": 2 * HOUR}),
    "wait-4h": _candidate({"preempt_after_s": 4 * HOUR}),
    "wait-30m-minrun-1h": _candidate({"preempt_after_s": 0.5 * HOUR, "min_run_s": HOUR}),
    "wait-1h-minrun-2h": _candidate({"preempt_after_s": HOUR, "min_run_s": 2 * HOUR}),
}
# Tiresias' thresholds from the distribution of service (issue 51): each tuning VC's own
# quantiles of GPU-seconds per job (0.5, 0.8, 0.95; the trace's, known in advance: what an
# adaptive rule could at best learn), with `default`'s wait; lost on ed69ec (docs/scheduler.md)
CANDIDATES.update(
    {
        "q-ed69ec": _candidate({"preempt_after_s": HOUR, "thresholds_gpu_s": [3305.0, 67783.0, 109250.0]}),
        "q-ee9e8c": _candidate({"preempt_after_s": HOUR, "thresholds_gpu_s": [18648.0, 314728.0, 2102032.0]}),
        "q-b436b2": _candidate({"preempt_after_s": HOUR, "thresholds_gpu_s": [1446.0, 2316.0, 691881.0]}),
    }
)
