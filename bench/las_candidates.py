"""The LAS orders tried in issue 51's sweep of load (`scheduler_philly.py --sweep --orders`).

Each is a queue file's `las:` block and a `LasTuning`, built like `las-share` by
`trace_sim.make_policy`. `issue-34` is `las-share` as issue 34 shipped it (no wait before
preempting); the other names say what they change from it. `wait-1h` won the sweep and is
what `las-share`, the default, now is (`core.queues.LAS_SHARE_DEFAULTS`): `default` and
`wait-1h` replay the same. Kept so that the sweep's tables can be replayed.
"""

from __future__ import annotations

from dataclasses import replace

from orchestrator.policy.las import LAS_SHARE_SETTINGS, LAS_SHARE_TUNING

HOUR = 3600.0
ISSUE_34 = {**LAS_SHARE_SETTINGS.model_dump(), "preempt_after_s": 0.0}


def _candidate(las: dict | None = None, **tuning) -> tuple[dict, object]:
    return {**ISSUE_34, **(las or {})}, replace(LAS_SHARE_TUNING, **tuning)


CANDIDATES = {
    "issue-34": _candidate(),
    # a longer minimum run before LAS stops an attempt (KAI's min-runtime; kueue#12791)
    "minrun-1h": _candidate({"min_run_s": HOUR}),
    "minrun-2h": _candidate({"min_run_s": 2 * HOUR}),
    "minrun-4h": _candidate({"min_run_s": 4 * HOUR}),
    # ... and one that grows with the run before the attempt
    "grow-0.5x": _candidate(min_run_factor=0.5),
    "grow-1x": _candidate(min_run_factor=1.0),
    "grow-1x-cap-8h": _candidate(min_run_factor=1.0, min_run_cap_s=8 * HOUR),
    # a starvation guard in time: promoted after 48 h of waiting at the latest
    "limit-48h": _candidate(starve_limit_s=48 * HOUR),
    "minrun-2h-limit-48h": _candidate({"min_run_s": 2 * HOUR}, starve_limit_s=48 * HOUR),
    # promotion orders the queue but stops no job of the promoted job's own level or below
    "nopeers": _candidate(promoted_stop_peers=False),
    "nopeers-top-0.5": _candidate(promoted_stop_peers=False, top_share=0.5),
    "nopeers-grow-1x": _candidate(promoted_stop_peers=False, min_run_factor=1.0),
    "nopeers-wait-30m": _candidate({"preempt_after_s": 0.5 * HOUR}, promoted_stop_peers=False),
    # a head waits before it stops anyone: running jobs often make room by then
    "wait-30m": _candidate({"preempt_after_s": 0.5 * HOUR}),
    "wait-1h": _candidate({"preempt_after_s": HOUR}),
    "wait-2h": _candidate({"preempt_after_s": 2 * HOUR}),
    "wait-4h": _candidate({"preempt_after_s": 4 * HOUR}),
    "wait-30m-minrun-1h": _candidate({"preempt_after_s": 0.5 * HOUR, "min_run_s": HOUR}),
    "wait-1h-minrun-2h": _candidate({"preempt_after_s": HOUR, "min_run_s": 2 * HOUR}),
}
