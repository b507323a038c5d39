"""Microsoft's Philly job log as replay traces: one CSV per virtual cluster (VC).

    python bench/philly.py log cluster_job_log OUT_DIR      # the official log (below)
    python bench/philly.py pcs PCS_CHECKOUT OUT_DIR          # the PCS extraction of it (below)

Source: `cluster_job_log` inside `trace-data.tar.gz` of github.com/msr-fiddle/philly-traces
(CC BY 4.0; Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN Training
Workloads", USENIX ATC'19): a JSON list of the 117,325 jobs submitted 2017-08-07..2017-12-22,
each with `status`, `vc`, `jobid`, `submitted_time`, `user` and `attempts` (each with
`start_time`, `end_time` and `detail`: the servers and GPUs it held). Per job:

- submit time: `submitted_time`, a wall-clock time in Redmond (it crosses the end of
  daylight saving time on 2017-11-05), as seconds since the VC's first submission;
- GPUs: the most GPUs any attempt held;
- run time: the sum of its attempts' lengths (end - start), whatever its status: a killed or
  failed job held its GPUs for that long too. Jobs with no complete attempt, no GPU or a zero
  run time are left out (the CSV's header counts them).

The archive is stored in Git LFS; where it cannot be had, `pcs` reads the same jobs from the
per-VC traces that Abdullah Bin Faisal's PCS (github.com/abdullahfsm/PCS, OSDI'24, MIT)
extracted from the log: `simulation/traces/trace_<vc>.csv` with `submit_time` (seconds since
the VC's first submission), `num_jobs` (the GPUs), and `service`, the run time multiplied by
the speed-up on that many GPUs of a model picked at random (`model_name`; the tables of
speed-ups are read, not run, from the checkout's `simulation/models.py`). Dividing it back
gives whole seconds for every one of its 109,532 jobs, and 3,021 of the 3,034 real jobs of
4+ GPUs that github.com/marwage/philly-traces lists (`analysis/jobs.json` at b741616) are
found in it with their GPUs, the sum of their attempts to the second and their submission to
the second (one origin per VC, one hour apart across 2017-11-05): docs/scheduler.md.

The cluster of a VC: the fewest 8-GPU nodes that hold its largest job and keep the offered
load (GPU-seconds submitted over GPU-seconds available between the first and the last
submission) at or below 0.8; in the load sweep (issue 51), the GPUs that give the offered
load nearest each target (`gpus_for_load`).
"""

from __future__ import annotations

import argparse
import ast
import csv
import json
import math
import sys
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

sys.path.insert(0, str(Path(__file__).resolve().parent))

from traces import TraceJob, read_trace, write_trace  # noqa: E402

REDMOND = ZoneInfo("America/Los_Angeles")
GPUS_PER_NODE = 8
MAX_LOAD = 0.8
MIN_JOBS = 500  # a VC with fewer jobs is left out of the tables


def _time(text: str | None) -> float | None:
    if not text or text == "None":
        return None
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S").replace(tzinfo=REDMOND).timestamp()


def job_from_log(entry: dict) -> tuple[float, int, float] | None:
    """(submit epoch s, GPUs, run time s) of one job of the log; None if it never ran."""
    gpus, run_s = 0, 0.0
    for attempt in entry.get("attempts") or ():
        start, end = _time(attempt.get("start_time")), _time(attempt.get("end_time"))
        if start is None or end is None or end < start:
            continue
        run_s += end - start
        gpus = max(gpus, sum(len(server.get("gpus") or ()) for server in attempt.get("detail") or ()))
    submit = _time(entry.get("submitted_time"))
    if submit is None or gpus < 1 or run_s <= 0:
        return None
    return submit, gpus, run_s


def from_log(path: str | Path) -> tuple[dict[str, list[TraceJob]], dict[str, int]]:
    """Per VC: its jobs (submit times from its first submission); and how many were left out."""
    with open(path) as f:
        entries = json.load(f)
    raw: dict[str, list[tuple[float, int, float, str, str]]] = defaultdict(list)
    skipped: dict[str, int] = defaultdict(int)
    for entry in entries:
        found = job_from_log(entry)
        if found is None:
            skipped[entry.get("vc", "?")] += 1
            continue
        raw[entry["vc"]].append((*found, entry["jobid"], entry.get("user") or ""))
    out = {}
    for vc, rows in raw.items():
        origin = min(row[0] for row in rows)
        out[vc] = [
            TraceJob(jobid, submit - origin, gpus, run_s, user=user or None)
            for submit, gpus, run_s, jobid, user in rows
        ]
    return out, dict(skipped)


def pcs_speedups(models_py: str | Path) -> dict[str, list[float]]:
    """Model name -> speed-up on 1, 2, ... GPUs, parsed (not executed) from PCS' models.py:
    each `class X(Model)` passes (name, iterations, [time per iteration on 1, 2, ... GPUs])."""
    tree = ast.parse(Path(models_py).read_text())
    out = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or len(node.args) != 3:
            continue
        name, _, times = node.args
        if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
            continue
        try:
            values = ast.literal_eval(times)
        except ValueError:
            continue  # a computed list (a toy model): not used by the Philly traces
        out[name.value] = [values[0] / value for value in values]
    return out


