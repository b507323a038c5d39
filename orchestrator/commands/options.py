"""What several commands share on their command line: SPEC with its `--set` overrides, the
one `--address` option, and `with_cluster_errors` for the handlers that reach a cluster.

They live here, not in a command's module or in `orchestrator.cli`, so that the commands
share them without importing one another (or the CLI that loads them) back.
"""

from __future__ import annotations

import argparse
import functools
import sys

# what --address means, for the commands that read it the same way
JOBS_API_ADDRESS = (
    "Ray dashboard (http://HEAD:8265) or cluster address"
    " (default: $RAY_API_SERVER_ADDRESS, $RAY_ADDRESS, else this machine's)"
)
SERVICE_ADDRESS = "Ray cluster address, HOST:6379 (default: the one `orchestrator up` recorded)"


def add_address(
    parser: argparse.ArgumentParser, help_text: str = SERVICE_ADDRESS, metavar: str | None = None
) -> None:
    """The `--address` option: the Ray cluster (or its dashboard) a command talks to. Without
    it the command picks its default, which `help_text` describes."""
    parser.add_argument("--address", metavar=metavar, help=help_text)


def add_jobs_api_address(parser: argparse.ArgumentParser) -> None:
    """`--address` of the commands over the Ray Jobs API: a dashboard URL or a cluster address."""
    add_address(parser, JOBS_API_ADDRESS, metavar="URL")


def add_spec_arguments(parser: argparse.ArgumentParser, many: bool = False) -> None:
    """SPEC and the --set overrides every command that takes a spec accepts."""
    parser.add_argument("spec", nargs="+" if many else None, metavar="SPEC", help="job spec YAML file")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a spec field, e.g. --set train.steps=20 (repeatable)",
    )


def with_cluster_errors(handler):
    """Cluster and Jobs API failures become one line and exit status 1."""

    @functools.wraps(handler)
    def wrapped(args) -> int:
        from orchestrator.ray.cluster import ClusterError

        try:
            return handler(args)
        except ClusterError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1

    return wrapped
