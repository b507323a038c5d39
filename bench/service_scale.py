"""The orchestrator service's own bookkeeping at scale: 1,000 running jobs whose drivers report
every 2 s, and 10,000 jobs waiting in the queue (issue 30).

    python bench/service_scale.py [--running 1000] [--queued 10000] [--history 5000]

In one process, without a Ray cluster: the real `OrchestratorService` (its lock, store, policy,
lifecycle, views, status page and exporter) is handed a fake cluster (bench/service_fakes.py:
a node table the running jobs fill exactly, a runner that names drivers instead of starting
them) and a job store on local disk. The benchmark submits the jobs through `submit`, lets the
scheduling pass admit the first `--running`, sends their drivers' reports itself (each job
first reports `--history` records, as a job that ran for hours did, then
realistic 2-second reports), and measures:

    pass        one scheduling pass (`tick`), p50 and p99
    report      one driver report, p50 and p99, and reports per second
    submit      submissions per second through `submit` (store writes included), with the
                scheduling loop running as it does in the service; and spec files sent through
                the service's one way in (`submit_sent`: read, checked, storage probed,
                queued) 4 at a time into one storage path, p50 and p99 (`--at-once`)
    reads       `orchestrator queue` (the command in a process of its own, over the page's HTTP API),
                `orchestrator status ID`, GET /api/queue (the status page's first page, a search
                for the last job queued, the CLI's list and the unpaged list), GET /metrics
                (and the exporter's snapshot alone, and its text by prometheus_client's
                generate_latest and by the exporter's own `exposition`, which /metrics serves)
    memory      the process' RSS, and what this scale added to it

A small baseline (10 running / 100 queued) runs first in the same process, so the ratios show
how each figure scales. Each figure is printed against its goal: every pass and read under
1 s, reports keeping up with one every 2 s per running job, >= 20 submissions/s, a spec file
through the one way in under 0.5 s at p50 and 2 s at p99 with 4 at a time, RSS < 1 GB.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import service_fakes  # noqa: E402
from core.jobs import JobState  # noqa: E402
from core.spec import validate  # noqa: E402

GB = 2**30
HISTORY = 5000  # a job that ran for hours has logged this many records (the service kept 5,000 of them)
WAITING = 50  # waiting jobs in a page of the queue (`orchestrator queue` shows as many)
PAGE = 50  # jobs in a page of the status page's queue (app.js's PAGE_SIZE)


AT_ONCE_SPEC = """
name: at-once
model: {{family: convnet, preset: convnet_small}}
data: {{source: synthetic}}
train: {{steps: 1000}}
resources: {{num_workers: 1, gpus_per_worker: 1}}
checkpoint: {{storage: {storage}}}
"""


def spec_of(workers: int, storage: str, priority: int):
    return validate(
        {
            "name": f"scale-w{workers}",
            "model": {"family": "convnet", "preset": "tiny"},
            "data": {"source": "synthetic"},
            "train": {"steps": 1_000_000},
            "resources": {"num_workers": workers, "gpus_per_worker": 1},
            "parallel": {"strategy": "ddp" if workers > 1 else "none"},
            "checkpoint": {"storage": storage},
            "scheduling": {"priority": priority},
        }
    )


class Bench:
    """One service with `running` jobs running and `queued` waiting, and the drivers of the running."""

    def __init__(self, running: int, queued: int, history: int, tmp: Path):
        from orchestrator.service.actor import OrchestratorService

        self.running, self.queued, self.history, self.tmp = running, queued, history, tmp
        self.rss_before = psutil.Process().memory_info().rss
        access, self.runner = service_fakes.cluster_for(running)
        storage = str(tmp / "checkpoints")
        config = dict(
            store=str(tmp / "store"),
            dashboard="http://127.0.0.1:1",  # nothing is started through it
            tick_s=3600.0,  # passes run when a submission wakes the loop, or when measured here
            shared_storage=[storage],
            web_port=0,
        )
        self.service = OrchestratorService(config, cluster=access)
        self.specs = {(w, p): spec_of(w, storage, p) for w in set(service_fakes.SIZES) for p in (0, 3, 9)}
        self.drivers: dict[str, service_fakes.Driver] = {}
        self.queued_ids: list[str] = []
        self.figures: dict[str, float] = {}

    def close(self) -> None:
        self.service.shutdown()

    # -- filling the service ---------------------------------------------------------------------

    def submit(
        self, count: int, priorities: tuple[int, ...], offset: int = 0
    ) -> tuple[list[str], list[float]]:
        """`count` submissions through the service's submit path; their ids and durations."""
        ids, took = [], []
        sizes = service_fakes.SIZES
        for i in range(count):
            spec = self.specs[(sizes[(i + offset) % len(sizes)], priorities[i % len(priorities)])]
            started = time.perf_counter()
            view = self.service.submit(spec, {"user": f"user{i % 40}"})
            took.append(time.perf_counter() - started)
            ids.append(view["id"])
        return ids, took

    def fill(self) -> None:
        """The running jobs (admitted by a pass, then reporting that their workers started),
        then the queue (lower priorities: nothing is preempted for them)."""
        ids, _ = self.submit(self.running, (9,))
        self._settle()
        self.service.tick()
        now = time.time()
        for n, job_id in enumerate(ids):
            job = self.service.jobs[job_id]
            assert job.state is JobState.ADMITTED, f"{job_id} is {job.state.value}: the cluster should fit it"
            driver = service_fakes.Driver(job_id, job.attempt, job.placement, now, seed=n)
            self.drivers[job_id] = driver
            self.service.report(job_id, job.attempt, driver.report(0, now))
        started = time.perf_counter()
        self.queued_ids, took = self.submit(self.queued, (0, 3), offset=1)
        elapsed = time.perf_counter() - started
        self.figures["submit_per_s"] = self.queued / elapsed if elapsed else float("inf")
        self.figures["submit_p99_s"] = _quantile(took, 0.99)
        self._settle()

    def _settle(self) -> None:
        """Let a pass the last submission woke finish before anything is timed."""
        time.sleep(0.05)
        with self.service.lock:
            pass

    def warm(self) -> None:
        """Each running job reports `history` records: what the service holds of a job that ran
        for hours (in reports of REPORT_RECORDS, the most a driver sends at once)."""
        per_report = service_fakes.REPORT_RECORDS * service_fakes.LOG_EVERY
        left = self.history * service_fakes.LOG_EVERY
        while left > 0:
            steps, now = min(per_report, left), time.time()
            for job_id, driver in self.drivers.items():
                self.service.report(job_id, driver.attempt, driver.report(steps, now))
            left -= steps

    # -- measuring ---------------------------------------------------------------------------------

    def reports(self, rounds: int = 3) -> None:
        """Steady reports: each driver's next 2 seconds, `rounds` times over every running job."""
        took = []
        for _ in range(rounds):
            for job_id, driver in self.drivers.items():
                progress = driver.report(service_fakes.STEPS_PER_REPORT, time.time())
                started = time.perf_counter()
                reply = self.service.report(job_id, driver.attempt, progress)
                took.append(time.perf_counter() - started)
                assert reply.get("stop") is None, reply
        self.figures["report_p50_s"] = statistics.median(took) if took else 0.0
        self.figures["report_p99_s"] = _quantile(took, 0.99)
        self.figures["reports_per_s"] = len(took) / sum(took) if took else float("inf")

    def passes(self, count: int = 15) -> None:
        took = []
        for _ in range(count):
            started = time.perf_counter()
            self.service.tick()
            took.append(time.perf_counter() - started)
        self.figures["pass_p50_s"] = statistics.median(took)
        self.figures["pass_p99_s"] = _quantile(took, 0.99)

    def reads(self, repeats: int = 3) -> dict:
        """The commands and endpoints a person or Prometheus reads; returns what they read last."""
        import prometheus_client

        from orchestrator import client
        from orchestrator.monitoring.exporter import exposition, registry_for

        page = self.service.page_url
        some = next(iter(self.drivers), None) or self.queued_ids[0]
        last_queued = self.queued_ids[-1]
        registry = registry_for(self.service)
        read = {
            "cli_queue_s": lambda: _cli("queue"),
            "cli_status_s": lambda: _cli("status", some),
            "api_queue_s": lambda: client.api_get(page, "queue"),
            "api_queue_page_s": lambda: client.api_get(page, f"queue?waiting={WAITING}&finished=0"),
            "api_queue_first_page_s": lambda: client.api_get(page, f"queue?offset=0&limit={PAGE}"),
            # the last job queued is on no page but the last: found only by the service's search
            "api_queue_search_s": lambda: client.api_get(page, f"queue?limit={PAGE}&q={last_queued}"),
            "api_status_s": lambda: client.api_job(page, some),
            "metrics_http_s": lambda: _http(page + "metrics"),
            "exporter_snapshot_s": self.service.exporter_snapshot,
            "generate_latest_s": lambda: prometheus_client.generate_latest(registry),
            "exposition_s": lambda: exposition(registry),  # what /metrics serves
        }
        last = {}
        for name, fn in read.items():
            took = []
            for _ in range(repeats):
                started = time.perf_counter()
                last[name] = fn()
                took.append(time.perf_counter() - started)
            self.figures[name] = max(took)  # the worst of the repeats: a person waits for it
        return last

    def sent_at_once(self, count: int, threads: int) -> list[dict]:
        """`count` spec files through the service's one way in, `threads` at a time, all into
        one storage path, as `orchestrator submit` sends them: each one's reply (or its
        refusal, as a string)."""
        from concurrent.futures import ThreadPoolExecutor

        from orchestrator.client import spec_file

        spec = self.tmp / "at-once.yaml"
        spec.write_text(AT_ONCE_SPEC.format(storage=self.tmp / "checkpoints"))
        sent = spec_file(str(spec), [], str(self.tmp))
        took: list[float] = []

        def one(i: int) -> dict | str:
            started = time.perf_counter()
            try:
                return self.service.submit_sent({**sent, "overrides": [f"name=at-once-{i}"]}, None)
            except (ValueError, PermissionError) as err:
                return str(err)
            finally:
                took.append(time.perf_counter() - started)

        with ThreadPoolExecutor(threads) as pool:
            replies = list(pool.map(one, range(count)))
        self.figures["sent_p50_s"] = statistics.median(took)
        self.figures["sent_p99_s"] = _quantile(took, 0.99)
        return replies

    def memory(self) -> None:
        rss = psutil.Process().memory_info().rss
        self.figures["rss_gb"] = rss / GB
        self.figures["rss_added_gb"] = (rss - self.rss_before) / GB


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def _cli(*argv: str) -> str:
    """An `orchestrator` command as a person runs it, in a process of its own (Python's start
    and the CLI's imports included: ~0.4 s here), reading the page `up` recorded: its output.
    In this process instead, its JSON decoding would wait on the service's own threads."""
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", *argv],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def _http(url: str) -> bytes:
    import urllib.request

    with urllib.request.urlopen(url, timeout=60) as reply:
        return reply.read()


