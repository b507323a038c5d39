"""`orchestrator submit SPEC`: queue a job with the cluster's orchestrator service, or, on a
cluster without one, send it to Ray's Jobs API.

With a service, the spec file goes as it is (its text, the `--set` overrides, where you stood)
with the project directory, zipped, to the service's one way in (`submit_sent`): over its HTTP
API when `orchestrator up` recorded it here, else as a call of the service actor. The service
reads and checks it as `validate` does and queues it; `--wait` follows it to its end.

Without a service, the project directory travels as a Ray Job's `working_dir` and the
entrypoint is `orchestrator run SPEC [--set ...]`, so the driver runs on the cluster, not on
this machine: closing the laptop does not stop the job.
"""

from __future__ import annotations

import os
import secrets
import shlex
import sys
import time
from pathlib import Path

from orchestrator.commands.follow_jobs import ActorReader, HttpReader, follow_queued
from orchestrator.commands.job_logs import follow_ray_job
from orchestrator.commands.options import add_jobs_api_address, add_spec_arguments, with_cluster_errors
from orchestrator.errors import UsageError
from orchestrator.project_package import default_working_dir


def register(sub) -> None:
    parser = sub.add_parser("submit", help="queue a job with the cluster's orchestrator service")
    add_spec_arguments(parser)
    add_jobs_api_address(parser)
    parser.add_argument("--wait", action="store_true", help="follow the job and exit with its status")
    parser.add_argument(
        "--summary",
        metavar="PATH",
        help="with --wait, through a service: write the final summary (JSON) here",
    )
    parser.add_argument(
        "--priority",
        type=int,
        metavar="N",
        help="queue priority, 0..1000 (higher first); same as --set scheduling.priority=N",
    )
    parser.add_argument(
        "--id", dest="submission_id", metavar="ID", help="submission id (default: <job name>-<time>-<random>)"
    )
    parser.add_argument(
        "--working-dir", metavar="DIR", help="directory shipped to the cluster (default: the project root)"
    )
    parser.add_argument(
        "--no-validate",
        action="store_true",
        help="skip checking the storage (and, without a service, the spec) at submission, e.g."
        " storage or data that only the job's nodes reach; the job checks them before training",
    )
    parser.set_defaults(handler=handle)


@with_cluster_errors
def handle(args) -> int:
    if args.priority is not None:
        args.overrides = [*args.overrides, f"scheduling.priority={args.priority}"]
    working_dir = Path(args.working_dir) if args.working_dir else default_working_dir()
    if not working_dir.is_dir():
        raise UsageError(f"--working-dir {working_dir}: not a directory")
    queued = queue_with_service(args, working_dir)
    if queued is not None:
        return queued
    return submit_to_ray_jobs(args, working_dir)


def queue_with_service(args, working_dir: Path) -> int | None:
    """The spec file sent to the service's one way in: over its HTTP API when `orchestrator up`
    recorded it here and the caller has a token to send (its own, else the cluster's): a
    fraction of a second, no schema loaded here; else by joining the cluster as a Ray driver
    (seconds) to call the service actor. None when the file cannot be read here (the local
    checks then say why) or the cluster runs no service."""
    from orchestrator import client
    from orchestrator.ray.cluster import read_token

    sent = client.spec_file(args.spec, args.overrides, os.getcwd(), check_storage=not args.no_validate)
    if sent is None:
        return None
    page, token = client.recorded_page(args.address), client.caller_token() or read_token()
    if page and token:
        try:
            done = client.api_submit_sent(page, token, sent, cached_package(working_dir))
        except client.Unreachable:  # e.g. a service restarted elsewhere: join the cluster instead
            pass
        else:
            return announce(args, done, working_dir, page, HttpReader(page))
    with client.connected_service(args.address) as service:
        if service is None:
            return None
        done = client.submit_to_actor(service, sent, cached_package(working_dir), "actor")
        page = client.call(service.info).get("status_page")
        return announce(args, done, working_dir, page, ActorReader(service))


