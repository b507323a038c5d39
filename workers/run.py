"""Run one worker of a job without Ray: `torchrun --nproc_per_node=N -m workers.run SPEC`.

This is the loop the Ray driver runs too (`train`, in every launcher); here it learns its rank
from torchrun's environment and writes checkpoints straight to `checkpoint.storage`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from core.spec import JobSpec, SpecError, load_spec
from core.summary import failed, print_summary, write_summary
from workers import faults, metrics_ab
from workers.checks import data_problems, job_problems
from workers.context import LocalContext, RunContext
from workers.trainer import Trainer


def train(spec: JobSpec, ctx: RunContext) -> dict:
    """Train one worker of a job in `ctx` (any launcher); returns the run's summary. The hooks
    of the tests and benches attach here, from outside the loop, when their variable is set."""
    trainer = Trainer(spec, ctx)
    faults.attach_from_env(trainer)  # only in the tests of hang and straggler detection
    metrics_ab.attach_from_env(trainer)  # only under bench/metrics_overhead.py
    return trainer.run()


def run_local(spec: JobSpec, summary_path: str | None = None) -> int:
    """Train in this process (one of torchrun's, or alone); returns the exit status."""
    problems = data_problems(spec)  # where the job runs, before anything starts
    if problems:
        for problem in problems:
            print(f"error: {spec.name}: {problem}", file=sys.stderr, flush=True)
        if os.environ.get("RANK", "0") == "0":  # torchrun: every rank checks, the first one writes
            write_summary(failed(spec.name, problems[0]), summary_path)
        return 1
    ctx = LocalContext(spec, background_cpu=True)  # this process exists to train
    try:
        summary = train(spec, ctx)
    except (OSError, ValueError, RuntimeError) as err:
        # data, storage and checkpoint problems: one line, no traceback, nothing lost
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        summary = failed(spec.name, reason)
        if ctx.is_main:
            print(f"error: {spec.name}: {reason}", file=sys.stderr, flush=True)
    finally:
        ctx.teardown()
    if ctx.is_main:
        write_summary(summary, summary_path)
        if summary["status"] != "failed" or summary.get("steps") is not None:
            print_summary(summary)
    return 0 if summary["status"] != "failed" else 1


def sized(spec: JobSpec, workers: int, path: str) -> JobSpec:
    """An elastic spec at torchrun's world size (same global batch, adapted accumulation)."""
    try:
        return spec.at_size(workers)
    except ValueError as err:
        raise SpecError([f"{err} (torchrun started {workers} processes)"], path) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="workers.run", description=__doc__.splitlines()[0])
    parser.add_argument("spec")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--summary", metavar="PATH", help="write a JSON summary here at the end")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    world = os.environ.get("WORLD_SIZE")  # under torchrun the process count is the worker count
    try:
        spec = load_spec(args.spec, args.overrides)
        if world and spec.resources.elastic:
            spec = sized(spec, int(world), args.spec)
        elif world:  # with replica groups, one torchrun per group (docs/cluster.md)
            workers = int(world) * spec.fault_tolerance.replica_groups
            spec = load_spec(args.spec, [*args.overrides, f"resources.num_workers={workers}"])
        problems = job_problems(spec)
        if problems:
            raise SpecError(problems, args.spec)
    except SpecError as err:
        for line in str(err).splitlines():
            print(f"error: {line}", file=sys.stderr)
        return 2
    return run_local(spec, args.summary)


if __name__ == "__main__":
    sys.exit(main())
