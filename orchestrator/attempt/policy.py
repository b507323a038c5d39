"""What an attempt decides, kept apart from the code that carries it out: pure functions of its
state, the events and what its run left, tested without Ray (tests/test_attempt_policy.py), as
`orchestrator/policy/` is for the queue.

    after_event         an event from the workers -> the next state
    after_stop_request  a stop, preemption or abort -> Stopping (checkpoint first) or Aborting
    ended_summary       the run over -> what the attempt reports: the workers' summary, or a
                        failure classified (the job's own, worth a retry, the cluster's)
    aborted_summary     a run ended at once -> its summary
    outcome, exit_code  what the service and a shell are told
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.attempt.states import (
    Aborting,
    Ended,
    Progress,
    Restarting,
    RunStarted,
    Starting,
    State,
    Stopping,
    StopRequested,
    Training,
    WorkerFailed,
)

EXIT = {"succeeded": 0, "stopped_early": 0, "failed": 1, "stopped": 1}


def after_event(state: State, event) -> State:
    """The workers loaded their start: training; a worker failed while training: restarting
    (a failure before the first step, or while stopping, changes nothing a stop depends on)."""
    if isinstance(event, RunStarted) and isinstance(state, (Starting, Restarting)):
        return Training(event.step)
    if isinstance(event, WorkerFailed) and isinstance(state, Training):
        return Restarting(event.rank, event.reason)
    return state


def after_stop_request(state: State, request: StopRequested) -> State:
    """An abort ends the run at once, and so does a stop before the first step (no step to
    keep); a stop or preemption of a training run checkpoints first. A second request while
    stopping changes nothing but an abort."""
    if isinstance(state, (Aborting, Ended)):
        return state
    if request.request == "abort":
        return Aborting("aborted", request.reason or "aborted")
    if isinstance(state, Starting):
        status = "preempted" if request.request == "preempt" else "stopped"
        return Aborting(status, f"{status} before its first step")
    if isinstance(state, Stopping):
        return state
    return Stopping(request.request)


@dataclass(frozen=True)
class RunEnd:
    """What a run left: the workers' summary (rank 0's), the first failure a worker reported,
    how Ray Train's `fit()` failed (`failure`: {"died": [ranks], "text", "group": Ray gave up
    on a worker group}) and how many worker groups it started."""

    summary: dict | None
    error: dict | None  # {"rank", "reason", "retry"}
    failure: dict | None
    groups: int


def ended_summary(end: RunEnd, progress: Progress, job: str, run: str, max_failures: int) -> dict:
    """The attempt's summary: the workers' own, or one that says why there is none."""
    error, result = end.error, end.summary
    reason = None  # why the run failed, in the workers' own words where they gave them
    if error and not error["retry"]:
        reason = f"rank {error['rank']}: {error['reason']}"
    elif end.failure:  # Ray gave up: out of restarts, or a failure outside the training function
        reason = failure_reason(end.failure, error, max_failures)
    elif result is None:
        reason = "the workers stopped without a result"
    if reason is not None and (result is None or result["status"] != "failed"):
        result = not_run(job, run, "failed", reason, progress)
    result = {**result, "restarts": max(end.groups - 1, 0), "resumed_from_step": progress.resumed_from}
    if result["status"] == "failed":  # one the workers did not call final may be its node's doing
        result["retryable"] = not (error and not error["retry"])
        result["infrastructure"] = result["retryable"] and collective_failure(end.failure, error)
    return {**result, "checkpoint_step": progress.checkpoint_step}


def aborted_summary(state: Aborting, progress: Progress, job: str, run: str) -> dict:
    summary = not_run(job, run, state.status, state.why, progress)
    return {**summary, "restarts": 0, "resumed_from_step": progress.resumed_from}


def not_run(job: str, run: str, status: str, reason: str, progress: Progress | None = None) -> dict:
    """The summary of a run that did not end by itself (or never started)."""
    return {
        "job": job,
        "run": run,
        "status": status,
        "reason": reason,
        "steps": progress.last_step if progress else None,
        "checkpoint": progress.last_checkpoint if progress else None,
        "checkpoint_step": progress.checkpoint_step if progress else None,
        "samples_per_s": 0.0,
    }


def failure_reason(failure: dict, error: dict | None, max_failures: int) -> str:
    """One line for a run Ray gave up on: which worker died or failed, and how."""
    if failure["died"]:
        head = f"worker rank {failure['died'][0]} died (killed, out of memory or its node lost)"
    elif error:  # the failure the workers reported themselves
        head = f"rank {error['rank']}: {error['reason']}"
    else:
        head = failure["text"]
    if not failure["group"]:
        return head
    return head + f"; no restarts left (fault_tolerance.max_failures: {max_failures})"


# What a rank's collectives say when a peer went away or the network between them broke
# (gloo, NCCL, Ray's actor death): the cluster's doing, not the job's (docs/cluster.md).
COLLECTIVE_SIGNS = (
    "connection reset by peer",
    "connection closed by peer",
    "broken pipe",
    "gloo",
    "nccl",
    "distbackenderror",
    "collective operation timeout",
    "actor died",
    "actordiederror",
    "rayactorerror",
)


def collective_failure(failure: dict | None, error: dict | None) -> bool:
    """Whether a failed run failed in its collectives: a rank died, or a rank's error (or Ray's
    account of the failure) is a peer reset, a gloo or NCCL error or a rank gone."""
    if failure and failure.get("died"):
        return True
    texts = [(error or {}).get("reason") or "", (failure or {}).get("text") or ""]
    return any(sign in text.lower() for text in texts for sign in COLLECTIVE_SIGNS)


def outcome(summary: dict) -> str:
    """How the attempt ended, as the service's record takes it."""
    return {"stopped_early": "succeeded"}.get(summary["status"], summary["status"])


def exit_code(summary: dict) -> int:
    return EXIT.get(summary["status"], 1)
