"""Where a queued job's start goes: each stage from submission to the first step, from ground truth.

    python bench/start_timeline.py                  # 3 jobs, one after the other
    python bench/start_timeline.py --jobs 5 --steps 30

The tests' three-node cluster on this machine (orchestrator/testing/local_cluster.py: a head
with 4 CPUs and one `slot`, two worker nodes with 2 CPUs and one slot each), `orchestrator up
--address` on it, then 2-worker jobs (jobs/convnet.yaml, one slot per worker) submitted one at
a time, each waited for. For every job the stages are read from what each party recorded, not from the
service's account of itself:

- the job's record in the store: queued, admitted, running, succeeded;
- Ray's actor table (class, name, pid, start and end) joined with each actor's own core-worker
  log on its node: when the attempt's controller and the run's workers came up, when their
  constructors returned, and when the controller ended;
- the run's metrics log: when its first and last steps ended (each record's wall clock).

Printed: each stage's start relative to the admission, per job, and the median over jobs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "start_timeline.json"
NODES = {"node-1": (2, 1), "node-2": (2, 1)}  # name -> (CPUs, slots), beside the head's (4, 1)
CONTROLLER, WORKER = "AttemptController", "RayTrainWorker"  # ours (one per attempt), then Ray Train's
LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")


def log_time(line: str) -> float | None:
    found = LOG_TIME.match(line)
    return datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() if found else None


def process_times(log: Path) -> dict:
    """From a core-worker log: when its process came up, when an actor's constructor began and
    returned in it, and its last line."""
    times: dict[str, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        when = log_time(line)
        if when is None:
            continue
        times.setdefault("process", when)
        times["last"] = when
        if "Creating actor" in line:
            times.setdefault("created", when)
        if "Actor creation task finished" in line:
            times.setdefault("constructed", when)
    return times


def logs_of(temp_dir: str, pid: int, kind: str = "worker") -> Path | None:
    """The core-worker (or driver) log of `pid`, on whichever node of this machine wrote it."""
    found = list(Path(temp_dir).glob(f"*/session_*/logs/python-core-{kind}-*_{pid}.log"))
    return found[0] if found else None


def job_timeline(job: dict, actors: list[dict], temp_dir: str, runs: Path) -> dict:
    """Seconds from the admission to each stage of the job's only attempt."""
    from core.metrics_log import read_metrics

    history = {e["event"]: e["time"] for e in job["history"]}
    zero, end = history["admitted"], history["succeeded"]
    stages = {"queued": history["queued"] - zero}
    name = f"{job['id']}-a{job['attempt']}"
    controller = [a for a in actors if a["class_name"] == CONTROLLER and a.get("name") == name]
    workers = [a for a in actors if a["class_name"] == WORKER]
    for label, mine in (("attempt controller", controller), (WORKER, workers)):
        times = [process_times(log) for a in mine if a.get("pid") and (log := logs_of(temp_dir, a["pid"]))]
        # the run's workers came up between its admission and its end (the jobs run one at a time)
        times = [t for t in times if zero <= t["process"] <= end]
        if times:
            stages[f"{label} process up (last of {len(times)})"] = max(t["process"] for t in times) - zero
            done = [t["constructed"] for t in times if "constructed" in t]
            if done:
                stages[f"{label} constructed (last)"] = max(done) - zero
    steps = [r["time"] for r in read_metrics(str(runs / job["run"])) if "loss" in r]
    stages["first logged step"] = steps[0] - zero
    stages["'running' in the record"] = history["running"] - zero
    stages["last logged step"] = steps[-1] - zero
    stages["'succeeded' in the record"] = end - zero
    log = logs_of(temp_dir, controller[0]["pid"]) if controller else None
    if log:
        stages["attempt controller's last log line"] = process_times(log)["last"] - zero
    return stages


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from orchestrator.testing.local_cluster import start_ray_head, state_api, stop_ray_head

    tmp = Path(tempfile.mkdtemp(prefix="bench-start-"))
    home, store, runs = tmp / "home", tmp / "store", tmp / "runs"
    head = start_ray_head(num_cpus=4, resources={"slot": 1})
    env = {**os.environ, **head.env, "ORCHESTRATOR_HOME": str(home)}

    def cli(*argv):
        command = [sys.executable, "-m", "orchestrator", *argv]
        return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)

    timelines = []
    try:
        for name, (cpus, slots) in NODES.items():
            head.add_node(name, cpus, {"slot": slots})
        up = cli(
            *("up", "--address", head.address, "--store", str(store), "--metrics-port", "0"),
            *("--shared-storage", str(runs)),
        )
        if up.returncode != 0:
            sys.exit(f"orchestrator up failed: {up.stdout}{up.stderr}")
        os.environ.update(head.env)
        for i in range(args.jobs):
            sets = ["resources.custom_per_worker.slot=1", f"train.steps={args.steps}", "metrics.log_every=5"]
            sets += [f"checkpoint.storage={runs}", f"name=start-{i}"]
            done = cli("submit", "jobs/convnet.yaml", *(a for s in sets for a in ("--set", s)), "--wait")
            if done.returncode != 0:
                sys.exit(f"job {i} failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
            job_id = done.stdout.split()[0]
            job = json.loads((store / "jobs" / f"{job_id}.json").read_text())
            time.sleep(2)  # `--wait` returns at `succeeded`; the controller ends a moment later
            actors = state_api(head.dashboard, head.env, "actors", detail="true")
            timeline = job_timeline(job, actors, head.temp_dir, runs)
            timelines.append(timeline)
            print(f"job {i}: " + ", ".join(f"{k} {v:.1f}" for k, v in timeline.items()), flush=True)
        cli("down")
    finally:
        stop_ray_head(head)
    report(timelines, args)
    return 0


def report(timelines: list[dict], args) -> None:
    stages = list(dict.fromkeys(k for t in timelines for k in t))
    medians = {s: statistics.median(t[s] for t in timelines if s in t) for s in stages}
    print(f"\nseconds from the admission, median of {len(timelines)} jobs ({args.steps} steps each):")
    for stage, value in medians.items():
        print(f"  {value:7.2f}  {stage}")
    from bench.provenance import provenance

    RESULTS.write_text(json.dumps({**provenance(), "median_s": medians, "jobs": timelines}, indent=1))
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    sys.exit(main())
