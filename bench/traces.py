"""Job traces for the scheduler simulator: one CSV format, a converter, and generators.

The common format (one row per job, times in seconds, a header line):

    job_id,submit_time_s,num_gpus,duration_s[,priority,queue,user]

`duration_s` is the job's run time on its GPUs with nothing in the way: the simulator's
ground truth, given to the policies only as an oracle (`--with-durations`, the baselines).

    python bench/traces.py tiresias SRC.csv OUT.csv        # Tiresias' simulator format -> ours
    python bench/traces.py philly OUT.csv --jobs 2000 --gpus 64 --load 0.75 --seed 1
    python bench/traces.py teams OUT.csv --gpus 64 --seed 1   # two teams, one with 4x the work

Generated traces ("Philly-like"): Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU
Clusters for DNN Training Workloads" (USENIX ATC'19) report that most jobs of Microsoft's
Philly cluster ask for one GPU, few for more than 8, and that run times are heavy-tailed,
from minutes to days. The parameters below are ours, chosen to have those shapes; they are
not fitted to the paper's figures. Two families with different tails (`lognormal`: a mix of
short and long jobs; `pareto`: a power-law tail) and several seeds keep a policy from being
tuned to one trace. Poisson arrivals at the rate that offers `load` of the GPU-seconds.
"""

from __future__ import annotations

import argparse
import csv
import math
import random
import sys
from dataclasses import dataclass
from pathlib import Path

FIELDS = ("job_id", "submit_time_s", "num_gpus", "duration_s")
OPTIONAL = ("priority", "queue", "user")
GPU_SHARES = {1: 0.70, 2: 0.10, 4: 0.11, 8: 0.06, 16: 0.02, 32: 0.01}  # most jobs: 1 GPU
MIN_DURATION_S, MAX_DURATION_S = 60.0, 7 * 24 * 3600.0


@dataclass
class TraceJob:
    id: str
    submit: float
    gpus: int
    duration: float
    priority: int = 0
    queue: str = "default"
    user: str | None = None


def read_trace(path: str | Path) -> list[TraceJob]:
    """The jobs of a trace in the common format, by submission time; ValueError names the row."""
    jobs = []
    with open(path, newline="") as f:
        reader = csv.DictReader(row for row in f if not row.startswith("#"))
        missing = [name for name in FIELDS if name not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)}; expected {','.join(FIELDS)}")
        for line, row in enumerate(reader, start=2):
            try:
                job = TraceJob(
                    row["job_id"],
                    float(row["submit_time_s"]),
                    int(row["num_gpus"]),
                    float(row["duration_s"]),
                    int(row.get("priority") or 0),
                    row.get("queue") or "default",
                    row.get("user") or None,
                )
            except (TypeError, ValueError) as err:
                raise ValueError(f"{path}, row {line}: {err}") from None
            if job.gpus < 1 or not job.duration > 0 or not math.isfinite(job.submit):
                raise ValueError(f"{path}, row {line}: num_gpus must be >= 1 and duration_s > 0")
            jobs.append(job)
    return sorted(jobs, key=lambda job: (job.submit, job.id))


def write_trace(path: str | Path, jobs: list[TraceJob], header: list[str] = ()) -> None:
    """Write jobs in the common format; `header`: comment lines (provenance) at the top."""
    extra = [name for name in OPTIONAL if any(_has(job, name) for job in jobs)]
    with open(path, "w", newline="") as f:
        for line in header:
            f.write(f"# {line}\n")
        writer = csv.writer(f)
        writer.writerow([*FIELDS, *extra])
        for job in jobs:
            row = [job.id, f"{job.submit:g}", job.gpus, f"{job.duration:g}"]
            writer.writerow(row + [getattr(job, name) or "" for name in extra])


def _has(job: TraceJob, name: str) -> bool:
    value = getattr(job, name)
    return value not in (None, 0, "default")


def from_tiresias(path: str | Path) -> list[TraceJob]:
    """Tiresias' simulator CSV (job_id,num_gpu,submit_time,iterations,model_name,duration,
    interval) in the common format: its `duration` is the run time in seconds."""
    with open(path, newline="") as f:
        return [
            TraceJob(row["job_id"], float(row["submit_time"]), int(row["num_gpu"]), float(row["duration"]))
            for row in csv.DictReader(f)
        ]


