"""The CPU one attempt of a job costs the machine, by process, against its workers' training.

    python bench/attempt_cpu.py                  # 3 rounds of a 2-worker job, 30 steps
    python bench/attempt_cpu.py --workers 1 --steps 30 --rounds 5

A three-node test cluster on this machine (orchestrator/testing/local_cluster.py: a head with 4
CPUs and a node with 2, each with one `slot`, and a second node), `orchestrator up --address`
on it, then, round by round, one job (jobs/convnet.yaml) submitted with `--wait`. The
cluster's processes (each node's `ray start` and all it started) and the commands this script
runs are read every 0.2 s while a round runs (so the ones that end in it count too), and the
CPU seconds each spent in the round are summed by kind: a Ray worker by its
title (`ray::<Class>`: the training workers, the attempt's controller, the service), Ray's own
processes by name, the command (`orchestrator submit`). Printed per round: the seconds by kind,
their sum, and the workers' share. Ground truth from /proc, not from any report of the job's.
This script's own sampling is left out, and so is anything else the machine runs.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_S = 0.2


def kind_of(name: str, command: str) -> str:
    title = command if command.startswith("ray::") else name
    if title.startswith("ray::"):  # a Ray worker: `ray::<Class>[.<method>]`
        return title.split()[0].removeprefix("ray::").split(".")[0]
    if "-m orchestrator" in command:
        return "orchestrator (the command)"
    for ray_part in ("raylet", "gcs_server", "dashboard", "log_monitor", "monitor.py", "client.server"):
        if ray_part in command or ray_part in name:
            return ray_part
    return name


def processes(roots: list[int]) -> dict[int, tuple[str, float, float]]:
    """pid -> (kind, CPU seconds so far, start time) of the cluster's processes (the
    descendants of each node's `ray start`) and this script's commands (its children)."""
    found = {}
    for root in roots:
        try:
            tree = psutil.Process(root).children(recursive=True)
        except psutil.Error:
            continue
        for p in tree:
            try:
                times = p.cpu_times()
                command = " ".join(p.cmdline())
                found[p.pid] = (kind_of(p.name(), command), times.user + times.system, p.create_time())
            except psutil.Error:
                pass
    return found


def spent_during(action, roots: list[int]) -> collections.Counter:
    """CPU seconds by kind that those processes spent while `action()` ran (a process that
    ended meanwhile counts with its last reading)."""
    before, seen, done = processes(roots), {}, threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.update(processes(roots))
            time.sleep(SAMPLE_S)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        action()
        time.sleep(2)  # the attempt's processes end after the job's record says so
    finally:
        done.set()
        watcher.join()
    seen.update(processes(roots))
    spent = collections.Counter()
    for pid, (kind, cpu, started) in seen.items():
        old = before.get(pid)
        spent[kind] += cpu - (old[1] if old and old[2] == started else 0.0)
    return spent


def submitted(done: subprocess.CompletedProcess) -> None:
    if done.returncode != 0:
        sys.exit(f"the job failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from orchestrator.testing.local_cluster import start_ray_head, stop_ray_head

    tmp = Path(tempfile.mkdtemp(prefix="bench-attempt-cpu-"))
    head = start_ray_head(num_cpus=4, resources={"slot": 1})
    env = {**os.environ, **head.env, "ORCHESTRATOR_HOME": str(tmp / "home")}

    def cli(*argv: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "orchestrator", *argv]
        return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)

    try:
        for name in ("node-1", "node-2"):
            head.add_node(name, 2, {"slot": 1})
        runs = tmp / "runs"  # the machine's disk, which every node sees: declared shared
        up = cli(
            *("up", "--address", head.address, "--store", str(tmp / "store"), "--metrics-port", "0"),
            *("--shared-storage", str(runs)),
        )
        if up.returncode != 0:
            sys.exit(f"orchestrator up failed: {up.stdout}{up.stderr}")
        sets = {
            "resources.num_workers": args.workers,
            "resources.custom_per_worker.slot": 1,
            "train.steps": args.steps,
            "checkpoint.storage": runs,
        }
        print(f"{args.workers}-worker job, {args.steps} steps, CPU seconds by process kind:")
        for n in range(args.rounds):
            argv = ["submit", "jobs/convnet.yaml", "--wait", "--set", f"name=round-{n}"]
            argv += [a for key, value in sets.items() for a in ("--set", f"{key}={value}")]
            roots = [os.getpid(), head.process.pid, *(node.process.pid for node in head.nodes)]
            spent = spent_during(lambda argv=argv: submitted(cli(*argv)), roots)
            spent = +spent  # only what moved
            total, workers = sum(spent.values()), spent["RayTrainWorker"]
            parts = ", ".join(f"{kind} {s:.2f}" for kind, s in spent.most_common(10))
            print(
                f"  round {n}: {total:.1f} s in all, workers {workers:.1f} ({workers / total:.0%}): {parts}"
            )
        cli("down")
    finally:
        stop_ray_head(head)
    return 0


if __name__ == "__main__":
    sys.exit(main())
