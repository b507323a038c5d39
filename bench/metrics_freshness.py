"""How fresh, and at what cost, training metrics reach Prometheus by the two routes Ray offers.

    python bench/metrics_freshness.py

1. `ray.util.metrics` from the training process: each node's metrics agent exports them, and
   Prometheus finds the agents through Ray's service discovery file. Measured here: the cost
   of one `Gauge.set` in a Ray actor, and the time from setting a new value until it shows on
   the node's metrics endpoint.
2. The orchestrator service's exporter (`/metrics`): rank 0's records reach the service
   through the run's state actor and the driver's reports, which the training process already
   makes for the metrics log. Measured here: on a real 2-worker job, the age of the newest
   record at each scrape (`time() - orchestrator_train_record_time_seconds`).

Writes bench/results/metrics_freshness.json.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def ray_util_metrics(head) -> dict:
    code = f"""
import json, time, urllib.request, ray
from ray.util.metrics import Gauge
ray.init(address="{head.address}", logging_level="ERROR")

@ray.remote(num_cpus=0)
class Worker:
    def __init__(self):
        self.gauge = Gauge("freshness_probe", description="probe", tag_keys=("job",))
    def cost(self, n):
        start = time.perf_counter()
        for i in range(n):
            self.gauge.set(float(i), tags={{"job": "probe"}})
        return (time.perf_counter() - start) / n
    def set(self, value):
        self.gauge.set(value, tags={{"job": "probe"}})
        return time.time()

w = Worker.remote()
cost = ray.get(w.cost.remote(10000))
port = {head.metrics_port}
lags = []
for value in (1e6, 2e6, 3e6):
    t0 = ray.get(w.set.remote(value))
    while time.time() - t0 < 60:
        text = urllib.request.urlopen(f"http://127.0.0.1:{{port}}/metrics", timeout=5).read().decode()
        lines = [l for l in text.splitlines() if "freshness_probe" in l and not l.startswith("#")]
        if any(float(l.split()[-1]) == value for l in lines):  # printed as 1e+06 or 1000000.0
            lags.append(time.time() - t0)
            break
        time.sleep(0.1)
print(json.dumps({{"set_us": cost * 1e6, "lags_s": lags}}))
"""
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **head.env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    if out.returncode != 0:
        sys.exit(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def service_exporter(head, tmp: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **head.env, "ORCHESTRATOR_HOME": str(tmp / "home")}

    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "orchestrator", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    up = cli("up", "--address", head.address, "--store", str(tmp / "store"), "--metrics-port", "0")
    assert up.returncode == 0, up.stderr
    page = json.loads((tmp / "home" / "cluster.json").read_text())["status_page"]
    sub = cli(
        "submit",
        "jobs/convnet.yaml",
        "--set",
        "train.steps=100000",
        "--set",
        f"checkpoint.storage={tmp}",
        "--set",
        "metrics.log_every=1",
    )
    job = sub.stdout.split()[0]
    ages = []
    try:
        deadline = time.time() + 300
        while time.time() < deadline and len(ages) < 60:
            text = urllib.request.urlopen(f"{page}metrics", timeout=5).read().decode()
            for line in text.splitlines():
                if line.startswith("orchestrator_train_record_time_seconds") and job in line:
                    ages.append(time.time() - float(line.split()[-1]))
            time.sleep(0.5)
    finally:
        cli("stop", job, "--now")
        cli("down")
    return {"ages_s": ages}


def main() -> int:
    from provenance import provenance  # bench/provenance.py (this script's folder is on sys.path)

    from orchestrator.testing.local_cluster import start_ray_head, stop_ray_head

    head = start_ray_head(num_cpus=4)
    try:
        # the head's own metrics agent port, as the test helper chose it
        found = re.search(r"--metrics-export-port=(\d+)", " ".join(head.process.args))
        head.metrics_port = int(found.group(1))
        ray_side = ray_util_metrics(head)
        with tempfile.TemporaryDirectory() as tmp:
            ours = service_exporter(head, Path(tmp))
    finally:
        stop_ray_head(head)
    result = {
        **provenance(),
        "ray_util_metrics": {"gauge_set_us": ray_side["set_us"], "visible_after_s": ray_side["lags_s"]},
        "service_exporter": {
            "record_age_at_scrape_s": {
                "median": statistics.median(ours["ages_s"]),
                "p90": sorted(ours["ages_s"])[int(0.9 * len(ours["ages_s"]))],
                "max": max(ours["ages_s"]),
                "scrapes": len(ours["ages_s"]),
            }
        },
    }
    print(json.dumps(result, indent=2))
    (ROOT / "bench/results/metrics_freshness.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
