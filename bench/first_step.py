"""From submission to the first training step, through the service and under torchrun, same run.

    python bench/first_step.py               # 3 pairs, 1-worker convnet jobs
    python bench/first_step.py --pairs 5

A one-node cluster of this machine's CPUs (`orchestrator/testing/local_cluster.py`: `ray start
--head`, Ray's defaults), `orchestrator up --address` on it, then, in pairs and alternating
which goes first, the same 1-worker job (jobs/convnet.yaml, `resources.num_workers=1`):

- `orchestrator submit` (the clock starts before the CLI starts), to its first step;
- `torchrun --nproc_per_node=1 -m workers.run` of the same spec, to its first step.

Each stage is read from what the party that reached it recorded, not from the service's
account of itself: the submit command's return (this script), the admission (the job's record
in the store), the attempt controller's and the worker's processes (Ray's actor table and each
process's start time from the kernel), the worker's own `startup` in its summary (its
process group, its data, its model, its first step), and, inside Ray's processes, Ray's own
task events (`ray.timeline()`: the controller constructed, its run, the service's admission
call, the worker constructed, its Ray Train context, its process group joined). Printed: each
stage's median seconds from the start, and the ratio of the medians of the first step (goal:
at most 1.5).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "first_step.json"
GOAL = 1.5  # issue 49: submission to first step at most 1.5x torchrun's
WORKER_STAGES = (
    "process",
    "training_function",
    "loop_imported",
    "process_group",
    "data",
    "model",
    "first_step",
)


def job_sets(runs: Path, name: str, steps: int) -> list[str]:
    return [
        "resources.num_workers=1",
        f"train.steps={steps}",
        "metrics.log_every=1",
        f"checkpoint.storage={runs}",
        f"name={name}",
    ]


def with_sets(sets: list[str]) -> list[str]:
    return [arg for s in sets for arg in ("--set", s)]


def worker_stages(summary: dict, zero: float) -> dict[str, float]:
    startup = summary.get("startup") or {}
    return {f"worker {stage}": startup[stage] - zero for stage in WORKER_STAGES if stage in startup}


def through_service(cli, store: Path, runs: Path, name: str, steps: int, actors) -> dict:
    zero = time.time()
    ZEROS.append(zero)
    sent = cli("submit", "jobs/convnet.yaml", *with_sets(job_sets(runs, name, steps)))
    stages = {"submit returned": time.time() - zero}
    if sent.returncode != 0:
        sys.exit(f"submit failed: {sent.stdout}{sent.stderr}")
    job_id = sent.stdout.split()[0]
    record = store / "jobs" / f"{job_id}.json"
    while True:  # the job's record in the store, until the job ended
        job = json.loads(record.read_text())
        if job["state"] in ("succeeded", "failed", "stopped"):
            break
        time.sleep(0.5)
    if job["state"] != "succeeded":
        sys.exit(f"{name} {job['state']}: {job.get('summary', {}).get('reason')}")
    history = {e["event"]: e["time"] for e in job["history"]}
    stages["admitted"] = history["admitted"] - zero
    for label, started in actors(f"{job_id}-a1"):
        stages[f"{label} process"] = started - zero
    stages.update(worker_stages(job["summary"], zero))
    return stages


def under_torchrun(runs: Path, name: str, steps: int) -> dict:
    summary = runs / f"{name}-summary.json"
    command = ["torchrun", "--nproc_per_node=1", "-m", "workers.run", "jobs/convnet.yaml"]
    command += [*with_sets(job_sets(runs, name, steps)), "--summary", str(summary)]
    zero = time.time()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        sys.exit(f"torchrun failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    return worker_stages(json.loads(summary.read_text()), zero)


def process_start(pid: int) -> float:
    """A process's start, from the kernel: seconds since boot in /proc, to the wall clock."""
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    boot = next(float(line.split()[1]) for line in open("/proc/stat") if line.startswith("btime"))
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from orchestrator.testing.local_cluster import start_ray_head, state_api, stop_ray_head

    tmp = Path(tempfile.mkdtemp(prefix="bench-first-step-"))
    home, store, runs = tmp / "home", tmp / "store", tmp / "runs"
    head = start_ray_head(num_cpus=os.cpu_count())
    env = {**os.environ, **head.env, "ORCHESTRATOR_HOME": str(home)}

    def cli(*argv):
        command = [sys.executable, "-m", "orchestrator", *argv]
        return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)

    def actors(controller_name: str):
        """(label, process start) of the attempt's controller and its newest worker, from Ray's actor table;
        their processes are alive until the attempt ends, so they are read while it runs."""
        return pids.get(controller_name, [])

    pids: dict[str, list] = {}
    service, torchrun = [], []
    try:
        up = cli("up", "--address", head.address, "--store", str(store), "--metrics-port", "0")
        if up.returncode != 0:
            sys.exit(f"orchestrator up failed: {up.stdout}{up.stderr}")
        os.environ.update(head.env)
        watcher = ActorWatcher(lambda: state_api(head.dashboard, head.env, "actors", detail="true"), pids)
        watcher.start()
        for i in range(args.pairs):
            order = ("service", "torchrun") if i % 2 == 0 else ("torchrun", "service")
            for kind in order:
                if kind == "service":
                    stages = through_service(cli, store, runs, f"svc-{i}", args.steps, actors)
                    service.append(stages)
                else:
                    torchrun.append(under_torchrun(runs, f"tr-{i}", args.steps))
                print(
                    f"pair {i} {kind}: " + fmt(service[-1] if kind == "service" else torchrun[-1]), flush=True
                )
        watcher.stop()
        add_ray_stages(service, head.address)
        cli("down")
    finally:
        stop_ray_head(head)
    report(service, torchrun, args)
    return 0


