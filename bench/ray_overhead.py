"""What running on Ray costs: the same N-worker job through torchrun and through `orchestrator run`.

    python bench/ray_overhead.py                        # jobs/convnet.yaml, 2 workers, local Ray
    python bench/ray_overhead.py --address HOST:6379    # against a running cluster instead
    python bench/ray_overhead.py --cluster --burn 1     # a local cluster started once, under load
    python bench/ray_overhead.py --steps 500 --repeats 5 --set data.batch_size=256
    python bench/ray_overhead.py --service --steps 30 --repeats 5   # + `orchestrator submit` via the service

Both sides log every step (`metrics.log_every=1`): each record carries the worker's wall
clock, so consecutive records give per-step times, and the Ray side pays its per-step cost
(records batched to the run's state actor a few times a second) on every step. Reported per
side, as the median over runs: the median steady-state step time (first `--warmup` steps
dropped) and the time from starting the command to the end of the first training step. Runs
alternate between the two sides so that load drifting on a shared machine hits both alike.
`--burn N` runs N processes that keep a core busy for the whole benchmark (the same
background load for both sides); `--cluster` starts one local Ray head first and runs every
Ray run on it, so the first-step time is that of a machine where a cluster is already up.
`--service` (implies `--cluster`) also starts the orchestrator service there (`orchestrator
up`) and adds a third side, `orchestrator submit --wait`: the main way jobs run. For it the
start-up is split by the job's own record (its history's times) into: the submit command until
the job is queued, queued until admitted, and from the admission (its attempt controller, Ray
Train's worker processes, the process group, data and model) until the first step ended.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "ray_overhead.json"


def step_times(run_dir: Path) -> tuple[list[float], float]:
    """(per-step time between consecutive records, in order; wall time of the first record)."""
    from core.metrics_log import read_metrics
    from core.records import is_train

    records = read_metrics(str(run_dir))
    train = sorted((r["step"], r["time"]) for r in records if is_train(r))
    return [(t1 - t0) / (s1 - s0) for (s0, t0), (s1, t1) in zip(train, train[1:])], train[0][1]


def one_run(side: str, args, overrides: list[str]) -> dict:
    storage = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    sets = [
        f"checkpoint.storage={storage}",
        f"train.steps={args.steps}",
        f"metrics.log_every={args.log_every}",
        "checkpoint.every_steps=null",
        "train.eval_every=null",
        *overrides,
    ]
    sets_args = [a for s in sets for a in ("--set", s)]
    if side == "service":
        command = [sys.executable, "-m", "orchestrator", "submit", args.spec, *sets_args, "--wait"]
        command += ["--set", f"resources.num_workers={args.workers}"]
    elif side == "torchrun":
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={args.workers}",
            "-m",
            "workers.run",
            args.spec,
            *sets_args,
        ]
    else:
        command = [
            sys.executable,
            "-m",
            "orchestrator",
            "run",
            args.spec,
            *sets_args,
            "--set",
            f"resources.num_workers={args.workers}",
        ]
        if args.address:
            command += ["--address", args.address]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.time()
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.time() - started
    if result.returncode != 0:
        sys.exit(f"{side} run failed ({result.returncode}):\n{result.stderr[-3000:]}")
    durations, first_step_end = step_times(next(p for p in storage.iterdir() if (p / "metrics").is_dir()))
    shutil.rmtree(storage, ignore_errors=True)
    steady = durations[args.warmup :]
    run = {
        "median_step_s": statistics.median(steady),
        "mean_step_s": statistics.fmean(steady),
        "first_step_s": first_step_end - started,
        "wall_s": wall,
    }
    if side == "service":
        run["phases_s"] = service_phases(args, result.stdout.split()[0], started, first_step_end)
    return run


def service_phases(args, job_id: str, started: float, first_step_end: float) -> dict:
    """Where a queued job's start-up went, by the job's record (the service's clock): from its
    admission on, its attempt controller, Ray Train's worker processes, the process group,
    data and model, until the first step ended."""
    record = json.loads((args.store / "jobs" / f"{job_id}.json").read_text())
    at = {event["event"]: event["time"] for event in reversed(record["history"])}  # first of each
    return {
        "submit_command_to_queued": at["queued"] - started,
        "queued_to_admitted": at["admitted"] - at["queued"],
        "admitted_to_first_step": first_step_end - at["admitted"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default="jobs/convnet.yaml")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20, help="records left out of the median")
    parser.add_argument(
        "--log-every", type=int, default=1, help="metrics.log_every on both sides (1: every step)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--address", help="Ray cluster to run on (default: a local one per run)")
    parser.add_argument("--cluster", action="store_true", help="start a local Ray head once and use it")
    parser.add_argument(
        "--service",
        action="store_true",
        help="also `orchestrator submit` through the service (a cluster started once)",
    )
    parser.add_argument("--burn", type=int, default=0, metavar="N", help="N busy processes (load)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", default=str(RESULTS), help="JSON results file ('' to skip)")
    args = parser.parse_args()

    head = burners = None
    args.cluster = args.cluster or args.service
    if args.cluster:
        sys.path.insert(0, str(ROOT))
        from orchestrator.testing.local_cluster import start_ray_head, stop_ray_head

        head = start_ray_head(num_cpus=max(4, args.workers))
        args.address, args.dashboard = head.address, head.dashboard
        os.environ.update(head.env)
    if args.service:
        home = Path(tempfile.mkdtemp(prefix="bench-home-"))
        args.store = home / "store"
        os.environ["ORCHESTRATOR_HOME"] = str(home)
        up = [
            sys.executable,
            "-m",
            "orchestrator",
            "up",
            "--address",
            args.address,
            "--store",
            str(args.store),
        ]
        done = subprocess.run([*up, "--metrics-port", "0"], cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"orchestrator up failed:\n{done.stdout}{done.stderr}")
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.burn)]
    try:
        runs = measure(args)
    finally:
        for b in burners:
            b.kill()
        if head is not None:
            stop_ray_head(head)
    report(args, runs)
    return 0


def measure(args) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {"torchrun": [], "ray": [], **({"service": []} if args.service else {})}
    for i in range(args.repeats):
        for side in runs:
            run = one_run(side, args, args.overrides)
            runs[side].append(run)
            print(
                f"run {i + 1}/{args.repeats} {side:8s}  step {run['median_step_s'] * 1e3:7.2f} ms"
                f"  first step after {run['first_step_s']:5.1f} s  wall {run['wall_s']:5.1f} s",
                flush=True,
            )
    return runs


def report(args, runs: dict[str, list[dict]]) -> None:
    from provenance import provenance  # bench/provenance.py (this script's folder is on sys.path)

    summary = {
        side: {key: statistics.median(r[key] for r in rs) for key in rs[0] if key != "phases_s"}
        for side, rs in runs.items()
    }
    torch_step, ray_step = summary["torchrun"]["median_step_s"], summary["ray"]["median_step_s"]
    # each Ray run against the torchrun run just before it: load drift cancels within a pair
    pairs = sorted(r["median_step_s"] / t["median_step_s"] for t, r in zip(runs["torchrun"], runs["ray"]))
    ratio = statistics.median(pairs)
    print(
        f"\nsteady-state step time (median over {args.repeats} runs of each run's median;"
        f" {args.workers} workers, {args.spec}, metrics every {args.log_every} step(s)):"
    )
    print(
        f"  torchrun {torch_step * 1e3:.2f} ms   orchestrator run on Ray {ray_step * 1e3:.2f} ms"
        f"   overhead {(ray_step - torch_step) * 1e3:+.2f} ms/step"
    )
    print(
        f"  Ray/torchrun step-time ratio {ratio:.3f} (median of pairs; pairs ranged"
        f" {pairs[0]:.3f}-{pairs[-1]:.3f}; target <= 1.05)"
    )
    print(
        f"time from command start to the end of the first step:"
        f"  torchrun {summary['torchrun']['first_step_s']:.1f} s"
        f"   orchestrator run {summary['ray']['first_step_s']:.1f} s"
        f" ({'cluster already up' if args.address else 'starting a local Ray'})"
    )
    if args.service:
        first = [s["first_step_s"] / t["first_step_s"] for t, s in zip(runs["torchrun"], runs["service"])]
        phases = {
            name: statistics.median(r["phases_s"][name] for r in runs["service"])
            for name in runs["service"][0]["phases_s"]
        }
        summary["service"]["phases_s"] = phases
        print(
            f"  orchestrator submit through the service {summary['service']['first_step_s']:.1f} s:"
            f" x{statistics.median(first):.2f} torchrun's (median of pairs; target: at most 15 s)"
        )
        print(
            "  where the service's start-up went (medians): "
            + ", ".join(f"{k} {v:.1f} s" for k, v in phases.items())
        )
    print(f"background load: {args.burn} busy process(es)" if args.burn else "no background load")

    if args.out:
        record = {
            "what": "steady-state step time, orchestrator run on Ray vs torchrun",
            **provenance(),
            "spec": args.spec,
            "workers": args.workers,
            "steps": args.steps,
            "warmup": args.warmup,
            "overrides": args.overrides,
            "address": args.address,
            "cluster_already_up": bool(args.address),
            "background_busy_processes": args.burn,
            "load_avg_after": os.getloadavg(),
            "ratio": ratio,
            "service_over_torchrun_first_step": statistics.median(
                s["first_step_s"] / t["first_step_s"] for t, s in zip(runs["torchrun"], runs["service"])
            )
            if args.service
            else None,
            "pair_ratios": pairs,
            "summary": summary,
            "runs": runs,
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
        print(f"written to {args.out}")


if __name__ == "__main__":
    sys.exit(main())