def cached_package(working_dir: Path) -> bytes:
    from orchestrator.project_package import cached_project_zip
    from orchestrator.ray.cluster import home

    try:
        return cached_project_zip(working_dir, home() / "packages")
    except OSError as err:
        raise UsageError(str(err)) from None


def announce(args, done: dict, working_dir: Path, page: str | None, reader) -> int:
    """Print the queued ids, the service's notes and where to watch them; with --wait, follow
    them to the end."""
    from orchestrator.ray.origin import remember

    remember(working_dir)  # a later `ray job submit` from here resolves relative paths here
    ids = [view["id"] for view in done["jobs"]]
    for job_id in ids:
        print(job_id, flush=True)
    if done.get("sweep") is not None:
        ranking = f"rank them with `orchestrator sweep {done['sweep']}`"
        print(f"sweep {done['sweep']}: {len(ids)} trials queued; {ranking}", file=sys.stderr)
    for note in done.get("notes") or []:
        print(note, file=sys.stderr)
    if page:
        print(f"watch it: {page.rstrip('/')}/#/jobs/{ids[0]}", file=sys.stderr)
    if not args.wait:
        print(
            f"follow it with: orchestrator status {ids[0]}   (the queue: orchestrator queue)",
            file=sys.stderr,
        )
        return 0
    return follow_queued(reader, ids, summary_path=args.summary)


# -- a cluster without a service: Ray's Jobs API -----------------------------------------------


def submit_to_ray_jobs(args, working_dir: Path) -> int:
    """A Ray Job whose driver is `orchestrator run SPEC`: checked here first (unless
    --no-validate), its relative storage made absolute from here (the job runs in Ray's
    temporary copy of the working directory)."""
    from core import storage
    from orchestrator.ray.cluster import jobs_client, translate

    name, where = checked_here(args)
    overrides = list(args.overrides)
    absolute = storage.as_the_user_meant(where, os.getcwd(), os.path.expanduser("~"))
    if absolute != where:
        overrides.append(f"checkpoint.storage={absolute}")
        print(
            f"note: checkpoint.storage '{where}' is relative: the job writes to {absolute} "
            "(on a cluster of many machines, use shared storage: an NFS path or an s3://, gs://, "
            "hdfs:// URI)",
            file=sys.stderr,
        )
    command = entrypoint(args.spec, overrides, working_dir)
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
    return follow_ray_job(client, job_id)


def checked_here(args) -> tuple[str, str]:
    """The job's name and checkpoint storage, the spec checked here as `validate` does and its
    storage probed (with --no-validate: only read)."""
    if args.no_validate:
        from core.spec import CheckpointSpec, apply_overrides, read_yaml

        require_a_cluster(args)
        raw = apply_overrides(read_yaml(args.spec), args.overrides)
        section = raw.get("checkpoint") if isinstance(raw.get("checkpoint"), dict) else {}
        return str(raw.get("name") or Path(args.spec).stem), str(
            section.get("storage", CheckpointSpec().storage)
        )
    from core import storage
    from orchestrator.commands.run import load_runnable

    spec = load_runnable(args.spec, args.overrides)  # bad specs fail here, exit 2
    require_a_cluster(args)
    if spec.sweep is not None:
        raise UsageError(
            f"{args.spec} is a sweep: its trials need an orchestrator service; start one with "
            "`orchestrator up`, or pass --address of a cluster that runs one"
        )
    try:
        storage.check_writable(spec.checkpoint.storage)
    except OSError as err:
        hint = " (storage only the cluster reaches: pass --no-validate)"
        raise UsageError(f"{spec.name}: {str(err).splitlines()[0]}{hint}") from None
    return spec.name, spec.checkpoint.storage


def require_a_cluster(args) -> None:
    """Refuse, before reaching for a cluster, when nothing says where one is."""
    from orchestrator.ray.cluster import read_state

    known = ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")
    if not (args.address or any(os.environ.get(name) for name in known) or read_state()):
        raise UsageError(
            "no orchestrator service known here: start one with `orchestrator up` (a local Ray "
            "head and the service), or pass --address of a cluster that runs one"
        )


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
