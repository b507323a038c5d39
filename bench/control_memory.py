"""What a running job costs the cluster's memory outside its training workers: head and job nodes.

    python bench/control_memory.py                    # 0, 1, 4 and 8 running jobs
    python bench/control_memory.py --jobs 0,1,2 --settle 10
    python bench/control_memory.py --one-node         # the head alone, the jobs on it

A multi-node test cluster on this machine (orchestrator/testing/local_cluster.py): a head with
2 CPUs and no `slot`, so no job's workers land there, and two worker nodes with 4 CPUs and 4
slots each; `orchestrator up --address` on it. Then tiny one-worker jobs (jobs/convnet.yaml, 1 slot each,
steps enough to outlast the benchmark) are submitted until 1, then 4, then 8 run. At each
level, once every job has reported its first step and `--settle` seconds passed, the
proportional memory (PSS, from /proc) of every process of each node is summed: a node's
processes are the descendants of its `ray start` (its raylet starts every worker process, and
a Ray Job's supervisor its driver, if any); with `--one-node`, the head alone holds the slots and every
job. Printed per level: each node's PSS, and the
processes by kind (the attempts' controllers, Ray Train's actors, the workers, a driver or a
Ray Jobs supervisor if one ran), with the head's slope per running job from a least-squares
fit, and what each added job brought outside its training workers (goals: 50 MiB on the head,
100 MiB on the job's node). Ground truth from `ps`, not from the service's report of itself.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "control_memory.json"
NODE_CPUS, NODE_SLOTS = 4, 4
STEPS = 1_000_000  # outlasts the benchmark; the jobs are stopped at the end
WORKER = "RayTrainWorker"  # a training worker's kind (its title: `ray::RayTrainWorker...`)


def kind_of(process: psutil.Process) -> str:
    """The process's part: a Ray worker's title is `ray::<Class>[.<method>]`."""
    try:
        command = process.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "gone"
    text = " ".join(command)
    if text.startswith("ray::"):
        return text.split()[0].removeprefix("ray::").split(".")[0]
    if "orchestrator run" in text or "orchestrator.__main__ run" in text:
        return "driver (orchestrator run)"
    return Path(command[0]).name if command else process.name()


def pss_mib(process: psutil.Process) -> float:
    try:
        return process.memory_full_info().pss / 2**20
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0.0


def node_memory(root_pid: int) -> dict[str, float]:
    """PSS in MiB by kind over the process tree of one node's `ray start`."""
    root = psutil.Process(root_pid)
    by_kind: dict[str, float] = defaultdict(float)
    for process in [root, *root.children(recursive=True)]:
        by_kind[kind_of(process)] += pss_mib(process)
    return dict(by_kind)


def records(store: Path) -> list[dict]:
    out = []
    for path in Path(store, "jobs").glob("*.json"):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):  # being rewritten: read on the next poll
            pass
    return out


def submit(cli, runs: Path, index: int) -> str:
    result = cli(
        "submit",
        "jobs/convnet.yaml",
        "--set",
        f"name=mem-{index}",
        "--set",
        "resources.num_workers=1",
        "--set",
        "resources.custom_per_worker.slot=1",
        "--set",
        f"train.steps={STEPS}",
        "--set",
        f"checkpoint.storage={runs}",
        "--set",
        "metrics.log_every=50",
    )
    if result.returncode != 0:
        sys.exit(f"submit failed: {result.stdout}{result.stderr}")
    return result.stdout.split()[0]


