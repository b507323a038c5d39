"""The phases of one attempt as its driver holds them: the table, and the rules `Attempt`
takes from it (what a stop request does in each phase)."""

import pytest

from orchestrator.attempt_state import TRANSITIONS, AttemptState, IllegalPhaseChange, Phase


def test_a_stop_before_the_first_step_aborts_and_after_it_checkpoints():
    state = AttemptState(now=0.0)
    assert state.stop_means_abort("stop") and state.stop_means_abort("preempt")
    state.on_worker_failed()  # a group that failed before training restarts: still starting
    assert state.phase is Phase.STARTING
    state.on_run_started()
    assert state.phase is Phase.TRAINING and not state.stop_means_abort("preempt")
    assert state.stop_means_abort("abort")  # the service requeued it: nothing to wait for


def test_a_restart_after_training_keeps_the_checkpointing_stop():
    state = AttemptState(now=0.0)
    state.on_run_started()
    state.on_worker_failed()
    assert state.phase is Phase.RESTARTING
    assert not state.stop_means_abort("stop")  # it trained: a checkpoint exists to stop at
    state.on_run_started()  # the new group loaded the newest checkpoint
    assert state.phase is Phase.TRAINING and state.trained
    state.to(Phase.STOPPING)
    state.on_run_started()  # a restart while stopping changes nothing
    assert state.phase is Phase.STOPPING
    state.to(Phase.ENDED)
    assert [name for name, _ in state.path] == [
        "starting",
        "training",
        "restarting",
        "training",
        "stopping",
        "ended",
    ]


def test_the_ends_are_final():
    for phase in (Phase.ENDED,):
        assert TRANSITIONS[phase] == set() and phase.is_final
    state = AttemptState(now=0.0)
    state.to(Phase.ABORTED)
    with pytest.raises(IllegalPhaseChange):
        state.to(Phase.TRAINING)  # a late event of an aborted run cannot revive it
    state.to(Phase.ENDED)
    with pytest.raises(IllegalPhaseChange):
        state.to(Phase.STOPPING)


def test_every_phase_can_end_and_be_aborted_until_it_has():
    for phase, allowed in TRANSITIONS.items():
        if not phase.is_final:
            assert {Phase.ENDED, Phase.ABORTED} <= allowed, phase
