"""What per-step metrics cost: the same local 2-worker job with metrics every step and without.

    python bench/metrics_overhead.py          # jobs/convnet.yaml, 2 workers, local Ray; ~12 min
    python bench/metrics_overhead.py --runs 0 --pairs 3 --steps 10250 \
        --out bench/results/metrics_overhead_pairs.json

"On" logs every step (`metrics.log_every=1`): rank 0 builds a record (step time split,
gradient norm, rates, memory), one all-reduce about every 0.25 s completes the records (mean
loss, non-finite flag, stop request), rank 0 hands them to the run's state actor (batched,
fire-and-forget), and the driver appends them to the Parquet metrics log in storage. "Off"
logs nothing.

Between separate runs, step times on a small shared machine drift by 10% and more, which
hides a cost of 1-2%. So the main figure is measured *within* each run: the workers log
metrics in some blocks of `--block` steps and not in others (after a warm-up block: on, off,
off, on, ..., so that a steady drift weighs on both sides alike; `workers/metrics_ab.py`), and
the run's summary holds the mean step time of the "on" and the "off" blocks (a mean, so that
a cost paid once per batch of records counts in full), taken in the same processes seconds
apart. The ratio is the median over `--runs` runs. Target: < 1.02.

`--service-side` measures instead what the service does with each record (no Ray): the time
ledger (goodput) and the watchdog (hangs, stragglers) fold the records of a real run (a local
`orchestrator run --local` with a record every step, each with a second rank's record beside
it, as a 2-worker job sends), reported as a share of that run's median step time. They run in
the service's process, not on the training path: the workers send nothing new for them.

The driver and the state actor take the records about once a second, so within a run their
work falls on both sides alike. `--pairs N` runs N alternating pairs of whole runs (every
step against none), which show it: the step time ratio (noisy, see above) and the CPU the
driver and the state actor spend per step.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "metrics_overhead.json"
PHASE_KEYS = ("compute_s", "data_s", "optimizer_s")  # a rank's own record: its step-time split
SERVICE_SIDE_RESULTS = ROOT / "bench" / "results" / "goodput_overhead.json"
sys.path.insert(0, str(ROOT))


def one_run(address: str, env: dict, args, log_every: int) -> dict:
    storage = tempfile.mkdtemp(prefix="bench-metrics-")
    summary = Path(storage) / "summary.json"
    command = [
        sys.executable,
        "-m",
        "orchestrator",
        "run",
        args.spec,
        "--address",
        address,
        "--summary",
        str(summary),
    ]
    for override in [
        f"checkpoint.storage={storage}",
        f"train.steps={args.steps}",
        f"metrics.log_every={log_every}",
        "checkpoint.every_steps=null",
        "train.eval_every=null",
        *args.overrides,
    ]:
        command += ["--set", override]
    with tempfile.TemporaryFile("w+") as errors:
        driver = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=errors)
        cpu_s = consumer_cpu_s(driver)
        if driver.returncode != 0:
            errors.seek(0)
            sys.exit(f"run failed ({driver.returncode}):\n{errors.read()[-3000:]}")
    return {**json.loads(summary.read_text()), "consumer_cpu_s": cpu_s}


def consumer_cpu_s(driver: subprocess.Popen) -> dict:
    """CPU seconds per second of the run's driver and state actor while it trains: between
    40% and 90% of the driver's life, past start-up (imports, connecting, workers starting)
    and before the end. They take the records off the workers' hands about once a second, so
    in the same-run blocks their work falls on both sides alike; whole runs show it."""
    import psutil

    samples: list[tuple[float, dict[str, float]]] = []
    processes = {"driver": psutil.Process(driver.pid)}
    while driver.poll() is None:
        if "controller" not in processes:
            for process in psutil.process_iter(["name"]):
                if process.info["name"] == "ray::AttemptController":
                    processes["controller"] = process
        cpu = {}
        for role, process in processes.items():
            try:
                times = process.cpu_times()
                cpu[role] = times.user + times.system
            except psutil.Error:
                pass
        samples.append((time.monotonic(), cpu))
        time.sleep(0.25)
    first, last = samples[0][0], samples[-1][0]
    window = [s for s in samples if first + 0.4 * (last - first) <= s[0] <= first + 0.9 * (last - first)]
    (t0, a), (t1, b) = window[0], window[-1]
    return {role: (b[role] - a.get(role, 0.0)) / (t1 - t0) for role in b if role in a}


def service_side(args) -> dict:
    """The service's work per logged step: the ledger and the watchdog folding one report with
    one record of rank 0 and one of rank 1, replayed from a real run's metrics log."""
    from core.metrics_log import read_metrics
    from core.records import is_train
    from core.spec import load_spec
    from orchestrator.service.health import Watchdog
    from orchestrator.service.progress import account
    from orchestrator.service.submission import new_record

    storage = tempfile.mkdtemp(prefix="bench-goodput-")
    sets = [f"checkpoint.storage={storage}", f"train.steps={args.steps}", "metrics.log_every=1"]
    command = [sys.executable, "-m", "orchestrator", "run", args.spec, "--local"]
    subprocess.run(
        command + [a for s in sets for a in ("--set", s)], cwd=ROOT, check=True, capture_output=True
    )
    run_dir = next(p for p in Path(storage).iterdir() if (p / "metrics").is_dir())
    train = [r for r in read_metrics(str(run_dir)) if is_train(r)]
    shutil.rmtree(storage, ignore_errors=True)
    times = [r["time"] for r in train]
    step_s = statistics.median(b - a for a, b in zip(times, times[1:]))
    spec = load_spec(args.spec, [f"checkpoint.storage={storage}"])
    best = math.inf
    for _ in range(5):  # the fastest of five replays: the cost, not the machine's noise
        job, watchdog = new_record(spec, "bench", {}, "service"), Watchdog()
        started = time.perf_counter()
        for r in train:
            rank1 = {
                k: v for k, v in r.items() if k in ("step", "time", "compute_s", "data_s", "optimizer_s")
            }
            progress = {"step": r["step"], "records": [r], "ranks": {1: {**rank1, "rank": 1}}}
            now = r["time"] + 0.5
            account(job, progress)
            watchdog.observe(job, progress, now)
            watchdog.ratios(job.id)
        best = min(best, (time.perf_counter() - started) / len(train))
    return {
        "records": len(train),
        "median_step_s": step_s,
        "service_s_per_step": best,
        "share": best / step_s,
    }


