"""The `orchestrator` command line.

Each subcommand lives in `orchestrator/commands/<name>.py` with a `register(subparsers)`
function that adds its parser and sets `handler`; a handler returns the exit status.
Exit status 2 means bad input (a job spec, an option); it never prints a traceback.

A command imports only its own module: `queue` or `status` on a head whose cores training
fills gets a fraction of a core, and every module (the spec's schema and pydantic among them)
would cost it seconds there (docs/scaling.md).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys

from orchestrator import __version__
from orchestrator.commands.options import add_spec_arguments
from orchestrator.errors import UsageError

__all__ = ["UsageError", "add_spec_arguments", "build_parser", "main"]

COMMANDS = [  # the modules, in the order `--help` lists their subcommands
    *("validate", "run", "models", "submit", "jobs", "queue", "queues"),
    *("goodput", "service", "metrics", "tracking", "export"),
    *("users", "login", "audit"),
]
# subcommand -> the module that registers it (tests/test_cli.py checks it against the modules)
MODULE_OF = {
    **{name: name for name in COMMANDS if name not in ("jobs", "service", "login")},
    **dict.fromkeys(("status", "list", "logs", "stop"), "jobs"),
    **dict.fromkeys(("preempt", "sweep"), "queue"),
    **dict.fromkeys(("up", "down"), "service"),
    "plot": "metrics",
    "login": "login",
    "logout": "login",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of `command` alone when it is one, else of every command (help, errors)."""
    parser = argparse.ArgumentParser(
        prog="orchestrator",
        description="Train PyTorch models from YAML job specs, locally or on a Ray cluster.",
    )
    parser.add_argument("--version", action="version", version=f"orchestrator {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in [MODULE_OF[command]] if command in MODULE_OF else COMMANDS:
        importlib.import_module(f"orchestrator.commands.{name}").register(sub)
    return parser


def is_spec_error(err: Exception) -> bool:
    """Without importing the spec's schema into commands that never read a spec."""
    errors = sys.modules.get("core.spec.errors")
    return errors is not None and isinstance(err, errors.SpecError)


def report_spec_error(err: Exception) -> int:
    for line in str(err).splitlines():
        print(f"error: {line}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(next((arg for arg in argv if not arg.startswith("-")), None))
    args = parser.parse_args(argv)
    try:
        status = args.handler(args)
        sys.stdout.flush()  # here, not at exit, so that a closed pipe is caught below
        return status
    except BrokenPipeError:  # `orchestrator metrics --csv | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit either
        return 128 + signal.SIGPIPE  # what a command killed by SIGPIPE returns
    except UsageError as err:
        for line in str(err).splitlines() or [""]:  # e.g. a spec's errors, which the service found
            print(f"error: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        if is_spec_error(err):
            return report_spec_error(err)
        raise
