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
from typing import TYPE_CHECKING

from orchestrator.commands.follow_jobs import ActorReader, HttpReader, follow_queued
from orchestrator.commands.job_logs import follow_ray_job
from orchestrator.commands.options import add_jobs_api_address, add_spec_arguments, with_cluster_errors
from orchestrator.errors import UsageError

if TYPE_CHECKING:
    from core.spec import JobSpec

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def register(sub) -> None:
    parser = sub.add_parser("submit", help="submit a job to a Ray cluster (Ray Jobs API)")
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
    if args.priority is not None:
        args.overrides = [*args.overrides, f"scheduling.priority={args.priority}"]
    if not args.no_validate:
        queued = queue_over_http(args)  # the quick path: the service reads and checks the spec
        if queued is not None:
            return queued
    from orchestrator.ray.cluster import jobs_client, translate

    if args.no_validate:
        from core.spec import CheckpointSpec, apply_overrides, read_yaml

        raw = apply_overrides(read_yaml(args.spec), args.overrides)
        name = str(raw.get("name") or Path(args.spec).stem)
        section = raw.get("checkpoint") if isinstance(raw.get("checkpoint"), dict) else {}
        storage = str(section.get("storage", CheckpointSpec().storage))
        require_a_cluster(args)
    else:
        from orchestrator.commands.run import load_runnable

        spec = load_runnable(args.spec, args.overrides)  # the one parse; bad specs fail here, exit 2
        check_storage(spec)
        require_a_cluster(args)
        queued = queue_with_service(args, spec)
        if queued is not None:
            return queued
        name, storage = spec.name, spec.checkpoint.storage
    working_dir = Path(args.working_dir) if args.working_dir else default_working_dir()
    if not working_dir.is_dir():
        raise UsageError(f"--working-dir {working_dir}: not a directory")
    overrides = list(args.overrides)
    if "://" not in storage and not os.path.isabs(os.path.expanduser(storage)):
        # the job runs in Ray's temporary copy of the working directory: resolve it here
        absolute = os.path.abspath(os.path.expanduser(storage))
        overrides.append(f"checkpoint.storage={absolute}")
        print(
            f"note: checkpoint.storage '{storage}' is relative: the job writes to {absolute} "
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


def require_a_cluster(args) -> None:
    """Refuse, before reaching for a cluster, when nothing says where one is."""
    from orchestrator.ray.cluster import read_state

    known = ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")
    if not (args.address or any(os.environ.get(name) for name in known) or read_state()):
        raise UsageError(
            "no orchestrator service known here: start one with `orchestrator up` (a local Ray "
            "head and the service), or pass --address of a cluster that runs one"
        )


def check_storage(spec: JobSpec) -> None:
    """Refuse storage the job could not write its checkpoints to, here, where the user sees it
    (`--no-validate` skips it: storage that only the cluster can reach)."""
    from core import storage

    try:
        storage.check_writable(spec.checkpoint.storage)
    except OSError as err:
        hint = " (storage only the cluster reaches: pass --no-validate)"
        raise UsageError(f"{spec.name}: {str(err).splitlines()[0]}{hint}") from None


def queue_over_http(args) -> int | None:
    """Send the spec file as it is, with the overrides and this shell's directories, to the
    service recorded here, which reads and checks it as `validate` does (`sent_spec.py`) and
    queues it: no spec schema is loaded here, which on a loaded head saves seconds. None when
    there is no page to send to, the file cannot be read here (the checks below then say why)
    or the page does not answer (the cluster is joined instead)."""
    from orchestrator import client
    from orchestrator.ray.cluster import home, read_token

    page, token = client.recorded_page(args.address), client.caller_token() or read_token()
    if not (page and token):
        return None
    try:
        text = Path(args.spec).read_text(encoding="utf-8")
    except (OSError, ValueError):
        return None
    sent = {"path": args.spec, "text": text, "overrides": list(args.overrides)}
    sent |= {"cwd": os.getcwd(), "home": os.path.expanduser("~")}
    working_dir = Path(args.working_dir) if args.working_dir else default_working_dir()
    if not working_dir.is_dir():
        raise UsageError(f"--working-dir {working_dir}: not a directory")
    try:
        package = cached_package(working_dir, home() / "packages")
        done = client.api_submit_sent(page, token, sent, package)
    except client.Unreachable:
        args.http_unreachable = True  # e.g. a service restarted elsewhere: join the cluster instead
        return None
    from orchestrator.ray.origin import remember

    remember(working_dir)  # a later `ray job submit` from here resolves relative paths here
    ids = [view["id"] for view in done["jobs"]]
    return announce(args, ids, page, HttpReader(page), done.get("sweep"), done.get("notes") or [])


def cached_package(working_dir: Path, cache: Path) -> bytes:
    from orchestrator.project_package import cached_project_zip

    try:
        return cached_project_zip(working_dir, cache)
    except OSError as err:
        raise UsageError(str(err)) from None


def queue_with_service(args, spec: JobSpec) -> int | None:
    """Queue the job (or a sweep's trials) with the orchestrator service; None when there is
    none (the job then goes to Ray Jobs, and its driver queues it itself). Over the service's
    HTTP API when `orchestrator up` recorded it here and the caller has a token to send (its
    own, else the cluster's) (a fraction of a second), else by joining the cluster as a Ray
    driver (seconds). The service gets the specs validated above and only checks them
    against the schema; the job's owner is whoever the token names."""
    from orchestrator import client
    from orchestrator.ray.cluster import home, read_token
    from orchestrator.ray.origin import remember
    from orchestrator.service.sent_spec import queue_items

    specs, options = queue_items(spec)
    working_dir = Path(args.working_dir) if args.working_dir else default_working_dir()
    page, token = client.recorded_page(args.address), client.caller_token() or read_token()
    if page and token and not getattr(args, "http_unreachable", False):
        raw = [job_spec.model_dump(mode="json", by_alias=True) for job_spec in specs]
        try:
            package = cached_package(working_dir, home() / "packages")
            views = client.api_submit(page, token, raw, options, package)
        except client.Unreachable:
            views = None  # e.g. a service restarted elsewhere: join the cluster instead
        if views is not None:
            remember(working_dir)  # a later `ray job submit` from here resolves relative paths here
            ids = [view["id"] for view in views]
            return announce(args, ids, page, HttpReader(page), *sweep_and_notes(spec))
    return queue_through_ray(args, spec, specs, options, working_dir)


def sweep_and_notes(spec: JobSpec) -> tuple[str | None, list[str]]:
    """What `announce` says of a spec checked here: its sweep's name, and whether it resumes."""
    from orchestrator.service.sent_spec import resume_note

    if spec.sweep is not None:
        return spec.name, []
    return None, [note for note in [resume_note(spec)] if note]


def queue_through_ray(args, spec: JobSpec, specs: list, options: list[dict], working_dir: Path) -> int | None:
    from orchestrator import client
    from orchestrator.ray.cluster import home
    from orchestrator.ray.origin import remember

    with client.connected_service(args.address, required=spec.sweep is not None) as service:
        if service is None:
            return None
        package = cached_package(working_dir, home() / "packages")
        remember(working_dir)
        ids = []
        for job_spec, option in zip(specs, options):
            try:
                view = client.call(service.submit, job_spec, option, package, client.caller_token())
            except client.ServiceError as err:
                raise UsageError(str(err)) from None
            ids.append(view["id"])
        page = client.call(service.info).get("status_page")
        return announce(args, ids, page, ActorReader(service), *sweep_and_notes(spec))


def announce(args, ids: list[str], page: str | None, reader, sweep: str | None, notes: list[str]) -> int:
    """Print the queued ids, the service's notes and where to watch them; with --wait, follow
    them to the end."""
    for job_id in ids:
        print(job_id, flush=True)
    if sweep is not None:
        ranking = f"rank them with `orchestrator sweep {sweep}`"
        print(f"sweep {sweep}: {len(ids)} trials queued; {ranking}", file=sys.stderr)
    for note in notes:
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