def main() -> int:
    from provenance import provenance  # bench/provenance.py (this script's folder is on sys.path)

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default="jobs/convnet.yaml")
    # a warm-up block, then 20 times on/off/off/on (workers/metrics_ab.py): ~12 minutes
    parser.add_argument("--steps", type=int, default=20250)
    parser.add_argument("--runs", type=int, default=5, help="runs with metrics on and off in blocks")
    parser.add_argument("--block", type=int, default=250, help="steps per on or off block")
    parser.add_argument("--pairs", type=int, default=0, help="also N pairs of whole runs, on vs off")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", default=str(RESULTS), help="JSON results file ('' to skip)")
    parser.add_argument(
        "--service-side", action="store_true", help="the ledger's and watchdog's cost per record (no Ray)"
    )
    args = parser.parse_args()
    if args.service_side:
        args.steps = min(args.steps, 2000)
        cost = service_side(args)
        print(
            f"service side, per logged step: {cost['service_s_per_step'] * 1e6:.1f} us (ledger + watchdog,"
            f" {cost['records']} records) = {cost['share']:.3%} of the median step"
            f" ({cost['median_step_s'] * 1e3:.2f} ms); target < 0.5%"
        )
        if args.out:
            out = SERVICE_SIDE_RESULTS if args.out == str(RESULTS) else Path(args.out)
            record = {"what": "time ledger + watchdog per record in the service", **provenance(), **cost}
            out.write_text(json.dumps({**record, "spec": args.spec, "target": 0.005}, indent=2) + "\n")
            print(f"wrote {out}")
        return 0

    from orchestrator.testing.local_cluster import start_ray_head, stop_ray_head

    head = start_ray_head(num_cpus=4)
    env = {**os.environ, "PYTHONPATH": str(ROOT), **head.env}
    runs, pairs = [], []
    try:
        for i in range(args.runs):
            ab = one_run(head.address, {**env, "ORCHESTRATOR_METRICS_AB_BLOCK": str(args.block)}, args, 1)
            ab = ab["metrics_ab"]
            ratio = ab["on_step_s"] / ab["off_step_s"]
            runs.append({**ab, "ratio": ratio, "median_ratio": ab["on_median_s"] / ab["off_median_s"]})
            print(
                f"run {i + 1}/{args.runs} (blocks of {args.block} steps): mean step, every step"
                f" {ab['on_step_s'] * 1e3:7.3f} ms   off {ab['off_step_s'] * 1e3:7.3f} ms"
                f"   ratio {ratio:.3f}   (medians: {runs[-1]['median_ratio']:.3f})",
                flush=True,
            )
        for i in range(args.pairs):
            on_run = one_run(head.address, env, args, log_every=1)
            off_run = one_run(head.address, env, args, log_every=args.steps)
            on, off = (r["throughput"]["step_time_s"] for r in (on_run, off_run))
            # what the driver and the state actor spend on the records: a share of a core, which
            # on a machine the workers keep busy lengthens their steps by at most that much
            extra = {
                role: on_run["consumer_cpu_s"].get(role, 0.0) - off_run["consumer_cpu_s"].get(role, 0.0)
                for role in ("driver", "controller")
            }
            pairs.append(
                {"on_step_s": on, "off_step_s": off, "ratio": on / off, "consumer_core_share": extra}
            )
            print(
                f"pair {i + 1}/{args.pairs} (whole runs): every step {on * 1e3:7.2f} ms   off"
                f" {off * 1e3:7.2f} ms   ratio {on / off:.3f}   CPU while training: driver"
                f" {extra['driver']:+.2%}, state actor {extra['state_actor']:+.2%} of a core",
                flush=True,
            )
    finally:
        stop_ray_head(head)
    ratios = sorted(r["ratio"] for r in runs)
    ratio = statistics.median(ratios) if runs else None
    spread = None
    if runs:
        mean = statistics.fmean(ratios)
        spread = statistics.stdev(ratios) / len(ratios) ** 0.5 if len(ratios) > 1 else None
        print(
            f"\nmetrics every step / off, same-run blocks: {ratio:.3f} (median of {len(runs)} runs;"
            f" {ratios[0]:.3f}-{ratios[-1]:.3f}; mean {mean:.3f}"
            + (f" +- {spread:.3f} standard error" if spread else "")
            + "); target < 1.02"
        )
    pair_ratios = sorted(p["ratio"] for p in pairs)
    consumers = None
    if pairs:
        print(
            f"whole runs in alternating pairs: {statistics.median(pair_ratios):.3f} (median of"
            f" {len(pairs)}; {pair_ratios[0]:.3f}-{pair_ratios[-1]:.3f})"
        )
        # CPU the driver and state actor take from a machine the workers keep busy: at most
        # that much longer steps
        consumers = statistics.median(sum(p["consumer_core_share"].values()) for p in pairs)
        print(f"driver and state actor with metrics on: {consumers:+.2%} of a core (median)")
    if args.out:
        record = {
            "what": "step time with metrics every step over metrics off (orchestrator run on Ray, 2 workers)",
            **provenance(),
            "spec": args.spec,
            "steps": args.steps,
            "block": args.block,
            "overrides": args.overrides,
            "runs": runs,
            "ratio_median": ratio,
            "ratio_range": [ratios[0], ratios[-1]] if runs else None,
            "ratio_mean": statistics.fmean(ratios) if runs else None,
            "ratio_standard_error": spread,
            "pairs": pairs,
            "pair_ratio_median": statistics.median(pair_ratios) if pairs else None,
            "consumer_cpu_share_median": consumers,
            "target": 1.02,
        }
        Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
