"""`orchestrator run SPEC`: train a job, in this process (`--local`) or on Ray."""

from __future__ import annotations

from core.spec import JobSpec, SpecError, load_spec


def register(sub) -> None:
    from orchestrator.commands.options import add_address, add_spec_arguments

    parser = sub.add_parser("run", help="train a job (on Ray, or in this process with --local)")
    add_spec_arguments(parser)
    parser.add_argument(
        "--local", action="store_true", help="train in this process, without Ray (one worker)"
    )
    parser.add_argument("--summary", metavar="PATH", help="write a JSON summary here at the end")
    add_address(parser, "Ray cluster address (default: $RAY_ADDRESS, else start one)")
    parser.set_defaults(handler=handle)


def load_runnable(path: str, overrides: list[str]) -> JobSpec:
    """The spec, checked as `validate` checks it (schema and model/data registries), or
    SpecError. Data availability is checked where the job runs, not here."""
    spec = load_spec(path, overrides)
    from workers.checks import job_problems  # the data plane's model registry (torch): after reading

    problems = job_problems(spec)
    if problems:
        raise SpecError(problems, path)
    return spec


def handle(args) -> int:
    from orchestrator.errors import UsageError

    if args.local:
        from workers.run import run_local

        # one process, whatever resources.num_workers says
        spec = load_runnable(args.spec, args.overrides + ["resources.num_workers=1"])
        return run_local(spec, args.summary)
    from orchestrator import driver

    spec = load_runnable(args.spec, args.overrides)
    if spec.sweep is not None:
        raise UsageError(
            f"{args.spec} is a sweep: queue its trials with `orchestrator submit {args.spec}`"
            " (an orchestrator service runs them)"
        )
    return driver.run(args.spec, args.overrides, spec, address=args.address, summary_path=args.summary)
