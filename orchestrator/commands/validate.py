"""`orchestrator validate SPEC...`: check job specs without running anything.

It checks the spec, not this machine: data that is not here is noted (the job may run on a
cluster that has it), and the job checks it again where it runs.
"""

from __future__ import annotations

import math
import sys

from core.spec import JobSpec, SpecError


def register(sub) -> None:
    from orchestrator.commands.options import add_spec_arguments

    parser = sub.add_parser("validate", help="check job specs; exit 2 naming each bad field")
    add_spec_arguments(parser, many=True)
    parser.set_defaults(handler=handle)


def handle(args) -> int:
    from orchestrator.commands.run import load_runnable

    status = 0
    for path in args.spec:
        try:
            spec = load_runnable(path, args.overrides)
        except SpecError as err:
            for line in str(err).splitlines():
                print(f"error: {line}", file=sys.stderr)
            status = 2
            continue
        from workers.checks import data_problems  # loaded by load_runnable for a readable spec

        for problem in data_problems(spec):
            print(
                f"note: {path}: data.source {spec.data.source}: not available on this machine"
                f" (it must exist where the job runs): {problem}",
                file=sys.stderr,
            )
        print(f"{path}: ok ({describe(spec)})")
    return status


def describe(spec: JobSpec) -> str:
    text = (
        f"{spec.name}: {spec.model.family}/{spec.model.preset} on {spec.data.source},"
        f" {spec.resources.size_text} worker(s), {spec.parallel.strategy}"
    )
    if spec.sweep is not None:
        sweep = spec.sweep
        trials = sweep.num_samples or math.prod(len(p.values) for p in sweep.parameters.values())
        text += f"; a {sweep.method} sweep of {trials} trials by {sweep.metric} ({sweep.mode})"
    return text
