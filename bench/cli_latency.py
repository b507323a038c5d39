"""How long the CLI takes to answer with the service up, and whether it leaves rows in Ray's job
list: `queue` and `status ID` read the service's HTTP API when `orchestrator up` recorded it
here; with `--address` they join the cluster as a Ray driver (the way before, and still the
way to a cluster `up` did not record on this machine). Same cluster, same service, same run.

    python bench/cli_latency.py [--repeats 5]

Prints each command's median wall time (the whole process, as a person waits for it) by both
ways and their ratio, the Ray job rows each way adds, and `submit` of a small spec; writes
bench/results/cli_latency.json.
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
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    from provenance import provenance  # bench/provenance.py (this script's folder is on sys.path)

    from tests.conftest import start_ray_head, stop_ray_head

    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    repeats = parser.parse_args().repeats
    head = start_ray_head(num_cpus=2)
    tmp = Path(tempfile.mkdtemp())
    env = {**os.environ, "PYTHONPATH": str(ROOT), **head.env, "ORCHESTRATOR_HOME": str(tmp / "home")}

    def cli(*args) -> float:
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "orchestrator", *args], cwd=ROOT, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-2000:]
        cli.last = done.stdout
        return time.perf_counter() - start

    def rows() -> int:
        token = Path(head.env["RAY_AUTH_TOKEN_PATH"]).read_text().strip()
        request = urllib.request.Request(
            f"{head.dashboard}/api/jobs/", headers={"Authorization": f"Bearer {token}"}
        )
        with urllib.request.urlopen(request, timeout=30) as reply:
            return len(json.load(reply))

    try:
        cli("up", "--address", head.address, "--store", str(tmp / "store"), "--metrics-port", "0")
        small = ["jobs/convnet.yaml", "--set", "train.steps=5", "--set", f"checkpoint.storage={tmp / 'runs'}"]
        submit_s = [cli("submit", *small, "--set", f"name=latency-{i}") for i in range(repeats)]
        job_id = cli.last.split()[0]
        ways = {"http": [], "ray": ["--address", head.address]}
        result = {"repeats": repeats, "submit_s": statistics.median(submit_s)}
        for command in (["queue"], ["status", job_id]):
            name = command[0]
            for way, extra in ways.items():
                before = rows()
                times = [cli(*command, *extra) for _ in range(repeats)]
                result[f"{name}_{way}_s"] = statistics.median(times)
                result[f"{name}_{way}_ray_job_rows_added"] = rows() - before
            result[f"{name}_ray_over_http"] = result[f"{name}_ray_s"] / result[f"{name}_http_s"]
        cli("down")
    finally:
        stop_ray_head(head)
    load = os.getloadavg()[0]
    result = {**provenance(), "load_average_1m_at_end": load, **result}
    for name in ("queue", "status"):
        print(
            f"{name}: {result[f'{name}_http_s']:.2f} s over HTTP, {result[f'{name}_ray_s']:.2f} s as a Ray "
            f"driver (x{result[f'{name}_ray_over_http']:.1f}); Ray job rows added per {repeats} calls: "
            f"{result[f'{name}_http_ray_job_rows_added']} vs {result[f'{name}_ray_ray_job_rows_added']}"
        )
    print(f"submit (a small spec, checked against the model registry): {result['submit_s']:.2f} s")
    (ROOT / "bench/results/cli_latency.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
