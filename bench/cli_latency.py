"""How long the CLI takes to answer with the service up, and whether it leaves rows in Ray's job
list: `submit`, `queue` and `status ID` talk to the service's HTTP API when `orchestrator up`
recorded it here; with `--address` they join the cluster as a Ray driver (the way before, and
still the way to a cluster `up` did not record on this machine). Same cluster, same service,
same run.

    python bench/cli_latency.py [--repeats 5]
    python bench/cli_latency.py --running 4 --queued 200   # under load: jobs training, a queue

Prints each command's median wall time (the whole process, as a person waits for it) by both
ways and their ratio, and the Ray job rows each way adds; writes bench/results/cli_latency.json.
`submit` sends jobs/vit.yaml (the main job, checked against the model registry) with 5 steps.
With `--running N --queued M`, N one-worker jobs train on the head (given N CPUs, whatever the
machine has) and M more wait behind them (submitted four at a time) before anything is timed;
each timed command then also reports its 90th percentile. Each command's CPU time (user +
system, from the kernel's account of the child) is printed beside its wall time: on a loaded
head the gap between them is the CPU the command waited for. Results go to
bench/results/cli_latency[-loaded].json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    from provenance import provenance  # bench/provenance.py (this script's folder is on sys.path)

    from orchestrator.testing.local_cluster import start_ray_head, stop_ray_head

    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--running", type=int, default=0, help="jobs training while it measures")
    parser.add_argument("--queued", type=int, default=0, help="jobs waiting while it measures")
    args = parser.parse_args()
    repeats = args.repeats
    head = start_ray_head(num_cpus=max(2, args.running))
    tmp = Path(tempfile.mkdtemp())
    env = {**os.environ, "PYTHONPATH": str(ROOT), **head.env, "ORCHESTRATOR_HOME": str(tmp / "home")}

    def cli(*args) -> float:
        """The command's wall time; its CPU time (user + system) in `cli.cpu` (one at a time)."""
        start, used = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(
            [sys.executable, "-m", "orchestrator", *args], cwd=ROOT, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-2000:]
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cli.last, cli.cpu = done.stdout, after.ru_utime + after.ru_stime - used.ru_utime - used.ru_stime
        return time.perf_counter() - start

    def rows(command: str) -> int:
        """Ray's job rows of CLI processes that ran `command` (the jobs' own drivers not counted)."""
        token = Path(head.env["RAY_AUTH_TOKEN_PATH"]).read_text().strip()
        request = urllib.request.Request(
            f"{head.dashboard}/api/jobs/", headers={"Authorization": f"Bearer {token}"}
        )
        with urllib.request.urlopen(request, timeout=30) as reply:
            listed = json.load(reply)
        words = [(row.get("entrypoint") or "").split() for row in listed if row.get("type") == "DRIVER"]
        return sum(1 for w in words if command in w and any("orchestrator" in part for part in w))

    try:
        cli("up", "--address", head.address, "--store", str(tmp / "store"), "--metrics-port", "0")
        small = [
            "jobs/vit.yaml",
            "--set",
            "train.epochs=null",
            "--set",
            "train.steps=5",
            "--set",
            f"checkpoint.storage={tmp / 'runs'}",
        ]
        ways = {"http": [], "ray": ["--address", head.address]}
        result = {"repeats": repeats, "running": args.running, "queued": args.queued}
        if args.running or args.queued:
            result["load_setup_s"] = load_the_service(cli, env, tmp, args.running, args.queued)
        names = iter(range(1000))
        job_id = None

        def command(name: str) -> list[str]:
            if name == "submit":  # a new job each time (one name, one run)
                return ["submit", *small, "--set", f"name=latency-{next(names)}"]
            return ["status", job_id] if name == "status" else [name]

        for name in ("submit", "queue", "status"):
            for way, extra in ways.items():
                before = rows(name)
                times, cpu = [], []
                for _ in range(repeats):
                    times.append(cli(*command(name), *extra))
                    cpu.append(cli.cpu)
                    job_id = cli.last.split()[0] if name == "submit" else job_id
                result[f"{name}_{way}_s"] = statistics.median(times)
                result[f"{name}_{way}_cpu_s"] = statistics.median(cpu)
                result[f"{name}_{way}_p90_s"] = sorted(times)[int(0.9 * (len(times) - 1))]
                result[f"{name}_{way}_ray_job_rows_added"] = rows(name) - before
            result[f"{name}_ray_over_http"] = result[f"{name}_ray_s"] / result[f"{name}_http_s"]
        cli("down")
    finally:
        stop_ray_head(head)
    load = os.getloadavg()[0]
    result = {**provenance(), "load_average_1m_at_end": load, **result}
    if args.running or args.queued:
        ready = result["load_setup_s"]
        print(f"with {args.running} jobs training and {args.queued} waiting (ready after {ready:.0f} s):")
    for name in ("submit", "queue", "status"):
        print(
            f"{name}: {result[f'{name}_http_s']:.2f} s over HTTP (p90 {result[f'{name}_http_p90_s']:.2f}, "
            f"CPU {result[f'{name}_http_cpu_s']:.2f} s), "
            f"{result[f'{name}_ray_s']:.2f} s as a Ray "
            f"driver (x{result[f'{name}_ray_over_http']:.1f}); Ray job rows added per {repeats} calls: "
            f"{result[f'{name}_http_ray_job_rows_added']} vs {result[f'{name}_ray_ray_job_rows_added']}"
        )
    loaded = "-loaded" if args.running or args.queued else ""
    (ROOT / f"bench/results/cli_latency{loaded}.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


def _submit(env: dict, args: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "submit", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]


def load_the_service(cli, env: dict, tmp: Path, running: int, queued: int) -> float:
    """`running` one-worker jobs training (their first step reported), `queued` more waiting
    behind them; returns how long that took."""
    started = time.perf_counter()
    tiny = ["jobs/convnet.yaml", "--set", "resources.num_workers=1", "--set", "resources.cpus_per_worker=1"]
    tiny += ["--set", f"checkpoint.storage={tmp / 'load'}", "--set", "train.steps=1000000"]
    trains = []
    for i in range(running):
        cli("submit", *tiny, "--set", f"name=trains-{i}")
        trains.append(cli.last.split()[0])
    with ThreadPoolExecutor(4) as pool:  # four users at a time (CPU times are not read here)
        list(pool.map(lambda i: _submit(env, [*tiny, "--set", f"name=waits-{i}"]), range(queued)))
    deadline = time.time() + 600
    while time.time() < deadline:
        if not trains or all(_trained(cli, job_id) for job_id in trains):
            return time.perf_counter() - started
        time.sleep(2)
    raise TimeoutError(f"{running} jobs did not all report a step within 10 minutes")


def _trained(cli, job_id: str) -> bool:
    cli("status", job_id)
    return cli.last.startswith(f"{job_id}: running") and "step:       0/" not in cli.last


if __name__ == "__main__":
    raise SystemExit(main())
