"""`orchestrator validate SPEC...`: check job specs without running anything."""

from __future__ import annotations

import sys

from orchestrator.spec import SpecError, load_spec


def register(sub) -> None:
    from orchestrator.cli import add_spec_arguments

    parser = sub.add_parser("validate", help="check job specs; exit 2 naming each bad field")
    add_spec_arguments(parser, many=True)
    parser.set_defaults(handler=handle)


def handle(args) -> int:
    status = 0
    for path in args.spec:
        try:
            spec = load_spec(path, args.overrides)
        except SpecError as err:
            for line in str(err).splitlines():
                print(f"error: {line}", file=sys.stderr)
            status = 2
            continue
        print(
            f"{path}: ok ({spec.name}: {spec.model.family}/{spec.model.preset} on "
            f"{spec.data.source}, {spec.resources.num_workers} worker(s), {spec.parallel.strategy})"
        )
    return status
