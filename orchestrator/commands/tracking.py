"""`orchestrator tracking sync SPEC...`: complete a job's MLflow run from its metrics log.

For jobs run without a service (`orchestrator run --local`, `torchrun -m workers.run`), and
for a tracking server that was down while no service ran: the run folder of each spec
(`<checkpoint.storage>/<run>/`) holds every record; what its MLflow run lacks is sent, each
step once, then the final status and `summary.json` (from `--summary`, the file the run wrote;
without one, FINISHED once the log reaches `train.steps`). A job the service ran needs none of
this: the service completes its run whenever the server answers.
"""

from __future__ import annotations

import json
import sys


def register(sub) -> None:
    from orchestrator.commands.options import add_spec_arguments

    parser = sub.add_parser("tracking", help="the MLflow runs of jobs (`tracking.mlflow`)")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    sync = actions.add_parser(
        "sync", help="send what a job's MLflow run lacks from its metrics log; set its final status"
    )
    add_spec_arguments(sync, many=True)
    sync.add_argument("--run", metavar="NAME", help="the run folder's name (default: the spec's name)")
    sync.add_argument(
        "--summary",
        metavar="FILE",
        help="the run's summary (`--summary` of the run): its status and summary.json",
    )
    sync.set_defaults(handler=handle)


def handle(args) -> int:
    from orchestrator.errors import UsageError

    summary = _read_summary(args.summary) if args.summary else None
    failed = 0
    for path in args.spec:
        spec = _tracked_spec(path, args.overrides)
        try:
            print(sync_spec(spec, args.run, summary).line())
        except FileNotFoundError as err:
            raise UsageError(str(err)) from None
        except Exception as err:  # the server does not answer or refuses: one line, the next spec
            first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
            print(f"error: {spec.name}: MLflow at {spec.tracking.mlflow.uri}: {first}", file=sys.stderr)
            failed = 1
    return failed


def sync_spec(spec, run: str | None, summary: dict | None):
    from core import records, run_folder
    from orchestrator.monitoring import mlflow_sync, mlflow_tracking

    run = run or run_folder.run_name(spec)
    run_uri = run_folder.run_uri(spec, run)
    logged = mlflow_sync.tracked_records(run_uri)
    if not logged and mlflow_tracking.read_run_file(run_uri) is None:
        raise FileNotFoundError(f"{spec.name}: nothing logged in {run_uri} (another run folder: --run NAME)")
    if summary is None:
        train = [r for r in logged if records.is_train(r)]
        if train and train[-1][records.STEP] >= spec.train.steps:
            summary = {"job": spec.name, "run": run, "status": "succeeded", "steps": train[-1][records.STEP]}
    tags = mlflow_tracking.job_tags(run_uri, {})
    params = mlflow_tracking.flat_params(spec.model_dump(mode="json", by_alias=True))
    return mlflow_sync.sync_run(spec.tracking.mlflow, run_uri, run, summary, tags, params)


def _tracked_spec(path: str, overrides: list[str]):
    from core.spec import load_spec
    from orchestrator.errors import UsageError

    spec = load_spec(path, overrides)
    if spec.tracking.mlflow is None:
        raise UsageError(f"{path}: no tracking.mlflow in the spec; add it or --set tracking.mlflow.uri=URL")
    return spec


def _read_summary(path: str) -> dict:
    from orchestrator.errors import UsageError

    try:
        with open(path) as src:
            summary = json.load(src)
    except (OSError, ValueError) as err:
        raise UsageError(f"--summary {path}: not a run's summary ({str(err).splitlines()[0]})") from None
    if not isinstance(summary, dict) or "status" not in summary:
        raise UsageError(f"--summary {path}: not a run's summary (no status)")
    return summary
