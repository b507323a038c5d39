"""The per-step sums over the ranks (workers/step_sums.py), in one process: what a sum
completes, what it carries, and when the next one is due. Their 2-process behaviour (losses
equal to a single-process run's at every logged step, a stop reaching every rank at one step)
is covered by tests/test_parallel.py and the preemption tests of tests/test_service.py."""

from __future__ import annotations

import time

import torch

from workers.step_sums import DeferredSum, StepSums

CPU = torch.device("cpu")


def test_a_deferred_sum_returns_its_values_and_payload_once():
    sums = DeferredSum(CPU)
    assert sums.finish() is None
    sums.start([torch.tensor(1.5), torch.tensor(True), 2], payload="p")
    assert sums.pending
    assert sums.finish() == ([1.5, 1.0, 2.0], "p")
    assert not sums.pending and sums.finish() is None
    # values read back with the sum but not summed follow the sums
    sums.start(torch.tensor([1.0, 2.0]), payload="q", local=torch.tensor([7.0]))
    assert sums.finish() == ([1.0, 2.0, 7.0], "q")


def test_a_sum_completes_every_record_waiting_with_its_own_loss():
    sums = StepSums(CPU, world_size=1, is_main=True)
    for step, loss in [(1, 0.5), (2, 0.25), (3, 0.125)]:
        # device values such as the gradient norm stay tensors (no host sync) until the sum
        sums.add({"step": step}, torch.tensor(loss), {"grad_norm": torch.tensor(2.0 * step)})
    sums.start(3, torch.tensor(False), stop_code=0)
    step, records, nonfinite, stop = sums.finish()
    assert (step, nonfinite, stop) == (3, False, 0)
    assert [(r["step"], r["loss"]) for r in records] == [(1, 0.5), (2, 0.25), (3, 0.125)]
    assert [r["grad_norm"] for r in records] == [2.0, 4.0, 6.0]
    assert all(type(r["grad_norm"]) is float for r in records)
    assert sums.waiting == []


def test_the_stop_code_and_the_non_finite_flag_come_through():
    sums = StepSums(CPU, world_size=1, is_main=True)
    sums.start(1, torch.tensor(True), stop_code=2)
    _, records, nonfinite, stop = sums.finish()
    assert (records, nonfinite, stop) == ([], True, 2)


def test_the_next_sum_is_due_after_about_every_s_of_steps():
    sums = StepSums(CPU, world_size=1, is_main=True, every_s=0.2)
    assert sums.due(1)  # the first step always sums
    sums.start(1, torch.tensor(False), 0)
    sums.finish()
    assert sums.due_step == 2  # the pace is not known yet: the next step sums again
    time.sleep(0.05)  # steps of ~10 ms: 5 steps took 50 ms
    sums.start(6, torch.tensor(False), 0)
    sums.finish()
    # ~20 steps make 0.2 s at that pace; the sleep may overshoot, so allow fewer, never more
    assert 6 + 10 <= sums.due_step <= 6 + 20
    assert not sums.due(sums.due_step - 1) and sums.due(sums.due_step)


def test_a_resumed_run_sums_again_soon_and_so_hears_a_stop_request():
    # resumed at step 259 right after it was built: the steps before 259 were not taken in
    # this process, so they say nothing of the pace (taken as such, the next sum, and with it
    # the next stop request, waited 1,000 steps)
    sums = StepSums(CPU, world_size=1, is_main=True, every_s=0.2)
    sums.start(259, torch.tensor(False), 0)
    sums.finish()
    assert sums.due_step == 260
    time.sleep(0.05)
    sums.start(260, torch.tensor(False), 0)  # one step of 50 ms: 4 steps make 0.2 s
    sums.finish()
    assert 261 <= sums.due_step <= 264


def test_slow_steps_sum_every_step():
    sums = StepSums(CPU, world_size=1, is_main=True, every_s=0.01)
    time.sleep(0.03)
    sums.start(1, torch.tensor(False), 0)
    sums.finish()
    assert sums.due(2)


def test_losses_are_averaged_over_the_world():
    # in one process the "sum over 4 ranks" is this rank's value: the mean divides by 4
    sums = StepSums(CPU, world_size=4, is_main=False)
    sums.add({"step": 1}, torch.tensor(2.0))
    sums.start(1, torch.tensor(False), 0)
    _, records, _, _ = sums.finish()
    assert records[0]["loss"] == 0.5
    # only rank 0 proposes the next sum's step; the others follow what the sum says
    assert sums.due_step == 2


def test_ranks_that_keep_no_records_still_add_their_losses():
    # ranks other than 0 add None records: their losses count, no record comes back
    sums = StepSums(CPU, world_size=2, is_main=False)
    sums.add(None, torch.tensor(3.0))
    sums.add(None, torch.tensor(float("nan")))
    sums.start(2, torch.tensor(True), 0)
    assert sums.sum.pending
    _, records, nonfinite, _ = sums.finish()
    assert records == [] and nonfinite
    # rank 0's records between other ones: each gets its own loss and device field
    sums = StepSums(CPU, world_size=1, is_main=True)
    sums.add({"step": 1}, torch.tensor(1.0), {"grad_norm": torch.tensor(5.0)})
    sums.add({"step": 2}, torch.tensor(2.0))
    sums.add({"step": 3}, torch.tensor(3.0), {"grad_norm": torch.tensor(6.0)})
    sums.start(3, torch.tensor(False), 0)
    _, records, _, _ = sums.finish()
    assert records == [
        {"step": 1, "loss": 1.0, "grad_norm": 5.0},
        {"step": 2, "loss": 2.0},
        {"step": 3, "loss": 3.0, "grad_norm": 6.0},
    ]