def measure(
    running: int, queued: int, history: int, keep: bool = False, at_once: tuple[int, int] = (200, 4)
) -> tuple[dict, dict]:
    """The figures of one scale, and what its reads returned (for the checks)."""
    tmp = Path(tempfile.mkdtemp(prefix="service-scale-"))
    home = os.environ.get("ORCHESTRATOR_HOME")
    os.environ["ORCHESTRATOR_HOME"] = str(tmp / "home")  # the CLI finds the page here
    bench = Bench(running, queued, history, tmp)
    try:
        from orchestrator.ray import cluster

        cluster.write_state({"status_page": bench.service.page_url, "store": str(tmp / "store")})
        bench.fill()
        bench.warm()
        bench.reports()
        bench.passes()
        read = bench.reads()
        bench.memory()
        read["sent_at_once"] = bench.sent_at_once(*at_once)  # last: the reads saw none of them
        read["bench"] = bench
        return bench.figures, read
    finally:
        bench.close()
        if home is None:
            os.environ.pop("ORCHESTRATOR_HOME", None)
        else:
            os.environ["ORCHESTRATOR_HOME"] = home
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)


# figure -> (what it is, goal, whether higher is better)
GOALS = {
    "pass_p50_s": ("scheduling pass p50 (s)", 1.0, False),
    "pass_p99_s": ("scheduling pass p99 (s)", 1.0, False),
    "report_p50_s": ("report p50 (s)", None, False),
    "report_p99_s": ("report p99 (s)", None, False),
    "reports_per_s": ("reports handled per s", "running/2", True),
    "submit_per_s": ("submissions per s", 20.0, True),
    "submit_p99_s": ("submission p99 (s)", None, False),
    "sent_p50_s": ("a spec file through the one way in, 4 at a time, p50 (s)", 0.5, False),
    "sent_p99_s": ("a spec file through the one way in, 4 at a time, p99 (s)", 2.0, False),
    "cli_queue_s": ("`orchestrator queue` (s)", 1.0, False),
    "cli_status_s": ("`orchestrator status ID` (s)", 1.0, False),
    "api_queue_first_page_s": (f"GET /api/queue?limit={PAGE}, the page's first page (s)", 1.0, False),
    "api_queue_search_s": (f"GET /api/queue?limit={PAGE}&q=ID, the page's search (s)", 1.0, False),
    "api_queue_page_s": (f"GET /api/queue?waiting={WAITING} (s)", 1.0, False),
    "api_queue_s": ("GET /api/queue, every job, unpaged (s)", 1.0, False),
    "api_status_s": ("GET /api/jobs/ID (s)", 1.0, False),
    "metrics_http_s": ("GET /metrics (s)", 1.0, False),
    "exporter_snapshot_s": ("exporter snapshot (s)", 1.0, False),
    "generate_latest_s": ("prometheus generate_latest (s)", 1.0, False),
    "exposition_s": ("exporter.exposition, /metrics' text (s)", 1.0, False),
    "rss_gb": ("process RSS (GB)", 1.0, False),
    "rss_added_gb": ("RSS added by this scale (GB)", None, False),
}