def wait_running(store: Path, ids: list[str], timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        jobs = {j["id"]: j for j in records(store)}
        stepping = [
            i for i in ids if i in jobs and jobs[i]["state"] == "running" and jobs[i].get("step", 0) > 0
        ]
        bad = [i for i in ids if i in jobs and jobs[i]["state"] in ("failed", "stopped", "succeeded")]
        if bad:
            sys.exit(f"job(s) ended early: {[(i, jobs[i]['state'], jobs[i].get('reason')) for i in bad]}")
        if len(stepping) == len(ids):
            return
        time.sleep(2)
    sys.exit(f"not every job was running after {timeout:.0f} s")


def slope(points: list[tuple[int, float]]) -> float:
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default="0,1,4,8", help="running jobs at each measurement, ascending")
    parser.add_argument("--settle", type=float, default=15.0, help="seconds after the last first step")
    parser.add_argument("--timeout", type=float, default=900.0, help="for each level's jobs to run")
    parser.add_argument("--one-node", action="store_true", help="the head alone, with the jobs' slots")
    args = parser.parse_args()
    levels = [int(n) for n in args.jobs.split(",")]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped"))  # the cluster goes in `finally`
    sys.path.insert(0, str(ROOT))
    from orchestrator.testing.local_cluster import start_ray_head, stop_ray_head

    tmp = Path(tempfile.mkdtemp(prefix="bench-memory-"))
    home, store, runs = tmp / "home", tmp / "store", tmp / "runs"
    head = (
        start_ray_head(num_cpus=2 * NODE_CPUS, resources={"slot": 2 * NODE_SLOTS}) if args.one_node else None
    )
    head = head or start_ray_head(num_cpus=2)
    env = {**os.environ, **head.env, "ORCHESTRATOR_HOME": str(home)}

    def cli(*argv):
        command = [sys.executable, "-m", "orchestrator", *argv]
        return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)

    measured = []
    try:
        names = [] if args.one_node else ["node-1", "node-2"]
        nodes = [head.add_node(name, NODE_CPUS, {"slot": NODE_SLOTS}) for name in names]
        up = cli(
            "up",
            "--address",
            head.address,
            "--store",
            str(store),
            "--metrics-port",
            "0",
            "--shared-storage",
            str(runs),
            "--start-deadline",
            str(args.timeout),
        )  # 8 jobs starting on 2 busy cores are slow; fmt: skip
        if up.returncode != 0:
            sys.exit(f"orchestrator up failed: {up.stdout}{up.stderr}")
        ids: list[str] = []
        for level in levels:
            ids += [submit(cli, runs, i) for i in range(len(ids), level)]
            wait_running(store, ids, args.timeout)
            time.sleep(args.settle)
            roots = {"head": head.process.pid, **{n.name: n.process.pid for n in nodes}}
            sample = {"running": level, "nodes": {name: node_memory(pid) for name, pid in roots.items()}}
            measured.append(sample)
            print(line(sample), flush=True)
        for job in ids:
            cli("stop", job, "--now")
        cli("down")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM (`timeout`'s) would stop the stop
        stop_ray_head(head)
    report(measured, RESULTS.with_name("control_memory-one-node.json") if args.one_node else RESULTS)
    return 0


def line(sample: dict) -> str:
    totals = "  ".join(f"{name} {sum(kinds.values()):7.0f} MiB" for name, kinds in sample["nodes"].items())
    return f"{sample['running']} running: {totals}"


def report(measured: list[dict], out: Path) -> None:
    head = [(s["running"], sum(s["nodes"]["head"].values())) for s in measured]
    nodes = [
        (s["running"], sum(sum(k.values()) for n, k in s["nodes"].items() if n != "head")) for s in measured
    ]
    summary = {
        "head_mib_per_running_job": slope(head) if len(head) > 1 else None,
        "job_nodes_mib_per_running_job": slope(nodes) if len(nodes) > 1 else None,
        "levels": measured,
    }
    first, top = measured[0], measured[-1]
    added = max(top["running"] - first["running"], 1)
    per_job = defaultdict(float)  # by kind, over every node: what each added running job brought
    for name, kinds in top["nodes"].items():
        for kind, mib in kinds.items():
            per_job[kind] += (mib - first["nodes"][name].get(kind, 0.0)) / added
    summary["per_job_by_kind_mib"] = dict(per_job)
    print(f"head: {summary['head_mib_per_running_job']:.0f} MiB PSS per running job (slope over {head})")
    print(f"job nodes: {summary['job_nodes_mib_per_running_job']:.0f} MiB PSS per running job")
    print(f"per added running job ({first['running']} -> {top['running']}), by kind, every node:")
    for kind, mib in sorted(per_job.items(), key=lambda item: -item[1])[:16]:
        print(f"  {kind:34s} {mib:7.0f} MiB")
    outside = sum(mib for kind, mib in per_job.items() if kind != WORKER)
    summary["outside_workers_mib_per_running_job"] = outside
    print(f"outside the job's workers, every node: {outside:.0f} MiB per running job (goal: at most 100)")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    sys.exit(main())
