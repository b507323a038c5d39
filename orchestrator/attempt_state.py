"""One attempt's states, as its driver holds them, and the transitions allowed between them.

    starting    --its workers load their start (RunStarted)-->     training
    starting    --a worker fails before the first step-->          starting (Ray Train restarts the group)
    training    --a worker fails-->                                restarting
    restarting  --the new group loads the newest checkpoint-->     training
    starting    --stop, preempt or abort-->                        aborted (nothing to checkpoint yet)
    training / restarting  --stop or preempt-->                    stopping (checkpoint, then end)
    any but the ends       --abort (the service requeued it)-->    aborted
    any but the ends       --fit() returned-->                     ended

`core/jobs.py` keeps the job's states across attempts (queued, admitted, running, ...); these
are the states of the attempt one driver runs, like the explicit states of Ray Train V2's
controller. `Attempt` changes state only through `AttemptState.to`, which checks the table.
"""

from __future__ import annotations

import enum
import time


class Phase(str, enum.Enum):
    STARTING = "starting"  # the run's actor, Ray Train's controller and workers coming up
    TRAINING = "training"  # the workers loaded their start and train: a stop checkpoints
    RESTARTING = "restarting"  # a worker failed; Ray Train restarts the group from a checkpoint
    STOPPING = "stopping"  # asked to checkpoint and stop (stop, preemption, resize)
    ABORTED = "aborted"  # ended at once: before the first step, or requeued by the service
    ENDED = "ended"  # fit() returned

    @property
    def is_final(self) -> bool:
        return self in (Phase.ABORTED, Phase.ENDED)


TRANSITIONS: dict[Phase, set[Phase]] = {
    Phase.STARTING: {Phase.STARTING, Phase.TRAINING, Phase.ABORTED, Phase.ENDED},
    Phase.TRAINING: {Phase.RESTARTING, Phase.STOPPING, Phase.ABORTED, Phase.ENDED},
    Phase.RESTARTING: {Phase.RESTARTING, Phase.TRAINING, Phase.STOPPING, Phase.ABORTED, Phase.ENDED},
    Phase.STOPPING: {Phase.STOPPING, Phase.ABORTED, Phase.ENDED},
    Phase.ABORTED: {Phase.ENDED},  # the run's actor gone, fit() returns
    Phase.ENDED: set(),
}


class IllegalPhaseChange(RuntimeError):
    pass


class AttemptState:
    """The current phase, and when each phase began (the attempt's path, in its summary)."""

    def __init__(self, now: float | None = None):
        self.phase = Phase.STARTING
        self.path: list[tuple[str, float]] = [(self.phase.value, now if now is not None else time.time())]

    def to(self, phase: Phase, now: float | None = None) -> None:
        if phase not in TRANSITIONS[self.phase]:
            raise IllegalPhaseChange(f"attempt: {self.phase.value} -> {phase.value} is not allowed")
        if phase is not self.phase:
            self.path.append((phase.value, now if now is not None else time.time()))
        self.phase = phase

    def on_run_started(self) -> None:
        """The workers loaded their start (a checkpoint, or none) and train."""
        if self.phase in (Phase.STARTING, Phase.RESTARTING):
            self.to(Phase.TRAINING)

    def on_worker_failed(self) -> None:
        """Ray Train restarts the group; a failure while stopping or before the first step
        changes nothing the stop path depends on."""
        if self.phase is Phase.TRAINING:
            self.to(Phase.RESTARTING)

    def stop_means_abort(self, stop: str) -> bool:
        """Whether a stop request ends the run at once: an abort, or a stop before the first
        step (no step to keep)."""
        return stop == "abort" or self.phase is Phase.STARTING

    @property
    def trained(self) -> bool:
        return any(name == Phase.TRAINING.value for name, _ in self.path)