def table(base: dict, big: dict, base_size: tuple[int, int], size: tuple[int, int]) -> str:
    head = f"{base_size[0]} run / {base_size[1]} queued"
    big_head = f"{size[0]} run / {size[1]} queued"
    lines = [f"| figure | {head} | {big_head} | ratio | goal | met |", "|---|---|---|---|---|---|"]
    for key, (what, goal, higher) in GOALS.items():
        a, b = base.get(key), big.get(key)
        if b is None:
            continue
        if goal == "running/2":
            goal = size[0] / 2
        ratio = f"{b / a:.1f}x" if a else "-"
        met = "" if goal is None else ("yes" if (b >= goal if higher else b < goal) else "**no**")
        shown = "" if goal is None else (f">= {goal:g}" if higher else f"< {goal:g}")
        lines.append(f"| {what} | {_num(a)} | {_num(b)} | {ratio} | {shown} | {met} |")
    return "\n".join(lines)


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.4f}" if abs(value) < 10 else f"{value:.0f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--running", type=int, default=1000)
    parser.add_argument("--queued", type=int, default=10000)
    parser.add_argument(
        "--history", type=int, default=HISTORY, help="records each running job reported before the measures"
    )
    parser.add_argument("--baseline", type=int, nargs=2, default=(10, 100), metavar=("RUNNING", "QUEUED"))
    args = parser.parse_args()
    history = args.history
    print(f"machine: {os.cpu_count()} cores; history {history} records per running job", flush=True)
    started = time.perf_counter()
    base, _ = measure(*args.baseline, history)
    print(f"baseline done in {time.perf_counter() - started:.0f} s", flush=True)
    big, _ = measure(args.running, args.queued, history)
    print(f"scale done in {time.perf_counter() - started:.0f} s\n", flush=True)
    print(table(base, big, tuple(args.baseline), (args.running, args.queued)))
    return 0


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    sys.exit(main())
