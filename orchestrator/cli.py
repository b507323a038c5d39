"""The `orchestrator` command line.

Each subcommand lives in `orchestrator/commands/<name>.py` with a `register(subparsers)`
function that adds its parser and sets `handler`; a handler returns the exit status.
Exit status 2 means bad input (a job spec, an option); it never prints a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys

from core.spec import SpecError
from orchestrator import __version__
from orchestrator.commands.options import add_spec_arguments
from orchestrator.errors import UsageError

__all__ = ["UsageError", "add_spec_arguments", "build_parser", "main"]

COMMANDS = [
    *("validate", "run", "models", "submit", "jobs", "queue", "queues"),
    *("goodput", "service", "metrics", "export"),
    *("users", "login", "audit"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="orchestrator",
        description="Train PyTorch models from YAML job specs, locally or on a Ray cluster.",
    )
    parser.add_argument("--version", action="version", version=f"orchestrator {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"orchestrator.commands.{name}").register(sub)
    return parser


def report_spec_error(err: SpecError) -> int:
    for line in str(err).splitlines():
        print(f"error: {line}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status = args.handler(args)
        sys.stdout.flush()  # here, not at exit, so that a closed pipe is caught below
        return status
    except BrokenPipeError:  # `orchestrator metrics --csv | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit either
        return 128 + signal.SIGPIPE  # what a command killed by SIGPIPE returns
    except SpecError as err:
        return report_spec_error(err)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
