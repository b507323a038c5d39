"""Where a command's CPU goes on this machine, by kind of process: the test suite, mostly.

    python bench/cpu_by_process.py --out suite-cpu.json -- ./scripts/test.sh

Runs COMMAND and, while it runs, reads every process of the machine each second (/proc, via
psutil), naming each by kind: a Ray worker by its title (`ray::RayTrainWorker`,
`ray::AttemptController`, `ray::IDLE` while it boots into an actor), Ray's own processes by
name (raylet, gcs_server, dashboard, agents), pytest's workers, torchrun's ranks, the product's
CLI, the test servers (MLflow, moto, Prometheus, Chromium). A kind is read again at each sample,
so a Ray worker's boot counts as `ray:default_worker`/`ray::IDLE` and its work under its actor's
title. Printed at the end: CPU seconds by kind, their sum, the wall time, and the machine's pace
measured before and after (`pace()`); the JSON has the same. Ground truth from the kernel's
counters; a process that lives under a second is missed (the CLI's quickest calls), and so is
what ran before the command started.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time

import psutil

SAMPLE_S = 1.0
RAY_PARTS = ("raylet", "gcs_server", "dashboard/agent", "dashboard.py", "runtime_env", "log_monitor")
RAY_PARTS += ("monitor.py", "client.server")
XDIST_WORKER = "import sys;exec(eval(sys.stdin.readline()))"  # pytest-xdist's worker (execnet)
SERVERS = {"moto": "moto", "prometheus": "prometheus", "mlflow": "mlflow", "redis": "redis"}


def kind_of(name: str, command: str) -> str:
    title = command if command.startswith("ray::") else name
    if title.startswith("ray::"):  # a Ray worker: `ray::<Class>[.<method>]`
        return title.split()[0].split(".")[0]
    if "default_worker.py" in command:
        return "ray:default_worker"  # a Ray worker booting, before its title
    for part in RAY_PARTS:
        if part in command:
            return f"ray:{part}"
    words = command.split()
    if "-m" in words and "pytest" in words or XDIST_WORKER in command:
        return "pytest"
    if "torch.distributed.run" in command or "torchrun" in command or "workers.run" in command:
        return "torchrun"
    if "-u" in words[1:2] and words[2:3] != ["-c"]:  # a rank torchrun started: `python -u SCRIPT`
        return "torchrun"
    if "-m" in words and "orchestrator" in words:
        return "orchestrator (the CLI)"
    for word, kind in SERVERS.items():
        if word in command:
            return kind
    return "chromium" if "chrom" in command else name


def sample(seen: dict, spent: collections.Counter, since: float) -> None:
    """Add what each process spent since its last reading to its kind (as named now)."""
    alive = set()
    for p in psutil.process_iter():
        try:
            key = (p.pid, p.create_time())
            times = p.cpu_times()
            kind = "this script" if p.pid == os.getpid() else kind_of(p.name(), " ".join(p.cmdline()))
        except psutil.Error:
            continue
        alive.add(key)
        cpu = times.user + times.system
        last = seen.get(key, 0.0 if key[1] >= since else cpu)  # older processes: from now on
        spent[kind] += cpu - last
        seen[key] = cpu
    for key in set(seen) - alive:
        del seen[key]


def pace(seconds: float = 2.0) -> float:
    """Millions of loop iterations per CPU second of this process: the machine's speed just
    now. A VM's vCPU runs at another pace from hour to hour (its host's load), so the same
    work costs other CPU seconds; the pace before and after tells runs of other hours apart."""
    start, n = time.process_time(), 0
    while time.process_time() - start < seconds:
        for _ in range(100_000):
            n += 1
    return n / (time.process_time() - start) / 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the figures to this JSON file too")
    parser.add_argument("--pace-s", type=float, default=2.0, help="CPU seconds of each pace reading")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    pace_before = pace(args.pace_s)
    started = time.time()
    seen: dict = {}
    spent: collections.Counter = collections.Counter()
    sample(seen, spent, started)
    spent.clear()  # what ran before the command is not its
    process = subprocess.Popen(command)
    while process.poll() is None:
        time.sleep(SAMPLE_S)
        sample(seen, spent, started)
    wall = time.time() - started
    spent = +spent
    total = sum(spent.values())
    pace_after = pace(args.pace_s)
    ran = f"{' '.join(command)}: exit {process.returncode}, {wall:.0f} s"
    print(f"{ran}, {total:.0f} CPU s ({total / wall:.2f} cores)")
    print(f"pace: {pace_before:.1f} before, {pace_after:.1f} after (million loop steps per CPU second)")
    for kind, seconds in spent.most_common(25):
        print(f"  {seconds:8.1f}  {kind}")
    if args.out:
        figures = {"command": command, "exit": process.returncode, "wall_s": round(wall, 1)}
        figures["pace"] = {"before": round(pace_before, 2), "after": round(pace_after, 2)}
        figures["cpu_s"] = {kind: round(s, 1) for kind, s in spent.most_common()}
        with open(args.out, "w") as out:
            json.dump(figures, out, indent=1)
    return process.returncode


if __name__ == "__main__":
    sys.exit(main())
