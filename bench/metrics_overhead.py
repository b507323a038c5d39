"""What per-step metrics cost: the same local 2-worker job with metrics every step and without.

    python bench/metrics_overhead.py                      # jobs/convnet.yaml, 2 workers, local Ray
    python bench/metrics_overhead.py --pairs 5 --steps 600

"On" logs every step (`metrics.log_every=1`): each step all-reduces the loss and a stop flag,
builds a record (step time split, gradient norm, memory), hands it to the run's state actor
(batched, fire-and-forget), and the driver appends it to the Parquet metrics log in storage
and reports it to the orchestrator service when there is one. "Off" logs only the last step.
The steady-state step time comes from each run's own summary (the first step, compilation and
start-up left out), so both sides are timed the same way. Runs alternate on/off on one Ray
cluster started for the benchmark, so that load drifting on a shared machine hits both alike;
the ratio is the median of the pairs' ratios. Target: < 1.02.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "metrics_overhead.json"
sys.path.insert(0, str(ROOT))


def one_run(address: str, env: dict, args, log_every: int) -> float:
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
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"run failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return json.loads(summary.read_text())["throughput"]["step_time_s"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default="jobs/convnet.yaml")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", default=str(RESULTS), help="JSON results file ('' to skip)")
    args = parser.parse_args()

    from tests.conftest import start_ray_head, stop_ray_head

    head = start_ray_head(num_cpus=4)
    env = {**os.environ, "PYTHONPATH": str(ROOT), **head.env}
    pairs = []
    try:
        for i in range(args.pairs):
            on = one_run(head.address, env, args, log_every=1)
            off = one_run(head.address, env, args, log_every=args.steps)
            pairs.append({"on_step_s": on, "off_step_s": off, "ratio": on / off})
            print(
                f"pair {i + 1}/{args.pairs}: every step {on * 1e3:7.2f} ms   off {off * 1e3:7.2f} ms"
                f"   ratio {on / off:.3f}",
                flush=True,
            )
    finally:
        stop_ray_head(head)
    ratios = sorted(p["ratio"] for p in pairs)
    ratio = statistics.median(ratios)
    print(
        f"\nmetrics every step / off, steady-state step time: {ratio:.3f} (median of {len(pairs)} pairs;"
        f" {ratios[0]:.3f}-{ratios[-1]:.3f}); target < 1.02"
    )
    if args.out:
        record = {
            "what": "steady-state step time, metrics every step over metrics off (orchestrator run on Ray)",
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
            "commit": subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
            ).stdout.strip(),
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
            "spec": args.spec,
            "steps": args.steps,
            "overrides": args.overrides,
            "pairs": pairs,
            "ratio_median": ratio,
            "ratio_range": [ratios[0], ratios[-1]],
            "target": 1.02,
        }
        Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
