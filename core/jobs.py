"""A queued job's states, the transitions allowed between them, and what it asks of the cluster.

    queued / preempted  --admit-->             admitted
    admitted            --workers started-->   running
    admitted / running  --preempt or stop-->   stopping
    admitted / running / stopping  --requeue-->  queued (a start failed, its driver died)
                                                or preempted (it checkpointed for another job)
    any but the ends    --finish-->            succeeded | failed | stopped

The service changes a job's state in one place, which asks `check_transition`; `TRANSITIONS`
is the whole table, and a test walks every transition the service takes against it.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # clients that only read states need not load the spec's schema (pydantic)
    from core.spec import JobSpec


class JobState(str, enum.Enum):
    QUEUED = "queued"  # waiting for admission
    ADMITTED = "admitted"  # resources counted for it; its workers are starting
    RUNNING = "running"  # all workers started
    STOPPING = "stopping"  # asked to checkpoint and stop (preemption or `orchestrator stop`)
    PREEMPTED = "preempted"  # stopped for a higher-priority job; back in the queue
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"  # by `orchestrator stop`

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL

    @property
    def is_pending(self) -> bool:
        """Waiting in the queue."""
        return self in (JobState.QUEUED, JobState.PREEMPTED)

    @property
    def holds_resources(self) -> bool:
        return self in (JobState.ADMITTED, JobState.RUNNING, JobState.STOPPING)


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED})
TERMINAL_VALUES = frozenset(state.value for state in TERMINAL)  # as JSON views spell them
HOLDING_VALUES = frozenset(state.value for state in JobState if state.holds_resources)
PENDING_VALUES = frozenset(state.value for state in JobState if state.is_pending)

_ENDS = (JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED)
_REQUEUED = (JobState.QUEUED, JobState.PREEMPTED)
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    # a waiting job starts, is stopped, or fails (its driver left while it waited)
    JobState.QUEUED: frozenset({JobState.ADMITTED, JobState.STOPPED, JobState.FAILED}),
    JobState.PREEMPTED: frozenset({JobState.ADMITTED, JobState.STOPPED, JobState.FAILED}),
    # a job that holds resources runs, is asked to stop, goes back to the queue, or ends
    JobState.ADMITTED: frozenset({JobState.RUNNING, JobState.STOPPING, *_REQUEUED, *_ENDS}),
    JobState.RUNNING: frozenset({JobState.STOPPING, *_REQUEUED, *_ENDS}),
    # a stop may follow a preemption request (stopping -> stopping, for another reason)
    JobState.STOPPING: frozenset({JobState.STOPPING, *_REQUEUED, *_ENDS}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.STOPPED: frozenset(),
}


class IllegalTransition(RuntimeError):
    """A change of state the table does not allow: a bug, never bad input."""


def check_transition(job_id: str, old: JobState, new: JobState) -> None:
    if new not in TRANSITIONS[old]:
        raise IllegalTransition(f"{job_id}: {old.value} -> {new.value} is not an allowed transition")


def resources_for(spec: JobSpec) -> dict[str, float]:
    """The Ray resources one worker of a job needs: CPUs, GPUs and any custom resources."""
    res = spec.resources
    out = {"CPU": float(res.cpus_per_worker)}
    if res.gpus_per_worker > 0:
        out["GPU"] = float(res.gpus_per_worker)
    out.update({name: float(amount) for name, amount in res.custom_per_worker.items()})
    return out
