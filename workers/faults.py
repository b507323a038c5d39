"""Faults injected into a training run, for the tests of hang and straggler detection only.

The tests' Ray cluster sets `ORCHESTRATOR_TEST_FAULTS` to a folder; a job whose name has a
file there reads its faults from it, one `key=value` a line:

    hang_at_step=20        every rank's data source blocks for good before step 20 (first start
                           of the worker group only: the restart after the hang trains on);
                           hang_at_step=1 blocks before the first step
    slow_rank=1:0.05       rank 1 sleeps 0.05 s in the compute phase of every step
    slow_node=1:0.05       a slow machine: the node rank 1 first runs on (kept in the file
                           `<job name>.slow-node` beside this one) is slow for good, and whichever
                           rank runs there, in any attempt, sleeps 0.05 s in every step's compute
    paced=0.1              every rank sleeps 0.1 s in each step until the test writes
                           `<job name>.go` beside this file, then trains at full speed (any
                           attempt): a job that is surely still running when the test acts on
                           it, whatever the machine's pace, and then ends soon

Nothing in the product sets the variable, and the spec has no setting for it. The run's entry
point (`workers.run.train`) attaches them with `attach_from_env`, from outside the loop.
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


def attach_from_env(trainer) -> None:
    """Inject the faults the tests set for `trainer`'s job into it, before it runs: its data
    source wrapped to block, a slow rank's model made slow (nothing without them)."""
    job_name = trainer.spec.name
    faults = faults_for(job_name)
    if not faults:
        return
    ctx = trainer.ctx
    if "hang_at_step" in faults and getattr(ctx, "restarts", 0) == 0:
        hang_at = int(faults["hang_at_step"])
        iterate = trainer.batches.iterate
        trainer.batches.iterate = lambda start: blocking_data_source(iterate(start), start, hang_at)
    slow = None
    if "slow_rank" in faults:
        rank, seconds = faults["slow_rank"].split(":")
        slow = float(seconds) if int(rank) == ctx.rank else None
    if "slow_node" in faults:
        rank, seconds = faults["slow_node"].split(":")
        slow = float(seconds) if _on_slow_node(job_name, int(rank) == ctx.rank) else None
    inner = getattr(trainer.model, "module", trainer.model)
    if slow is not None:
        inner.register_forward_pre_hook(lambda module, args: _slow_compute(slow))
    if "paced" in faults:
        go = Path(os.environ[ENV], f"{job_name}.go")
        inner.register_forward_pre_hook(_paced(float(faults["paced"]), go))


def _on_slow_node(job_name: str, chooses: bool) -> bool:
    """Whether this worker runs on the job's slow node; the first worker that `chooses` (rank
    N of the first start) makes its own node the slow one."""
    import ray  # only the tests' Ray workers get here

    here = ray.get_runtime_context().get_node_id()
    memory = Path(os.environ[ENV], f"{job_name}.slow-node")
    if not memory.exists() and chooses:
        memory.write_text(here)
    return memory.exists() and memory.read_text().strip() == here


def _paced(seconds: float, go: Path):
    """A forward hook that sleeps `seconds` until `go` exists."""
    released = False

    def hook(module, args) -> None:
        nonlocal released
        released = released or go.exists()
        if not released:
            time.sleep(seconds)

    return hook


def _slow_compute(seconds: float) -> None:
    time.sleep(seconds)  # inside the forward pass: the compute phase of this rank alone
