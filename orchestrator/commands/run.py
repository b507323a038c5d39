"""`orchestrator run SPEC`: train a job, in this process (`--local`) or on Ray."""

from __future__ import annotations

from orchestrator.spec import SpecError, load_spec, unimplemented


def register(sub) -> None:
    from orchestrator.cli import add_spec_arguments

    parser = sub.add_parser("run", help="train a job (on Ray, or in this process with --local)")
    add_spec_arguments(parser)
    parser.add_argument(
        "--local", action="store_true", help="train in this process, without Ray (one worker)"
    )
    parser.add_argument("--summary", metavar="PATH", help="write a JSON summary here at the end")
    parser.add_argument("--address", help="Ray cluster address (default: $RAY_ADDRESS, else start one)")
    parser.set_defaults(handler=handle)


def load_runnable(path: str, overrides: list[str]):
    spec = load_spec(path, overrides)
    problems = unimplemented(spec)
    if problems:
        raise SpecError(problems, path)
    return spec


def handle(args) -> int:
    if args.local:
        from workers.run import run_local

        # one process, whatever resources.num_workers says
        spec = load_runnable(args.spec, args.overrides + ["resources.num_workers=1"])
        return run_local(spec, args.summary)
    from orchestrator import driver

    spec = load_runnable(args.spec, args.overrides)
    return driver.run(spec, address=args.address, summary_path=args.summary)