def _duration(rng: random.Random, family: str) -> float:
    if family == "lognormal":  # 60% short (median 10 min), 40% long (median 4 h)
        median, sigma = (600.0, 1.2) if rng.random() < 0.6 else (4 * 3600.0, 1.0)
        value = rng.lognormvariate(math.log(median), sigma)
    elif family == "pareto":  # a power-law tail from 5 minutes (alpha 0.9: a few very long jobs)
        value = 300.0 * rng.paretovariate(0.9)
    else:
        raise ValueError(f"unknown family {family!r}; expected lognormal or pareto")
    return min(max(value, MIN_DURATION_S), MAX_DURATION_S)


def philly_like(
    jobs: int, gpus: int, load: float, seed: int, family: str = "lognormal", max_gpus: int | None = None
) -> list[TraceJob]:
    """`jobs` jobs with Philly-like sizes and durations, arriving to offer `load` of `gpus`."""
    rng = random.Random(seed)
    sizes = [(size, share) for size, share in GPU_SHARES.items() if size <= (max_gpus or gpus)]
    out = []
    for index in range(jobs):
        size = rng.choices([s for s, _ in sizes], [w for _, w in sizes])[0]
        out.append(TraceJob(f"j{index:05d}", 0.0, size, round(_duration(rng, family))))
    _arrivals(out, rng, load * gpus)
    return out


def two_teams(
    gpus: int, seed: int, jobs: int = 1500, ratio: float = 4.0, load: float = 1.3
) -> list[TraceJob]:
    """Two teams of one cohort: team-a submits `ratio` times team-b's work, overloading the
    cluster together (`load`), so that both have work waiting most of the time."""
    rng = random.Random(seed)
    out = []
    for index in range(jobs):
        team = "team-a" if math.isinf(ratio) or rng.random() < ratio / (ratio + 1) else "team-b"
        size = rng.choices([1, 2, 4, 8], [0.6, 0.15, 0.15, 0.1])[0]
        duration = round(_duration(rng, "lognormal"))
        out.append(
            TraceJob(f"{team[-1]}{index:05d}", 0.0, size, duration, queue=team, user=f"{team}-u{index % 3}")
        )
    _arrivals(out, rng, load * gpus)
    return out


def _arrivals(jobs: list[TraceJob], rng: random.Random, gpus_offered: float) -> None:
    """Poisson arrivals at the rate that offers `gpus_offered` GPUs on average."""
    mean_gpu_s = sum(job.gpus * job.duration for job in jobs) / len(jobs)
    rate = gpus_offered / mean_gpu_s
    now = 0.0
    for job in jobs:
        job.submit = round(now, 1)
        now += rng.expovariate(rate)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    convert = sub.add_parser("tiresias", help="convert Tiresias' simulator CSV")
    convert.add_argument("source")
    convert.add_argument("out")
    convert.add_argument("--origin", default="", help="where the source came from (a comment line)")
    for name in ("philly", "teams"):
        gen = sub.add_parser(name)
        gen.add_argument("out")
        gen.add_argument("--jobs", type=int, default=2000 if name == "philly" else 1500)
        gen.add_argument("--gpus", type=int, default=64, help="GPUs of the cluster the load is for")
        gen.add_argument("--load", type=float, default=0.75 if name == "philly" else 1.3)
        gen.add_argument("--seed", type=int, default=0)
        gen.add_argument("--family", default="lognormal", choices=("lognormal", "pareto"))
        gen.add_argument("--ratio", type=float, default=4.0, help="teams: team-a's work over team-b's (inf)")
    args = parser.parse_args(argv)
    command = "python bench/traces.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.what == "tiresias":
        jobs = from_tiresias(args.source)
        header = [f"converted from Tiresias' simulator trace {args.origin or args.source}", command]
    elif args.what == "philly":
        jobs = philly_like(args.jobs, args.gpus, args.load, args.seed, args.family)
        header = [
            f"Philly-like ({args.family}), {args.jobs} jobs, load {args.load} on {args.gpus} GPUs",
            command,
        ]
    else:
        jobs = two_teams(args.gpus, args.seed, args.jobs, args.ratio, args.load)
        header = [
            f"two teams, team-a {args.ratio:g}x team-b's work, load {args.load} on {args.gpus} GPUs",
            command,
        ]
    write_trace(args.out, jobs, header)
    print(f"{len(jobs)} jobs written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
