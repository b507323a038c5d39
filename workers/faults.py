"""Faults injected into a training run, for the tests of hang and straggler detection only.

The tests' Ray cluster sets `ORCHESTRATOR_TEST_FAULTS` to a folder; a job whose name has a
file there reads its faults from it, one `key=value` a line:

    hang_at_step=20        every rank's data source blocks for good before step 20 (first start
                           of the worker group only: the restart after the hang trains on)
    slow_rank=1:0.05       rank 1 sleeps 0.05 s in the compute phase of every step

Nothing in the product sets the variable, and the spec has no setting for it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

ENV = "ORCHESTRATOR_TEST_FAULTS"


def faults_for(job_name: str) -> dict[str, str]:
    """The faults the tests set for `job_name` ({} in every real run)."""
    folder = os.environ.get(ENV)
    path = Path(folder, job_name) if folder else None
    if path is None or not path.is_file():
        return {}
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs}


def blocking_data_source(batches: Iterator, start_step: int, hang_at_step: int) -> Iterator:
    """`batches`, until the batch of step `hang_at_step`: then block, as a data source whose
    storage stopped answering would."""
    step = start_step
    for batch in batches:
        step += 1
        if step == hang_at_step:
            _wait_for_data_that_never_comes()
        yield batch


def _wait_for_data_that_never_comes() -> None:
    while True:
        time.sleep(1.0)


def apply(trainer, job_name: str) -> None:
    """Inject the faults the tests set for this job into `trainer` (nothing without them)."""
    faults = faults_for(job_name)
    if not faults:
        return
    ctx = trainer.ctx
    if "hang_at_step" in faults and getattr(ctx, "restarts", 0) == 0:
        hang_at = int(faults["hang_at_step"])
        iterate = trainer.batches.iterate
        trainer.batches.iterate = lambda start: blocking_data_source(iterate(start), start, hang_at)
    if "slow_rank" in faults:
        rank, seconds = faults["slow_rank"].split(":")
        if int(rank) == ctx.rank:
            inner = getattr(trainer.model, "module", trainer.model)
            inner.register_forward_pre_hook(lambda module, args: _slow_compute(float(seconds)))


def _slow_compute(seconds: float) -> None:
    time.sleep(seconds)  # inside the forward pass: the compute phase of this rank alone