def from_pcs(checkout: str | Path, vc: str, speedups: dict[str, list[float]]) -> list[TraceJob]:
    """One VC's jobs from PCS' `simulation/traces/trace_<vc>.csv` (module docstring)."""
    path = Path(checkout) / "simulation" / "traces" / f"trace_{vc}.csv"
    jobs = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            gpus = int(row["num_jobs"])
            run_s = float(row["service"]) / speedups[row["model_name"]][gpus - 1]
            if abs(run_s - round(run_s)) > 1e-3:
                raise ValueError(f"{path}, app {row['app_id']}: run time {run_s} is not whole seconds")
            jobs.append(
                TraceJob(f"{vc}-{int(row['app_id']):05d}", float(row["submit_time"]), gpus, round(run_s))
            )
    return jobs


def cluster_nodes(jobs: list[TraceJob], per_node: int = GPUS_PER_NODE, max_load: float = MAX_LOAD) -> int:
    """The fewest nodes that hold the largest job with an offered load of at most `max_load`."""
    span = max(job.submit for job in jobs) - min(job.submit for job in jobs)
    work = sum(job.gpus * job.duration for job in jobs)
    biggest = math.ceil(max(job.gpus for job in jobs) / per_node)
    return max(biggest, math.ceil(work / (max_load * per_node * span)) if span > 0 else 1)


def offered_load(jobs: list[TraceJob], nodes: int, per_node: int = GPUS_PER_NODE) -> float:
    """GPU-seconds submitted over those of `nodes` between the first and the last submission."""
    span = max(job.submit for job in jobs) - min(job.submit for job in jobs)
    work = sum(job.gpus * job.duration for job in jobs)
    return work / (nodes * per_node * span) if span > 0 else math.inf


def gpus_for_load(jobs: list[TraceJob], load: float, per_node: int = GPUS_PER_NODE) -> int:
    """The GPUs that give `jobs` the offered load nearest `load`, and at least enough to hold
    the largest job (whole nodes for one of more than a node): the load sweep's cluster."""
    biggest = max(job.gpus for job in jobs)
    least = biggest if biggest <= per_node else math.ceil(biggest / per_node) * per_node
    return max(least, round(gpu_demand(jobs) / load))


def gpu_demand(jobs: list[TraceJob]) -> float:
    """GPUs busy on average if every job ran on arrival: the work submitted over its span."""
    span = max(job.submit for job in jobs) - min(job.submit for job in jobs)
    return sum(job.gpus * job.duration for job in jobs) / span if span > 0 else math.inf


def trace_path(folder: str | Path, vc: str) -> Path:
    return Path(folder) / f"philly-vc-{vc}.csv"


def write_vcs(per_vc: dict[str, list[TraceJob]], out: str | Path, source: str, command: str) -> None:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for vc, jobs in sorted(per_vc.items()):
        nodes = cluster_nodes(jobs)
        header = [
            f"Microsoft Philly job log, VC {vc}: {len(jobs)} jobs; {source.replace('{vc}', vc)}",
            f"cluster: {nodes} nodes x {GPUS_PER_NODE} GPUs, offered load {offered_load(jobs, nodes):.3f}",
            command,
        ]
        write_trace(trace_path(out, vc), sorted(jobs, key=lambda j: (j.submit, j.id)), header)
        print(f"{vc}: {len(jobs)} jobs, {nodes} nodes x {GPUS_PER_NODE} GPUs -> {trace_path(out, vc)}")


def load_vcs(folder: str | Path, min_jobs: int = MIN_JOBS) -> dict[str, list[TraceJob]]:
    """The converted VCs in `folder` with at least `min_jobs` jobs, largest first."""
    found = {
        path.stem.removeprefix("philly-vc-"): read_trace(path)
        for path in Path(folder).glob("philly-vc-*.csv")
    }
    kept = {vc: jobs for vc, jobs in found.items() if len(jobs) >= min_jobs}
    return dict(sorted(kept.items(), key=lambda item: -len(item[1])))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="source", required=True)
    log = sub.add_parser("log", help="the official cluster_job_log (JSON)")
    log.add_argument("path")
    log.add_argument("out")
    pcs = sub.add_parser("pcs", help="a checkout of github.com/abdullahfsm/PCS")
    pcs.add_argument("path")
    pcs.add_argument("out")
    pcs.add_argument("--origin", default="", help="where the checkout came from (repository@commit)")
    args = parser.parse_args(argv)
    command = "python bench/philly.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.source == "log":
        per_vc, skipped = from_log(args.path)
        write_vcs(per_vc, args.out, f"from {args.path} ({sum(skipped.values())} jobs never ran)", command)
        return 0
    speedups = pcs_speedups(Path(args.path) / "simulation" / "models.py")
    vcs = sorted(
        p.stem.removeprefix("trace_") for p in (Path(args.path) / "simulation" / "traces").glob("trace_*.csv")
    )
    per_vc = {vc: from_pcs(args.path, vc, speedups) for vc in vcs}
    origin = args.origin or args.path
    write_vcs(per_vc, args.out, f"via PCS' extraction {origin}/simulation/traces/trace_{{vc}}.csv", command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
