"""A run's summary: the dict the training loop returns at the end, which the driver prints and
reports to the service and `--summary PATH` writes.

    job, run, status (succeeded | stopped_early | preempted | stopped | failed | left: a replica
    group told to leave), reason, steps, total_steps, final_train_loss, eval {eval_*},
    samples_per_s, tokens_per_s, checkpoint, restarts, resumed_from, elapsed_s, throughput,
    checkpoint_blocked_s, checkpoint_saves, checkpoints_left (folders pruning left in place, and
    why), loss_scale (fp16: the loss scaler's scale at the end)
"""

from __future__ import annotations

import json
import os

from core.records import format_eval


def write_summary(summary: dict, path: str | None) -> None:
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as out:
            json.dump(summary, out, indent=2)


def print_summary(summary: dict) -> None:
    evals = format_eval(summary.get("eval") or {})
    loss = summary.get("final_train_loss")
    print(
        f"[{summary['job']}] {summary['status']}: {summary['steps']} steps"
        + (f", train loss {loss:.4f}" if loss is not None else "")
        + (f", eval {evals}" if evals else "")
        + f", {summary['samples_per_s']:,.0f} samples/s"
        + (f"\n[{summary['job']}] checkpoint: {summary['checkpoint']}" if summary.get("checkpoint") else "")
        + (f"\n[{summary['job']}] reason: {summary['reason']}" if summary.get("reason") else ""),
        flush=True,
    )


def failed(job: str, reason: str, run: str | None = None, steps: int | None = None, checkpoint=None) -> dict:
    """The summary of a run that ended without the loop's own."""
    summary = {"job": job, "status": "failed", "reason": reason, "steps": steps}
    if run is not None:
        summary["run"] = run
    return {**summary, "checkpoint": checkpoint, "samples_per_s": 0.0}