class ActorWatcher:
    """Ray's actor table read every 0.2 s on a thread: the pid of each attempt's controller and
    of the worker it started (a worker's name is empty; its owner is the controller)."""

    def __init__(self, read, pids: dict):
        import threading

        self.read, self.pids, self.done = read, pids, threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.done.set()
        self.thread.join()

    def _loop(self) -> None:
        while not self.done.wait(0.2):
            try:
                self._look(self.read())
            except Exception:  # the table's read, or a process that has just ended
                continue

    def _look(self, table: list[dict]) -> None:
        for controller in (a for a in table if a["class_name"] == "AttemptController"):
            found = self.pids.setdefault(controller.get("name"), [])
            if not found and controller.get("pid"):
                found.append(("controller", process_start(controller["pid"])))
            since = controller.get("start_time") or 0
            workers = [
                a
                for a in table
                if a["class_name"] == "RayTrainWorker"
                and a.get("pid")
                and (a.get("start_time") or 0) >= since
            ]
            if len(found) == 1 and workers:
                newest = max(workers, key=lambda a: a.get("start_time") or 0)
                found.append(("worker", process_start(newest["pid"])))


ZEROS: list[float] = []  # when each job through the service was submitted


def add_ray_stages(service: list[dict], address: str) -> None:
    """Each service job's stages inside Ray's processes, from Ray's own task events
    (`ray.timeline()`): the controller's construction and its `run`, the service's check-in
    calls, the worker's construction, its Ray Train context, and its longest call before the
    training function (the process group joined, torch imported)."""
    import ray

    ray.init(address=address, logging_level="ERROR")
    try:
        events = [e for e in ray.timeline() if e.get("ph") == "X"]
    finally:
        ray.shutdown()
    for stages, zero in zip(service, ZEROS):
        end = zero + stages["worker first_step"]
        stages.update(ray_stages([e for e in events if zero <= e["ts"] / 1e6 <= end], zero))


def ray_stages(events: list[dict], zero: float) -> dict[str, float]:
    def start(e: dict) -> float:
        return e["ts"] / 1e6 - zero

    def end(e: dict) -> float:
        return (e["ts"] + e["dur"]) / 1e6 - zero

    by_worker: dict[str, list[dict]] = {}
    for e in events:
        by_worker.setdefault(e["tid"], []).append(e)

    def worker_with(named) -> list[dict]:  # the events of the process that ran a call so named
        return next((es for es in by_worker.values() if any(named(e["name"]) for e in es)), [])

    def first(mine: list[dict], named, at=end) -> float:
        return min(at(e) for e in mine if named(e["name"]))

    stages = {}
    controller = worker_with(lambda name: "AttemptController.run" in name)
    if controller:
        stages["ray: controller constructed"] = first(controller, lambda name: name == "__init__")
        run = first(controller, lambda name: "AttemptController.run" in name, at=start)
        stages["ray: controller's run started"] = run
    admission = [e for e in events if e["name"] == "admission"]
    if admission:
        stages["ray: checked in (the service's admission call)"] = end(admission[0])
    worker = worker_with(lambda name: name == "init_train_context")
    if worker:
        stages["ray: worker constructed"] = first(worker, lambda name: name == "__init__")
        stages["ray: worker's train context set"] = first(worker, lambda name: name == "init_train_context")
        calls = [e for e in worker if e["name"] == "execute"]
        if calls:
            longest = max(calls, key=lambda e: e["dur"])
            stages["ray: worker's process group joined (torch imported)"] = end(longest)
    return stages


def fmt(stages: dict) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in stages.items())


def report(service: list[dict], torchrun: list[dict], args) -> None:
    def medians(runs: list[dict]) -> dict:
        keys = list(dict.fromkeys(k for r in runs for k in r))
        return {k: statistics.median(r[k] for r in runs if k in r) for k in keys}

    through, alone = medians(service), medians(torchrun)
    ratio = through["worker first_step"] / alone["worker first_step"]
    print(f"\nseconds from the start, median of {args.pairs} of each (1 worker, {args.steps} steps):")
    print("  through the service (orchestrator submit):")
    for stage, value in sorted(through.items(), key=lambda item: item[1]):
        print(f"    {value:6.2f}  {stage}")
    print("  under torchrun:")
    for stage, value in alone.items():
        print(f"    {value:6.2f}  {stage}")
    first, first_alone = through["worker first_step"], alone["worker first_step"]
    print(f"first step: service {first:.2f} s, torchrun {first_alone:.2f} s")
    print(f"ratio {ratio:.2f}x torchrun (goal at most {GOAL}x): {'met' if ratio <= GOAL else 'missed'}")
    from bench.provenance import provenance

    out = {**provenance(), "command": " ".join(["bench/first_step.py", *sys.argv[1:]])}
    out.update(
        ratio=ratio,
        goal=GOAL,
        service=service,
        torchrun=torchrun,
        medians={"service": through, "torchrun": alone},
    )
    RESULTS.write_text(json.dumps(out, indent=1))
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    sys.exit(main())
