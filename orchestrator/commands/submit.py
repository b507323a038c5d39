"""`orchestrator submit SPEC`: send a job to a Ray cluster through the Ray Jobs API.

The project directory travels as the job's `working_dir` and the entrypoint is
`orchestrator run SPEC [--set ...]`, so the driver runs on the cluster, not on this machine:
closing the laptop does not stop the job. `--wait` streams the logs and exits with the
job's outcome.
"""

from __future__ import annotations

import os
import secrets
import shlex
import sys
import time
from pathlib import Path

from orchestrator.cli import UsageError, add_spec_arguments
from orchestrator.commands.jobs import add_address_argument, follow, with_cluster_errors

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def register(sub) -> None:
    parser = sub.add_parser("submit", help="submit a job to a Ray cluster (Ray Jobs API)")
    add_spec_arguments(parser)
    add_address_argument(parser)
    parser.add_argument("--wait", action="store_true", help="stream the job's logs and exit with its status")
    parser.add_argument(
        "--id", dest="submission_id", metavar="ID", help="submission id (default: <job name>-<time>-<random>)"
    )
    parser.add_argument(
        "--working-dir", metavar="DIR", help="directory shipped to the cluster (default: the project root)"
    )
    parser.add_argument(
        "--no-validate",
        action="store_true",
        help="skip checking the spec here (e.g. its data exists only on the cluster);"
        " the job still checks it before training",
    )
    parser.set_defaults(handler=handle)


def default_working_dir() -> Path:
    # an editable/source checkout ships itself; an installed package ships the current dir
    return PROJECT_ROOT if (PROJECT_ROOT / "pyproject.toml").exists() else Path.cwd()


def entrypoint(spec_path: str, overrides: list[str], working_dir: Path) -> str:
    path = Path(spec_path).resolve()
    try:
        relative = path.relative_to(working_dir.resolve())
    except ValueError:
        raise UsageError(
            f"{spec_path}: the spec must be inside the directory shipped to the"
            f" cluster ({working_dir}); move it there or pass --working-dir"
        ) from None
    args = ["orchestrator", "run", relative.as_posix()]
    for override in overrides:
        args += ["--set", override]
    return shlex.join(args)


@with_cluster_errors
def handle(args) -> int:
    from orchestrator.cluster import jobs_client, translate
    from orchestrator.commands.run import load_runnable
    from orchestrator.spec import apply_overrides, read_yaml

    if args.no_validate:
        raw = apply_overrides(read_yaml(args.spec), args.overrides)
        name = str(raw.get("name") or Path(args.spec).stem)
        section = raw.get("checkpoint")
        storage = str(section.get("storage", "./runs") if isinstance(section, dict) else "./runs")
    else:
        spec = load_runnable(args.spec, args.overrides)  # bad specs fail here, not on the cluster
        name, storage = spec.name, spec.checkpoint.storage
    working_dir = Path(args.working_dir) if args.working_dir else default_working_dir()
    if not working_dir.is_dir():
        raise UsageError(f"--working-dir {working_dir}: not a directory")
    command = entrypoint(args.spec, args.overrides, working_dir)
    if "://" not in storage and not os.path.isabs(storage):
        print(
            f"warning: checkpoint.storage '{storage}' is relative: on the cluster it lands in"
            " the job's temporary working directory; use shared storage (an absolute NFS path"
            " or an s3://, gs://, hdfs:// URI) to keep checkpoints",
            file=sys.stderr,
        )
    submission_id = args.submission_id or f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
    client = jobs_client(args.address)
    try:
        job_id = client.submit_job(
            entrypoint=command,
            submission_id=submission_id,
            runtime_env={"working_dir": str(working_dir)},
            metadata={"orchestrator_job": name, "spec": args.spec},
        )
    except Exception as err:
        raise translate(err, args.address or "the Ray cluster") from None
    print(job_id, flush=True)
    if not args.wait:
        print(f"follow it with: orchestrator logs {job_id} --follow", file=sys.stderr)
        return 0
    return follow(client, job_id)
