"""The orchestrator's live status page: its HTTP API on a real server, and the page itself in a
real headless Chromium (Debian's `chromium` + `chromium-driver`) fed by a fake service whose
running job keeps training while the browser watches."""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
import socket
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import prometheus_client
import pytest

from core.ledger import BUCKETS, LOST, STALLED, STOPPING, Goodput, Ledger, cluster_goodput
from core.queues import DEFAULT_ORDER
from orchestrator.commands.queue import queue_lines
from orchestrator.monitoring import web
from orchestrator.monitoring.queue_query import MAX_LIMIT, SEARCHED, QueueQuery
from orchestrator.monitoring.web import make_app, serve

ROOT = Path(__file__).resolve().parents[1]
# the README's pictures are refreshed only on request (ORCHESTRATOR_SCREENSHOT_DIR=docs/images):
# a test run must not rewrite a tracked file. docs/images/goodput.png comes from this file
# (`-k where_each_jobs_time_went`), status-page.png from tests/test_monitoring.py's real service.
SCREENSHOTS = Path(os.environ.get("ORCHESTRATOR_SCREENSHOT_DIR") or tempfile.mkdtemp())
SCREENSHOT = SCREENSHOTS / "status-page.png"
GOODPUT_SCREENSHOT = SCREENSHOTS / "goodput.png"
ARTIFACTS = ROOT / "tests" / "_artifacts"
DASHBOARD = "http://127.0.0.1:8265"
HOSTILE_NAME = "<img src=x onerror=alert(1)>"
HOSTILE_NOTE = "<script>window.__pwned = true</script> waiting for <b>8 GPU</b>"
HOSTILE_URI = 's3://bucket/"><img src=x onerror=alert(2)>/checkpoint_000200'
HOSTILE_QUEUE = "<img src=x onerror=alert(6)>"


def _use(cohort, used, nominal, borrowed, lent, order="fifo") -> dict:
    """One queue's entry in `queues_view()["use"]`."""
    return {
        "cohort": cohort,
        "used": used,
        "nominal": nominal,
        "borrowed": borrowed,
        "lent": lent,
        "order": order,
    }


# /api/info's "queues" as the service's `queues_view()` builds it (checked against CohortBook):
# the applied configuration, defaults left out, and each queue's use now. research runs 8 GPU
# on a nominal 4 and borrows 4 of the cohort's unused quota; vision and nlp lend it in
# proportion to what each leaves unused (7 and 4 of 11). batch is in no cohort: a hard cap.
QUEUES = {
    "config": {
        "cohorts": ["lab"],
        "queues": {
            "research": {
                "cohort": "lab",
                "nominal": {"GPU": 4.0},
                "borrowing_limit": {"GPU": 8.0},
                "order": "las",
            },
            "vision": {"cohort": "lab", "nominal": {"GPU": 12.0}},
            "nlp": {"cohort": "lab", "nominal": {"GPU": 4.0}},
            "batch": {"nominal": {"CPU": 64.0, "GPU": 2.0}},
            "scratch": {"order": "las"},
        },
    },
    "use": {
        "research": _use("lab", {"GPU": 8.0}, {"GPU": 4.0}, {"GPU": 4.0}, {"GPU": 0.0}, "las"),
        "vision": _use("lab", {"GPU": 5.0}, {"GPU": 12.0}, {"GPU": 0.0}, {"GPU": 7 * 4 / 11}),
        "nlp": _use("lab", {"GPU": 0.0}, {"GPU": 4.0}, {"GPU": 0.0}, {"GPU": 4 * 4 / 11}),
        "batch": _use(None, {"CPU": 8.0, "GPU": 0.0}, {"CPU": 64.0, "GPU": 2.0}, {}, {}),
        "scratch": _use(None, {}, {}, {}, {}, "las"),
    },
}


# --- a fake orchestrator service --------------------------------------------------------------------


def _loss(step: int, rng: random.Random) -> float:
    """A language model's training loss: fast drop, long tail, a little noise."""
    base = 3.05 + 7.9 * math.exp(-step / 900) + 0.55 * math.exp(-step / 9000)
    return base * (1 + rng.gauss(0, 0.012))


def _job(job_id: str, name: str, state: str, **fields) -> dict:
    view = {
        "id": job_id,
        "name": name,
        "run": name,
        "state": state,
        "priority": 0,
        "queue": "default",
        "preemptible": False,
        "workers": 1,
        "per_worker": {"CPU": 8, "GPU": 1},
        "submitted_at": time.time() - 3600,
        "admitted_at": None,
        "started_at": None,
        "finished_at": None,
        "attempt": 0,
        "preemptions": 0,
        "steps_lost": 0,
        "step": 0,
        "total_steps": None,
        "step_time_s": None,
        "remaining_s": None,
        "last_checkpoint": None,
        "note": None,
        "reason": None,
        "submission_id": None,
        "submission": None,
        "launched_by": "service",
        "placement": {},
        "stop_requested": None,
        "sweep": None,
        "sweep_params": {},
        "summary": None,
        "history": [],
        "stragglers": [],  # [{rank, node, ip, ratio}] while it runs
        "hung": False,  # judged hung, until it steps again
        "avoid_nodes": [],  # stragglers' nodes it was restarted away from
    }
    view.update(fields)
    return view


def _trained(
    ledger: Ledger,
    steps: range,
    start: float,
    end: float,
    eval_every: int = 0,
    eval_s: float = 0.0,
    save_every: int = 0,
    save_s: float = 0.0,
    total_steps: int | None = None,
) -> None:
    """Feed `ledger` what a driver reports of an attempt that trains from `start` to about `end`:
    a train record every `steps.step` steps, an evaluation of `eval_s` every `eval_every` steps,
    a checkpoint every `save_every` steps whose save blocks training for `save_s` (the next
    record says so)."""
    evals = sum(1 for step in steps if eval_every and step % eval_every == 0)
    saves = sum(1 for step in steps if save_every and step % save_every == 0)
    step_s = (end - start - evals * eval_s - saves * save_s) / (len(steps) * steps.step)
    t, saving = start, 0.0
    for step in steps:
        t += steps.step * step_s + saving
        ledger.train(step, t, step_s=step_s, checkpoint_s=saving or None, total_steps=total_steps)
        saving = 0.0
        if save_every and step % save_every == 0:
            ledger.checkpointed(step)
            saving = save_s
        if eval_every and step % eval_every == 0:
            t += eval_s
            ledger.evaluated(t, duration_s=eval_s)


class FakeService:
    """What the orchestrator service feeds the page: a small cluster with jobs in every state.
    Its running GPT job keeps training (`start_training`): records, evals and checkpoints grow."""

    LOG_EVERY = 25
    EVAL_EVERY = 1000
    CHECKPOINT_EVERY = 2000

    def __init__(self, hostile: bool = False, steps_done: int = 8000, queues: dict | None = None):
        self.lock = threading.Lock()
        self.queues = queues  # /api/info's "queues": None while no queue configuration is applied
        self.info_calls = 0
        self.rng = random.Random(7)
        self.metrics_calls: list[tuple[str, int]] = []
        self.page_queries: list[QueueQuery] = []  # what the page asked `queue_page` for
        self.jobs: dict[str, dict] = {}
        self.records: dict[str, list[dict]] = {}
        self.checkpoints: dict[str, list[str]] = {}
        self.ledgers: dict[str, Ledger] = {}  # job id -> its time ledger (not every job has one)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        now = time.time()
        gpt = "gpt2-small-owt-1123-0912-a41c"
        self.running_id = gpt
        self._add(
            _job(
                gpt,
                "gpt2-small-owt",
                "running",
                priority=10,
                queue="research",
                preemptible=False,
                workers=8,
                per_worker={"CPU": 10, "GPU": 1, "memory": 64 * 2**30},
                submitted_at=now - 4 * 3600 - 310,
                admitted_at=now - 4 * 3600 - 250,
                started_at=now - 4 * 3600 - 200,
                attempt=2,
                total_steps=30000,
                step_time_s=0.92,
                submission_id=f"{gpt}-a2",
                submission=f"{gpt}-a2",
                placement={"node-2f9c61": 4, "node-8a01d3": 4},
                history=[
                    {"time": now - 4 * 3600 - 310, "event": "queued", "priority": 10, "by": "service"},
                    {"time": now - 4 * 3600 - 250, "event": "admitted", "attempt": 1, "nodes": 2, "step": 0},
                    {"time": now - 4 * 3600 - 200, "event": "running", "attempt": 1, "step": 0},
                    {"time": now - 3 * 3600, "event": "driver-exited", "step": 2980, "steps_lost": 980},
                    {
                        "time": now - 3 * 3600 + 40,
                        "event": "admitted",
                        "attempt": 2,
                        "nodes": 2,
                        "step": 2000,
                    },
                    {"time": now - 3 * 3600 + 95, "event": "running", "attempt": 2, "step": 2000},
                ],
            )
        )
        self.records[gpt] = []
        self.checkpoints[gpt] = []
        self._train(gpt, steps_done)

        vit = "vit-b16-imagenet-1123-1040-07be"
        self._add(
            _job(
                vit,
                "vit-b16-imagenet",
                "running",
                priority=5,
                queue="vision",
                preemptible=True,
                workers=4,
                elastic=[2, 4],  # an elastic job running at 3 of 2..4 workers
                placement={"node-8a01d3": 2, "node-51c7e0": 1},
                per_worker={"CPU": 12, "GPU": 1},
                submitted_at=now - 3 * 3600,
                admitted_at=now - 3 * 3600 + 3500,  # its second attempt, after a preemption
                started_at=now - 3 * 3600 + 3540,
                attempt=2,
                preemptions=1,
                steps_lost=1000,
                step=21400,
                total_steps=50000,
                step_time_s=0.301,
                remaining_s=(50000 - 21400) * 0.301,
                submission_id=f"{vit}-a1",
                submission=f"{vit}-a1",
                last_checkpoint="gs://vision-runs/vit-b16-imagenet/checkpoint_020000",
            )
        )
        self.records[vit] = [
            {"step": 21400, "loss": 2.412, "samples_per_s": 13584.0, "mfu": 0.362, "tflops_per_worker": 358.1}
        ]
        sweep = "resnet50-lr-sweep-002"
        self._add(
            _job(
                f"{sweep}-1123-1301-9d2e",
                sweep,
                "admitted",
                priority=2,
                queue="vision",
                preemptible=True,
                workers=2,
                per_worker={"CPU": 8, "GPU": 1},
                submitted_at=now - 1500,
                admitted_at=now - 12,
                attempt=1,
                total_steps=12000,
                sweep="resnet50-lr-sweep",
                sweep_params={"optimizer.lr": 0.003},
                submission=f"{sweep}-1123-1301-9d2e-a1",
                submission_id=f"{sweep}-1123-1301-9d2e-a1",
            )
        )
        self._add(
            _job(
                "vit-small-distill-1123-0820-5b11",
                "vit-small-distill",
                "preempted",
                priority=0,
                queue="vision",
                preemptible=True,
                workers=4,
                submitted_at=now - 5 * 3600,
                attempt=1,
                preemptions=1,
                step=12000,
                total_steps=40000,
                step_time_s=0.18,
                last_checkpoint="gs://vision-runs/vit-small-distill/checkpoint_012000",
                note="queued behind 1 job(s), next in line llama-1b-code (priority 5): waiting for 8 GPU",
                summary={"steps": 12000, "samples_per_s": 7012.0, "throughput": {"mfu": 0.31}},
            )
        )
        self._add(
            _job(
                "llama-1b-code-1123-1322-c0de",
                "llama-1b-code",
                "queued",
                priority=5,
                queue="research",
                workers=8,
                per_worker={"CPU": 10, "GPU": 1},
                submitted_at=now - 840,
                total_steps=100000,
                note="next in line: waiting for 8 GPU; resources reserved, expected to start in 1h 12m "
                "by runtime estimates",
            )
        )
        self._add(
            _job(
                "bert-base-finetune-1123-1330-aa10",
                "bert-base-finetune",
                "queued",
                priority=0,
                queue="nlp",
                workers=2,
                submitted_at=now - 420,
                note="queued behind 2 job(s), next in line llama-1b-code (priority 5)",
            )
        )
        self._add(
            _job(
                "convnet-fashion-1123-0700-11aa",
                "convnet-fashion",
                "succeeded",
                priority=0,
                workers=2,
                per_worker={"CPU": 4},
                submitted_at=now - 6 * 3600,
                admitted_at=now - 6 * 3600 + 5,
                started_at=now - 6 * 3600 + 20,
                finished_at=now - 5 * 3600 - 1200,
                attempt=1,
                step=5000,
                total_steps=5000,
                submission_id="convnet-fashion-1123-0700-11aa-a1",
                submission="convnet-fashion-1123-0700-11aa-a1",
                last_checkpoint="/mnt/nfs/runs/convnet-fashion/checkpoint_005000",
                summary={
                    "steps": 5000,
                    "samples_per_s": 41250.0,
                    "final_train_loss": 0.284,
                    "throughput": {},
                },
            )
        )
        self._add(
            _job(
                "gpt-nano-char-1123-0955-f00d",
                "gpt-nano-char",
                "failed",
                priority=0,
                queue="research",
                workers=1,
                submitted_at=now - 3 * 3600,
                admitted_at=now - 3 * 3600 + 4,
                started_at=now - 3 * 3600 + 30,
                finished_at=now - 2 * 3600 - 1800,
                attempt=1,
                step=3100,
                total_steps=20000,
                reason="loss is not finite at or before step 3100",
                submission_id="gpt-nano-char-1123-0955-f00d-a1",
                submission="gpt-nano-char-1123-0955-f00d-a1",
                summary={"steps": 3100, "samples_per_s": 512.0, "tokens_per_s": 524288.0, "throughput": {}},
            )
        )
        if hostile:
            self.hostile_id = "hostile-1123-1400-0bad"
            self._add(
                _job(
                    self.hostile_id,
                    HOSTILE_NAME,
                    "failed",
                    queue="<i>q</i>",
                    submitted_at=now - 60,
                    finished_at=now - 30,
                    attempt=1,
                    step=200,
                    total_steps=1000,
                    note=HOSTILE_NOTE,
                    reason="<b>oops</b><script>window.__pwned = true</script>",
                    run="<svg onload=alert(3)>",
                    submission_id='x"><img src=x onerror=alert(4)>',
                    last_checkpoint=HOSTILE_URI,
                    sweep_params={"<img src=x>": "<script>1</script>"},
                    history=[{"time": now - 60, "event": "queued", "by": "<img src=x onerror=alert(5)>"}],
                )
            )
            self.checkpoints[self.hostile_id] = [HOSTILE_URI]
            self.records[self.hostile_id] = [{"step": 100, "loss": 1.0}, {"step": 200, "loss": 0.5}]
        self._build_ledgers(now)

    def _build_ledgers(self, now: float) -> None:
        """Each job's time ledger, built as the service builds it: from state changes, records,
        checkpoints and resumes. The failed job has none (a record from before ledgers)."""

        def ledger(job_id: str, **fields) -> Ledger:
            job = self.jobs[job_id]
            gpus = job["per_worker"].get("GPU", 0.0)
            self.ledgers[job_id] = Ledger(job["submitted_at"], gpus_per_worker=gpus, **fields)
            return self.ledgers[job_id]

        # restarted: its driver hung (stalled), then died at 2,980; resumed from 2,000
        gpt = ledger(self.running_id, workers=8, stall_after_s=120)
        t0 = gpt.submitted_at
        gpt.state("admitted", t0 + 60)
        gpt.state("running", t0 + 110)
        gpt.rewound(0, t0 + 110)
        _trained(gpt, range(25, 3000, 25), t0 + 170, t0 + 3700, 1000, 45.0, 2000, 20.0)
        gpt.state("queued", t0 + 3910)
        gpt.state("admitted", t0 + 3950)
        gpt.state("running", t0 + 4005)
        gpt.rewound(2000, t0 + 4005)
        _trained(gpt, range(2025, 8001, 25), t0 + 4060, now - 1, 1000, 45.0, 2000, 20.0)

        # preempted at 9,000 before its checkpoint there was saved: resumed from 8,000
        vit = ledger("vit-b16-imagenet-1123-1040-07be", workers=3)
        t0 = vit.submitted_at
        vit.state("admitted", t0 + 30)
        vit.state("running", t0 + 75)
        vit.rewound(0, t0 + 75)
        _trained(vit, range(100, 9001, 100), t0 + 100, t0 + 2800, 2000, 30.0, 2000, 15.0)
        vit.state("stopping", t0 + 2830)
        vit.state("preempted", t0 + 2890)
        vit.state("admitted", t0 + 3500)
        vit.state("running", t0 + 3540)
        vit.rewound(8000, t0 + 3540)
        _trained(vit, range(8100, 21401, 100), t0 + 3600, now - 5, 2000, 30.0, 2000, 15.0)

        sweep = ledger("resnet50-lr-sweep-002-1123-1301-9d2e", workers=2)
        sweep.state("admitted", now - 12)

        # preempted with a checkpoint where it stopped: back in the queue, nothing lost
        distill = ledger("vit-small-distill-1123-0820-5b11", workers=4)
        t0 = distill.submitted_at
        distill.state("admitted", t0 + 600)
        distill.state("running", t0 + 640)
        distill.rewound(0, t0 + 640)
        _trained(distill, range(200, 12001, 200), t0 + 700, t0 + 2950, 4000, 40.0, 4000, 20.0)
        distill.state("stopping", t0 + 2960)
        distill.checkpointed(12000)
        distill.state("preempted", t0 + 3020)

        ledger("llama-1b-code-1123-1322-c0de", workers=8)
        ledger("bert-base-finetune-1123-1330-aa10", workers=2)

        done = "convnet-fashion-1123-0700-11aa"
        convnet = ledger(done, workers=2)  # CPU only
        t0 = convnet.submitted_at
        convnet.state("admitted", t0 + 5)
        convnet.state("running", t0 + 20)
        convnet.rewound(0, t0 + 20)
        _trained(convnet, range(50, 5001, 50), t0 + 30, t0 + 2340, 1000, 10.0, 1000, 5.0, total_steps=5000)
        convnet.state("succeeded", self.jobs[done]["finished_at"])

    def _add(self, view: dict) -> None:
        self.jobs[view["id"]] = view

    def add_waiting(self, count: int) -> list[str]:
        """`count` more jobs waiting behind the others (a queue of thousands, cut down): their ids."""
        now, added = time.time(), []
        with self.lock:
            for n in range(count):
                job_id = f"batch-{n:04d}-1123-1400-{n:04x}"
                name, submitted = f"batch-{n:04d}", now - count + n
                self._add(_job(job_id, name, "queued", queue="batch", submitted_at=submitted))
                added.append(job_id)
        return added

    def _train(self, job_id: str, steps: int) -> None:
        """Advance the running job by `steps`: one record per LOG_EVERY steps, evals, checkpoints."""
        job = self.jobs[job_id]
        for _ in range(steps // self.LOG_EVERY):
            step = job["step"] + self.LOG_EVERY
            warm = min(1.0, 0.55 + step / 600)
            rate = 440.0 * warm * (1 + self.rng.gauss(0, 0.015))  # sequences of 1024 tokens
            record = {
                "step": step,
                "loss": _loss(step, self.rng),
                "lr": 6e-4 * min(1.0, step / 1000),
                "samples_per_s": rate,
                "tokens_per_s": rate * 1024,
                "mfu": 0.385 * rate / 440.0,
                "tflops_per_worker": 380.0 * rate / 440.0,
                "grad_norm": 1.0 + self.rng.random() * 0.3,
                "time": time.time(),
            }
            self.records[job_id].append(record)
            if step % self.EVAL_EVERY == 0:
                eval_loss = _loss(step, random.Random(step)) * 1.03
                self.records[job_id].append(
                    {
                        "step": step,
                        "eval_loss": eval_loss,
                        "eval_accuracy": min(0.9, 1.6 / eval_loss - 0.05),
                        "eval_perplexity": math.exp(eval_loss),
                    }
                )
            if step % self.CHECKPOINT_EVERY == 0:
                uri = f"s3://ml-checkpoints/gpt2-small-owt/checkpoint_{step:06d}"
                self.checkpoints[job_id].append(uri)
                job["last_checkpoint"] = uri
            job["step"] = step
            if job_id in self.ledgers:  # the service folds each record into the job's ledger
                self.ledgers[job_id].record(record)
                if step % self.CHECKPOINT_EVERY == 0:
                    self.ledgers[job_id].checkpointed(step)
        job["remaining_s"] = (job["total_steps"] - job["step"]) * job["step_time_s"]

    def set_health(self, job_id: str, stragglers=(), hung: bool = False, avoid_nodes=()) -> None:
        """What the service's watchdog says of the job now: its straggling ranks, whether it is
        hung, and the nodes it avoids."""
        with self.lock:
            self.jobs[job_id].update(
                stragglers=[dict(s) for s in stragglers], hung=hung, avoid_nodes=list(avoid_nodes)
            )

    def start_training(self, steps_per_tick: int = 50, tick_s: float = 0.25) -> None:
        def loop():
            while not self._stop.wait(tick_s):
                with self.lock:
                    self._train(self.running_id, steps_per_tick)

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def stop_training(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(5)

    def mfu(self, job_id: str) -> float | None:
        """The job's newest MFU: its newest training record's, else its summary's."""
        for record in reversed(self.records.get(job_id, [])):
            if "loss" in record:
                return record.get("mfu")
        return ((self.jobs[job_id].get("summary") or {}).get("throughput") or {}).get("mfu")

    def goodput(self, now: float) -> Goodput:
        """The cluster's goodput, as the service computes it for /api/info."""
        return cluster_goodput([(ledger, self.mfu(job_id)) for job_id, ledger in self.ledgers.items()], now)

    def _with_ledger(self, view: dict, now: float) -> dict:
        if view["id"] in self.ledgers:
            view["ledger"] = self.ledgers[view["id"]].view(now, self.mfu(view["id"]))
        return view

    # -- the PageSource methods ---------------------------------------------------------------------

    def info(self) -> dict:
        with self.lock:
            self.info_calls += 1
            counts: dict[str, int] = {}
            for job in self.jobs.values():
                counts[job["state"]] = counts.get(job["state"], 0) + 1
            return {
                "generation": 3,
                "store": "s3://ml-platform/orchestrator",
                "dashboard": DASHBOARD,
                "started_at": time.time() - 26 * 3600 - 480,
                "nodes": 4,
                "draining": ["51c7e0aa9d"],
                "node_events": [{"time": time.time() - 125, "event": "joined", "node": "77be01f2c4"}],
                "autoscaler": {"may_add": {"gpu-8x": 2, "cpu-16": 0}, "asked_for": {}},
                "jobs": counts,
                "goodput": self.goodput(time.time()).as_dict(),
                "resources": {
                    "total": {"CPU": 256.0, "GPU": 32.0, "memory": 2048 * 2**30, "node:10.0.0.5": 1.0},
                    "busy": {"CPU": 144.0, "GPU": 14.0, "memory": 640 * 2**30},
                },
                "queues": json.loads(json.dumps(self.queues)),
            }

    def queue(self) -> list[dict]:
        with self.lock:
            now = time.time()
            views = [self._with_ledger(dict(j), now) for j in self.jobs.values()]
        for view in views:
            view.pop("history")
        return views

    def queue_page(self, query: QueueQuery) -> dict:
        """The page `query` picks out of `queue()`, whose order is the fake's queue order."""
        self.page_queries.append(query)
        views = self.queue()
        position = {view["id"]: n for n, view in enumerate(views)}
        page = query.select(
            views,
            lambda view: view["state"],
            lambda view: [view.get(name) for name in SEARCHED],
            lambda view: (position[view["id"]],),
        )
        return page.reply(query, page.jobs)

    def job(self, job_id: str) -> dict | None:
        with self.lock:
            if job_id not in self.jobs:
                return None
            view = self._with_ledger(json.loads(json.dumps(self.jobs[job_id])), time.time())
            view["checkpoints"] = list(self.checkpoints.get(job_id, []))
            return view

    def metrics(self, job_id: str, since_step: int, newest: int | None = None) -> list[dict]:
        with self.lock:
            self.metrics_calls.append((job_id, since_step))
            if job_id not in self.jobs:
                raise KeyError(job_id)
            found = [dict(r) for r in self.records.get(job_id, []) if r["step"] > since_step]
            return found if newest is None else found[max(len(found) - newest, 0) :]


# --- serving ---------------------------------------------------------------------------------------


@pytest.fixture
def registry():
    reg = prometheus_client.CollectorRegistry()
    gauge = prometheus_client.Gauge("orchestrator_jobs", "Jobs by state", ["state"], registry=reg)
    gauge.labels(state="running").set(2)
    return reg


@pytest.fixture
def served(registry):
    """A real server on a free loopback port: (fake service, base url)."""
    source = FakeService()
    server, url = serve(make_app(source, registry), "127.0.0.1", 0)
    yield source, url
    server.stop()


def fetch(url: str) -> tuple[int, dict, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def fetch_json(url: str):
    status, headers, body = fetch(url)
    assert headers["Content-Type"].startswith("application/json"), headers
    return status, json.loads(body)


# --- the API -----------------------------------------------------------------------------------------


def test_serve_binds_loopback_on_a_free_port_and_stops():
    server, url = serve(make_app(FakeService()), "127.0.0.1", 0)
    parsed = urllib.parse.urlparse(url)
    assert parsed.hostname == "127.0.0.1" and parsed.port and parsed.port > 0
    assert fetch(url)[0] == 200
    server.stop()
    server.stop()  # a second stop is harmless
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", parsed.port), timeout=2).close()


def test_page_is_static_and_carries_no_service_data(served):
    source, url = served
    status, headers, body = fetch(url)
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert body == (Path(web.__file__).parent / "static" / "index.html").read_bytes()
    page = body.decode()
    for job in source.jobs.values():  # every value arrives later, through the API, as text
        assert job["id"] not in page and job["name"] not in page
    assert "s3://" not in page and DASHBOARD not in page
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    assert "<script>" not in page  # no inline script: the policy would refuse it anyway
    for src in ("static/uPlot.iife.min.js", "static/app.js", "static/app.css", "static/uPlot.min.css"):
        assert src in page and "//" not in src  # served here, no CDN


def test_static_assets_and_uplot_license(served):
    _, url = served
    status, headers, body = fetch(url + "static/app.js")
    assert status == 200 and "javascript" in headers["Content-Type"]
    # the page writes text nodes only: no HTML parsing of any value
    assert not re.search(
        rb"(inner|outer)HTML\s*\+?=|insertAdjacentHTML|document\.write|createContextualFragment", body
    )
    status, _, body = fetch(url + "static/uPlot.iife.min.js")
    assert status == 200 and body.startswith(b"/*! https://github.com/leeoniya/uPlot (v1.6.32) */")
    status, headers, body = fetch(url + "static/uPlot.min.css")
    assert status == 200 and headers["Content-Type"].startswith("text/css")
    status, _, body = fetch(url + "static/uPlot.LICENSE")
    assert status == 200 and b"MIT License" in body and b"Leon Sorokin" in body
    assert fetch(url + "static/nothing.js")[0] == 404
    assert fetch(url + "static/%2e%2e/web.py")[0] in (403, 404)  # nothing outside the folder


def test_info_and_queue(served):
    source, url = served
    status, info = fetch_json(url + "api/info")
    assert status == 200 and info["generation"] == 3 and info["dashboard"] == DASHBOARD
    assert info["jobs"]["running"] == 2 and info["resources"]["total"]["GPU"] == 32.0
    status, queue = fetch_json(url + "api/queue")
    assert status == 200 and [j["id"] for j in queue] == list(source.jobs)
    views = {j["id"]: j for j in queue}
    gpt = views[source.running_id]
    assert "history" not in gpt and gpt["step"] == 8000 and gpt["total_steps"] == 30000
    newest = [r for r in source.records[source.running_id] if "loss" in r][-1]
    assert gpt["live"]["step"] == newest["step"] and gpt["live"]["mfu"] == pytest.approx(newest["mfu"])
    assert gpt["live"]["tokens_per_s"] == pytest.approx(newest["tokens_per_s"])
    assert gpt["restarts"] == 1  # two admissions, no preemption: the driver died once
    preempted = views["vit-small-distill-1123-0820-5b11"]
    assert preempted["live"] is None and preempted["restarts"] == 0  # waiting: no rate shown
    done = views["convnet-fashion-1123-0700-11aa"]
    assert done["live"]["samples_per_s"] == 41250.0 and done["live"]["loss"] == 0.284


def test_queue_reads_running_jobs_metrics_incrementally(served):
    source, url = served
    fetch_json(url + "api/queue")
    first = [since for job, since in source.metrics_calls if job == source.running_id]
    assert first == [-1]
    with source.lock:
        source._train(source.running_id, 100)
    source.metrics_calls.clear()
    _, queue = fetch_json(url + "api/queue")
    assert (source.running_id, 8000) in source.metrics_calls  # only records past the last step seen
    assert {job for job, _ in source.metrics_calls} == {
        j["id"] for j in queue if j["state"] in ("admitted", "running", "stopping")
    }
    assert next(j for j in queue if j["id"] == source.running_id)["live"]["step"] == 8100
    # `orchestrator queue` asks for the views alone: no job's metrics read, no rates or trails
    source.metrics_calls.clear()
    _, plain = fetch_json(url + "api/queue?rates=0")
    assert source.metrics_calls == [] and [j["id"] for j in plain] == [j["id"] for j in queue]
    assert not any({"live", "loss_trail", "restarts"} & set(j) for j in plain)


def by_state(views) -> dict[str, int]:
    counts: dict[str, int] = {}
    for view in views:
        counts[view["state"]] = counts.get(view["state"], 0) + 1
    return counts


def test_queue_pages_and_searches_on_the_server(served):
    source, url = served
    waiting = source.add_waiting(300)
    _, everyone = fetch_json(url + "api/queue?rates=0")  # the plain list of older callers: unchanged
    assert isinstance(everyone, list) and len(everyone) == len(source.jobs)
    ids = [view["id"] for view in everyone]

    status, first = fetch_json(url + "api/queue?limit=50")
    assert status == 200 and [view["id"] for view in first["jobs"]] == ids[:50]
    assert (first["offset"], first["limit"], first["total"]) == (0, 50, len(ids))
    assert first["counts"] == by_state(everyone)
    running = next(view for view in first["jobs"] if view["id"] == source.running_id)
    assert running["live"]["step"] == source.jobs[source.running_id]["step"]  # the page's rates
    _, last = fetch_json(url + "api/queue?offset=300&limit=50")
    assert [view["id"] for view in last["jobs"]] == ids[300:] and last["total"] == len(ids)

    # a job on no page but the last, by a word of its name and one of its queue, any case
    wanted = waiting[-23]
    source.page_queries.clear()
    _, found = fetch_json(url + f"api/queue?q={source.jobs[wanted]['name'].upper()}+BATCH")
    assert [view["id"] for view in found["jobs"]] == [wanted]
    assert found["total"] == 1 and found["counts"] == {"queued": 1}
    assert source.page_queries[-1].words == (source.jobs[wanted]["name"], "batch")
    # a note's words find the jobs waiting behind llama; a state narrows, the counts stay the search's
    _, behind = fetch_json(url + "api/queue?q=behind+LLAMA&state=preempted")
    noted = [v for v in everyone if "behind" in (v.get("note") or "") and "llama" in v["note"]]
    assert len(by_state(noted)) == 2  # one queued, one preempted
    assert behind["counts"] == by_state(noted) and behind["total"] == by_state(noted)["preempted"]
    assert {view["state"] for view in behind["jobs"]} == {"preempted"}

    source.metrics_calls.clear()
    _, queued = fetch_json(url + "api/queue?state=queued,preempted&offset=10&limit=5")
    pending = [view["id"] for view in everyone if view["state"] in ("queued", "preempted")]
    assert [view["id"] for view in queued["jobs"]] == pending[10:15] and queued["total"] == len(pending)
    assert source.metrics_calls == []  # no running job on this page: no job's metrics read
    _, unfinished = fetch_json(url + f"api/queue?finished=0&limit={MAX_LIMIT}")
    assert [view["id"] for view in unfinished["jobs"]] == [
        view["id"] for view in everyone if view["state"] not in ("succeeded", "failed", "stopped")
    ]


@pytest.mark.parametrize(
    "query, says",
    [
        ("limit=0", f"limit must be a whole number, 1 to {MAX_LIMIT}"),
        (f"limit={MAX_LIMIT + 1}", f"limit must be a whole number, 1 to {MAX_LIMIT}"),
        ("offset=-1", "offset must be a whole number, 0 or more"),
        ("offset=ten", "offset must be a whole number, 0 or more"),
        ("state=sideways", "unknown state 'sideways': one of queued, admitted"),
    ],
)
def test_a_page_asked_for_badly_is_refused_in_one_line(served, query, says):
    _, url = served
    status, reply = fetch_json(url + "api/queue?" + query)
    assert status == 400 and reply["error"].startswith(says) and "\n" not in reply["error"]


def test_job_view_with_history_and_checkpoints(served):
    source, url = served
    status, view = fetch_json(url + "api/jobs/" + source.running_id)
    assert status == 200 and view["id"] == source.running_id
    assert [h["event"] for h in view["history"]][:3] == ["queued", "admitted", "running"]
    assert view["checkpoints"][-1] == "s3://ml-checkpoints/gpt2-small-owt/checkpoint_008000"
    assert len(view["checkpoints"]) == 4 and view["restarts"] == 1
    status, error = fetch_json(url + "api/jobs/no-such-job")
    assert status == 404 and "no-such-job" in error["error"]


def test_job_views_carry_their_time_ledgers_and_info_the_clusters_goodput(served):
    source, url = served
    _, queue = fetch_json(url + "api/queue")
    views = {j["id"]: j for j in queue}
    done = "convnet-fashion-1123-0700-11aa"
    assert views[done]["ledger"] == source.ledgers[done].view(time.time())  # ended: it stays put
    for job_id in source.ledgers:
        ledger = views[job_id]["ledger"]
        assert list(ledger["buckets"]) == list(BUCKETS)
        assert sum(ledger["buckets"].values()) == pytest.approx(ledger["wall_s"])
        assert set(ledger["goodput"]) == {"scheduling", "runtime", "program", "time"}
    assert "ledger" not in views["gpt-nano-char-1123-0955-f00d"]  # a record from before ledgers
    gpt = views[source.running_id]["ledger"]
    assert gpt["buckets"][LOST] > 0 and gpt["buckets"][STALLED] > 0  # the driver hung, then died
    assert gpt["gpu_seconds"] == pytest.approx(8 * gpt["wall_s"])
    assert gpt["goodput"]["program"] == pytest.approx(source.mfu(source.running_id))
    _, vit = fetch_json(url + "api/jobs/vit-b16-imagenet-1123-1040-07be")
    assert vit["ledger"]["buckets"][LOST] > 0 and vit["ledger"]["buckets"][STOPPING] > 0  # preempted
    _, info = fetch_json(url + "api/info")
    expected = source.goodput(time.time())
    for factor in ("scheduling", "runtime", "program", "time"):
        assert info["goodput"][factor] == pytest.approx(getattr(expected, factor), abs=1e-4)


def test_metrics_since_step(served):
    source, url = served
    status, records = fetch_json(url + f"api/jobs/{source.running_id}/metrics?since=7900")
    assert status == 200
    assert [r["step"] for r in records] == [7925, 7950, 7975, 8000, 8000]  # the last one is an eval
    assert set(records[-1]) == {"step", "eval_loss", "eval_accuracy", "eval_perplexity"}
    status, everything = fetch_json(url + f"api/jobs/{source.running_id}/metrics")
    assert len(everything) == len(source.records[source.running_id])
    assert fetch_json(url + f"api/jobs/{source.running_id}/metrics?since=abc")[0] == 400
    assert fetch_json(url + "api/jobs/nope/metrics?since=0")[0] == 404


def test_non_finite_values_become_null(served):
    source, url = served
    with source.lock:
        source.records[source.running_id].append({"step": 99999, "loss": float("nan"), "mfu": float("inf")})
    _, records = fetch_json(url + f"api/jobs/{source.running_id}/metrics?since=8000")
    assert records == [{"step": 99999, "loss": None, "mfu": None}]  # JSON.parse accepts this


def test_prometheus_metrics(served):
    _, url = served
    status, headers, body = fetch(url + "metrics")
    assert status == 200 and headers["Content-Type"] == prometheus_client.CONTENT_TYPE_LATEST
    assert b'orchestrator_jobs{state="running"} 2.0' in body
    server, bare = serve(make_app(FakeService()), "127.0.0.1", 0)
    try:
        assert fetch(bare + "metrics")[0] == 404  # no registry given
    finally:
        server.stop()


# --- the page in a real browser ------------------------------------------------------------------------


def _browser_binaries() -> tuple[str, str] | None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (chromium, driver) if chromium and driver else None


@pytest.fixture(scope="module")
def browser():
    binaries = _browser_binaries()
    if binaries is None:
        pytest.skip("Chromium is not installed here (apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binaries[0]
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,900"):
        options.add_argument(arg)
    options.add_argument("--lang=en-US")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(binaries[1]), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def wait_for(predicate, timeout: float = 20.0, what: str = "the page"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def clean_console(browser) -> None:
    """No page open and an empty console: the page a test before left open polls a server
    since stopped, and a poll refused between clearing and the next page would be counted."""
    browser.get("about:blank")
    browser.get_log("browser")


def load(browser, url: str, rows: str, count: int | None = None, what: str = "the rows"):
    """Open the page on a clean console and wait for `count` elements of `rows` (any, if None)."""
    clean_console(browser)
    browser.get(url)
    found = lambda: browser.find_elements("css selector", rows)  # noqa: E731
    wait_for(lambda: found() if count is None else len(found()) == count, what=what)


def points(driver, chart: str) -> int:
    return int(driver.execute_script(f"return document.getElementById('chart-{chart}').dataset.points"))


def page_errors(driver) -> list[str]:
    """Console errors, CSP violations included (the favicon and everything else is local)."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def save_full_page(driver, path: Path) -> None:
    """The whole page in one image: the window grows to the document's height."""
    chrome = driver.execute_script("return window.outerHeight - window.innerHeight")
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1400, min(height + chrome, 4000))
    driver.execute_script("window.scrollTo(0, 0)")
    time.sleep(0.6)  # the charts follow the new size
    path.parent.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(path))


def assert_scrolled_job_view_is_whole(browser) -> None:
    """The job view, scrolled to: its title just below the sticky top bar (not under it), and
    nothing but the bar above it, in a screenshot of the scrolled page."""
    geometry = (
        "const b = document.querySelector('.topbar').getBoundingClientRect();"
        "const t = document.getElementById('job-name').getBoundingClientRect();"
        "return [b.top, b.bottom, t.top, window.scrollY]"
    )

    def settled():
        first = browser.execute_script(geometry)
        time.sleep(0.3)  # a smooth scroll has ended when two looks agree
        return first[3] > 0 and first == browser.execute_script(geometry) and first

    bar_top, bar_bottom, title_top, _ = wait_for(settled, what="the scroll to the job view to end")
    assert bar_top == 0 and bar_bottom <= title_top <= bar_bottom + 40, (bar_top, bar_bottom, title_top)
    from PIL import Image

    shot = Path(tempfile.mkdtemp()) / "scrolled.png"
    assert browser.save_screenshot(str(shot))
    image = Image.open(shot).convert("RGB")
    ratio = image.width / browser.execute_script("return window.innerWidth")
    bar = image.getpixel((int(6 * ratio), int((bar_bottom - 6) * ratio)))  # the bar's own background
    top_rows = {image.getpixel((int(x * ratio), y)) for x in (6, 400, 900) for y in range(3)}
    assert top_rows == {bar}, f"above the top bar: {top_rows - {bar}}"


def test_page_shows_the_queue_and_live_curves(browser, registry):
    source = FakeService()
    server, url = serve(make_app(source, registry), "127.0.0.1", 0)
    source.start_training()
    try:
        clean_console(browser)
        browser.get(url)
        rows = wait_for(
            lambda: (
                browser.find_elements("css selector", "#queue-body tr")
                if len(browser.find_elements("css selector", "#queue-body tr")) == len(source.jobs)
                else None
            ),
            what="a row per job",
        )
        assert rows[0].get_attribute("data-job-id") == source.running_id
        table = browser.find_element("id", "queue").text
        for expected in ("gpt2-small-owt", "running", "preempted", "failed", "research", "8 × 1 GPU"):
            assert expected in table
        assert "3/2..4 × 1 GPU" in table  # an elastic job: its size now and its range
        facts = browser.find_element("id", "facts").text
        assert "51c7e0aa draining" in facts and "77be01f2 joined 2m" in facts  # node events
        assert "autoscaler may add 2 gpu-8x" in facts and "cpu-16" not in facts  # room left to grow
        # the running job's newest losses, as a line in its row, that follows the job
        spark = browser.find_element("css selector", f'[data-job-id="{source.running_id}"] svg.spark')
        wait_for(lambda: int(spark.get_attribute("data-points") or 0) >= 2, what="the loss sparkline")
        newest = lambda: int(
            re.search(r"–([\d,]+):", spark.get_attribute("aria-label")).group(1).replace(",", "")
        )  # noqa: E731
        shown = newest()
        wait_for(lambda: newest() > shown, what="the sparkline to follow the job")
        assert spark.is_displayed() and spark.size["width"] >= 100
        drawn = "return [...document.querySelectorAll('svg.spark')].filter(s => s.dataset.points >= 2).length"
        assert browser.execute_script(drawn) == 1  # only the running job has one
        assert "loss is not finite at or before step 3100" in table  # the failed job's reason
        failed_badge = browser.find_element("css selector", '[data-job-id^="gpt-nano-char"] .badge')
        assert "s-failed" in failed_badge.get_attribute("class")
        link = browser.find_element("css selector", f'[data-job-id="{source.running_id}"] a.ext')
        assert link.get_attribute("href") == f"{DASHBOARD}/#/jobs/{source.running_id}-a2"
        assert browser.find_element("id", "dashboard-link").get_attribute("href") == DASHBOARD + "/"

        browser.execute_script("window.__sameDocument = true")
        rows[0].click()
        wait_for(lambda: points(browser, "loss") > 0, what="the loss curve")
        assert browser.current_url.endswith("#/jobs/" + source.running_id)
        assert_scrolled_job_view_is_whole(browser)
        first = points(browser, "loss")
        assert first >= 320  # the 8,000 steps logged before the page opened, every 25 steps
        wait_for(lambda: points(browser, "loss") >= first + 10, what="new points on the loss curve")
        assert browser.execute_script("return window.__sameDocument") is True  # no reload
        counts = browser.execute_script(
            "return ['loss', 'eval', 'rate'].map(c => +document.getElementById('chart-' + c).dataset.points)"
        )
        assert counts[1] >= 8 and counts[2] == counts[0]  # eval every 1,000 steps; a rate per step
        uplot = browser.execute_script(
            "return document.querySelectorAll('#chart-loss .uplot canvas, #chart-eval .uplot canvas').length"
        )
        assert uplot == 2

        panel = browser.find_element("id", "job")
        assert "s3://ml-checkpoints/gpt2-small-owt/checkpoint_008000" in panel.text
        assert "driver-exited" in panel.text and "node-2f9c61 × 4" in panel.text
        job_link = browser.find_element("id", "job-dashboard")
        assert job_link.get_attribute("href") == f"{DASHBOARD}/#/jobs/{source.running_id}-a2"

        source.stop_training()
        time.sleep(2.5)  # one more poll, so the screenshot shows settled values
        save_full_page(browser, SCREENSHOT)
        assert page_errors(browser) == []
    finally:
        source.stop_training()
        browser.set_window_size(1400, 900)
        server.stop()


def fmt_duration(seconds: float) -> str:
    """The page's fmtDuration: 45s, 3m 05s, 4h 05m, 2d 3h."""
    s = max(0, math.floor(seconds + 0.5))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    hours = s // 3600
    return f"{hours}h {s // 60 % 60:02d}m" if hours < 48 else f"{hours // 24}d {hours % 24}h"


READ_LEDGER_BAR = """
const read = (bar) => ({
  shown: bar.offsetParent !== null, width: bar.getBoundingClientRect().width,
  label: bar.getAttribute('aria-label'), title: bar.title,
  segments: Object.fromEntries(
    [...bar.children].map(s => [s.dataset.bucket, s.getBoundingClientRect().width])),
});
"""


def shares(ledger: Ledger, now: float) -> dict[str, float]:
    seconds = ledger.buckets(now)
    return {bucket: value / sum(seconds.values()) for bucket, value in seconds.items()}


def test_page_shows_where_each_jobs_time_went(browser):
    source = FakeService()
    server, url = serve(make_app(source), "127.0.0.1", 0)
    try:
        clean_console(browser)
        browser.get(url)
        wait_for(
            lambda: len(browser.find_elements("css selector", "#queue-body tr .ledger")) == len(source.jobs),
            what="a ledger bar per row",
        )
        # the queue: a small bar per job, a segment per bucket as wide as its share of the wall time
        bars = browser.execute_script(
            READ_LEDGER_BAR
            + "return Object.fromEntries([...document.querySelectorAll('#queue-body tr')]"
            + ".map(tr => [tr.dataset.jobId, read(tr.querySelector('.ledger'))]))"
        )
        now = time.time()
        for job_id, ledger in source.ledgers.items():
            bar = bars[job_id]
            assert bar["shown"] and bar["width"] > 0, job_id
            for bucket, share in shares(ledger, now).items():
                assert bar["segments"][bucket] / bar["width"] == pytest.approx(share, abs=0.01), (
                    job_id,
                    bucket,
                )
                assert (f"{bucket} " in bar["label"]) == (share > 0), (job_id, bucket)
            assert bar["title"] == bar["label"]
        assert not bars["gpt-nano-char-1123-0955-f00d"]["shown"]  # no ledger: no bar
        done = "convnet-fashion-1123-0700-11aa"  # ended: its shares stay put, to the digit
        for bucket, share in shares(source.ledgers[done], now).items():
            if share > 0:
                assert f"{bucket} {share * 100:.1f}%" in bars[done]["label"]
        assert bars[done]["label"].startswith(
            f"Goodput {source.ledgers[done].goodput(now).time * 100:.1f}%. "
        )

        # the tile: the cluster's time goodput and its factors, from every job's ledger
        tile = browser.find_element("id", "goodput-tile")
        expected = source.goodput(time.time())
        shown = float(tile.find_element("css selector", ".n").text.rstrip("%")) / 100
        assert shown == pytest.approx(expected.time, abs=0.0015)
        factors = dict(re.findall(r"(scheduling|runtime|program \(MFU\)) ([\d.]+)%", tile.text))
        assert float(factors["scheduling"]) / 100 == pytest.approx(expected.scheduling, abs=0.0015)
        assert float(factors["runtime"]) / 100 == pytest.approx(expected.runtime, abs=0.0015)
        assert float(factors["program (MFU)"]) / 100 == pytest.approx(expected.program, abs=0.0015)

        # the job view: a large bar, and a legend with every bucket's seconds and share
        browser.get(url + "#/jobs/" + source.running_id)
        wait_for(lambda: browser.find_element("id", "job-ledger").is_displayed(), what="the job's ledger")
        bar = browser.execute_script(READ_LEDGER_BAR + "return read(document.getElementById('ledger-bar'))")
        legend = browser.execute_script(
            "return [...document.querySelectorAll('#ledger-legend li')]"
            ".map(li => [li.dataset.bucket, li.querySelector('.secs').textContent, li.className])"
        )
        ledger, now = source.ledgers[source.running_id], time.time()
        assert bar["width"] > 1000 and [b for b, _, _ in legend] == list(BUCKETS)
        for bucket, share in shares(ledger, now).items():
            assert bar["segments"][bucket] / bar["width"] == pytest.approx(share, abs=0.002), bucket
        seconds = ledger.buckets(now)
        for bucket, text, faded in legend:
            assert (faded == "none") == (seconds[bucket] == 0), bucket
            if bucket not in ("training", "stalled"):  # those two grow while we look
                assert text == fmt_duration(seconds[bucket]), bucket
        caption = browser.find_element("id", "ledger-caption").text
        assert f"goodput {ledger.goodput(now).time * 100:.1f}%" in caption and "GPU-hours" in caption

        time.sleep(2.5)  # one more poll, so the picture shows settled values
        save_goodput_view(browser, GOODPUT_SCREENSHOT)
        assert page_errors(browser) == []
    finally:
        browser.set_window_size(1400, 900)
        server.stop()


def save_goodput_view(driver, path: Path) -> None:
    """The page from its top to the open job's time ledger: the tiles, the queue's bars, the job's."""
    from PIL import Image

    full = Path(tempfile.mkdtemp()) / "page.png"
    save_full_page(driver, full)
    bottom = driver.execute_script(
        "return document.getElementById('job-ledger').getBoundingClientRect().bottom + window.scrollY"
    )
    image = Image.open(full)
    ratio = image.width / driver.execute_script("return window.innerWidth")
    image.crop((0, 0, image.width, min(image.height, int((bottom + 10) * ratio)))).save(path)


def test_spec_strings_are_shown_as_text_never_as_markup(browser):
    source = FakeService(hostile=True)
    server, url = serve(make_app(source), "127.0.0.1", 0)
    try:
        clean_console(browser)
        browser.get(url)
        wait_for(
            lambda: HOSTILE_NAME in browser.find_element("id", "queue").text, what="the hostile job's row"
        )
        browser.find_element("css selector", f'[data-job-id="{source.hostile_id}"]').click()
        wait_for(lambda: points(browser, "loss") == 2, what="the hostile job's curve")
        panel = browser.find_element("id", "job").text
        assert HOSTILE_NAME in browser.find_element("id", "job-name").text
        assert "<b>oops</b><script>window.__pwned = true</script>" in panel  # the reason, as text
        assert "<svg onload=alert(3)>" in panel and HOSTILE_URI in panel and "<img src=x>" in panel
        assert "<img src=x onerror=alert(5)>" in panel  # a history detail
        save_full_page(browser, ARTIFACTS / "status-page-hostile.png")
        assert browser.execute_script("return document.querySelectorAll('img, svg image, b, i').length") == 0
        scripts = browser.execute_script(
            "return Array.from(document.scripts).map(s => s.getAttribute('src'))"
        )
        assert scripts == ["static/uPlot.iife.min.js", "static/app.js"]
        # the logo, and the page's own loss lines (one per queue row, drawn only for running jobs)
        svgs = "return [...document.querySelectorAll('svg')].map(s => s.getAttribute('class'))"
        assert sorted(browser.execute_script(svgs)) == ["logo"] + ["spark"] * len(source.jobs)
        assert browser.execute_script("return window.__pwned === undefined") is True
        # a submission id is a URL component, never markup or a way out of the attribute
        href = browser.find_element("id", "job-dashboard").get_attribute("href")
        assert href == DASHBOARD + "/#/jobs/" + urllib.parse.quote(
            'x"><img src=x onerror=alert(4)>', safe="()!*'~"
        )  # as encodeURIComponent
        assert page_errors(browser) == []
    finally:
        browser.set_window_size(1400, 900)
        server.stop()


# --- a job's health: ranks that straggle, a hang, the nodes it avoids -----------------------------

NODE_A = "5f0c61e1" + "9d3a" * 11 + "e1"  # Ray node ids: 56 hex digits
NODE_B = "9b27c4d0" + "7e11" * 11 + "0a"
NODE_C = "c3d1e2f4" + "00ab" * 11 + "77"
VIT = "vit-b16-imagenet-1123-1040-07be"
DISTILL = "vit-small-distill-1123-0820-5b11"
HOSTILE_NODE = "<i>n</i><img src=x onerror=alert(7)>"  # its first 8 characters are markup too
HOSTILE_IP = "<b>10.0.0.7</b><script>window.__pwned = true</script>"
PER_STEP = "the median rank's compute per step"

READ_HEALTH = """
return [...document.querySelectorAll('#job-health li')].map(li => ({
  kind: li.dataset.kind, text: li.textContent,
  nodes: [...li.querySelectorAll('.node')].map(n => [n.textContent, n.title]),
}));
"""

# each row's warning marker while it is shown (null while hidden)
READ_FLAGS = """
return Object.fromEntries([...document.querySelectorAll('#queue-body tr')].map(tr => {
  const flag = tr.querySelector('.flag');
  const shown = flag.offsetParent !== null;
  return [tr.dataset.jobId,
          shown ? {text: flag.textContent, title: flag.title, hung: flag.classList.contains('hung')} : null];
}));
"""


def troubled_service() -> FakeService:
    """The fake with a hung job that has two straggling ranks, a running job with one (its node's
    address unknown), and a preempted job kept off two stragglers' nodes."""
    source = FakeService()
    source.set_health(
        source.running_id,
        stragglers=[
            {"rank": 1, "node": NODE_A, "ip": "10.0.0.7", "ratio": 1.912},
            {"rank": 6, "node": NODE_B, "ip": "10.0.0.9", "ratio": 1.254},
        ],
        hung=True,
    )
    source.set_health(VIT, stragglers=[{"rank": 2, "node": NODE_C, "ip": None, "ratio": 1.3051}])
    source.set_health(DISTILL, avoid_nodes=[NODE_A, NODE_B])
    return source


def open_job_warnings(browser, url: str, job_id: str, name: str) -> list[dict]:
    """Open the job's view; its warning lines once the page shows that job."""
    browser.get(url + "#/jobs/" + job_id)
    wait_for(lambda: browser.find_element("id", "job-name").text == name, what=f"{name}'s view")
    wait_for(lambda: browser.execute_script(READ_HEALTH), what=f"{name}'s warnings")
    return browser.execute_script(READ_HEALTH)


def test_job_view_warns_of_stragglers_a_hang_and_avoided_nodes(browser):
    source = troubled_service()
    server, url = serve(make_app(source), "127.0.0.1", 0)
    try:
        clean_console(browser)
        hung, first, second = open_job_warnings(browser, url, source.running_id, "gpt2-small-owt")
        assert browser.find_element("id", "job-health").is_displayed()
        assert hung["kind"] == "hung" and hung["nodes"] == []
        assert hung["text"].startswith("Hung: no step progress past the hang timeout.")
        assert "stacks are saved" in hung["text"] and "restarts from its newest checkpoint" in hung["text"]
        assert first == {
            "kind": "straggler",
            "text": f"Rank 1 on node 5f0c61e1 (10.0.0.7) is a straggler: 1.91x {PER_STEP}",
            "nodes": [["5f0c61e1", NODE_A]],  # shortened, the whole id on hover
        }
        assert second["text"] == f"Rank 6 on node 9b27c4d0 (10.0.0.9) is a straggler: 1.25x {PER_STEP}"
        assert second["nodes"] == [["9b27c4d0", NODE_B]]

        # it steps again and its ranks even out: the warnings go, without a reload
        source.set_health(source.running_id)
        health = browser.find_element("id", "job-health")
        wait_for(lambda: not health.is_displayed(), what="the warnings to go")
        assert browser.execute_script(READ_HEALTH) == []

        # a straggler whose node's address is unknown
        [line] = open_job_warnings(browser, url, VIT, "vit-b16-imagenet")
        assert line["text"] == f"Rank 2 on node c3d1e2f4 is a straggler: 1.31x {PER_STEP}"

        # a job kept off the nodes stragglers ran on
        [line] = open_job_warnings(browser, url, DISTILL, "vit-small-distill")
        assert line["kind"] == "avoiding" and line["nodes"] == [["5f0c61e1", NODE_A], ["9b27c4d0", NODE_B]]
        assert line["text"] == (
            "Avoiding node(s) 5f0c61e1, 9b27c4d0 (stragglers ran there): the job is not placed on them again."
        )
        assert page_errors(browser) == []
    finally:
        server.stop()


def test_queue_marks_the_rows_of_jobs_with_stragglers_or_a_hang(browser):
    source = troubled_service()
    server, url = serve(make_app(source), "127.0.0.1", 0)
    try:
        load(browser, url, "#queue-body tr", len(source.jobs), "a row per job")
        flags = browser.execute_script(READ_FLAGS)
        assert flags[source.running_id] == {
            "text": "⚠",
            "hung": True,
            "title": "Hung: no step progress past the hang timeout; stacks saved, restarting\n"
            f"Straggler: rank 1 at 1.91x {PER_STEP} (node 5f0c61e1, 10.0.0.7)\n"
            f"Straggler: rank 6 at 1.25x {PER_STEP} (node 9b27c4d0, 10.0.0.9)",
        }
        assert flags[VIT] == {
            "text": "⚠",
            "hung": False,
            "title": f"Straggler: rank 2 at 1.31x {PER_STEP} (node c3d1e2f4)",
        }
        # healthy jobs, and one that only avoids nodes, carry no marker
        assert {job_id for job_id, flag in flags.items() if flag} == {source.running_id, VIT}

        source.set_health(source.running_id, avoid_nodes=[NODE_A])  # it stepped again
        wait_for(
            lambda: browser.execute_script(READ_FLAGS)[source.running_id] is None, what="the marker to go"
        )
        assert browser.execute_script(READ_FLAGS)[VIT] == flags[VIT]
        assert page_errors(browser) == []
    finally:
        server.stop()


READ_ROWS = "return [...document.querySelectorAll('#queue-body tr')].map(tr => tr.dataset.jobId)"
READ_TILES = """
return Object.fromEntries([...document.querySelectorAll('#counts .tile')].map(
  t => [t.querySelector('.label').textContent, t.querySelector('.n').textContent]));
"""


def type_search(browser, text: str) -> None:
    box = browser.find_element("id", "filter")
    browser.execute_script("arguments[0].value = ''", box)
    box.send_keys(text) if text else browser.execute_script(
        "arguments[0].dispatchEvent(new Event('input'))", box
    )


def press(browser, element) -> None:
    """Click `element` as a person does: scrolled into view first, clear of the sticky top bar."""
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", element)
    element.click()


def test_page_lists_one_page_and_its_search_asks_the_service(browser):
    """With a few hundred jobs the page lists one page of them in queue order; its search, state
    tiles and pager ask the service for the page they show, and the tiles still count every job."""
    source = FakeService()
    waiting = source.add_waiting(300)
    views = source.queue()
    ordered = [view["id"] for view in views]
    server, url = serve(make_app(source), "127.0.0.1", 0)
    rows = lambda: browser.execute_script(READ_ROWS)  # noqa: E731
    count = lambda: browser.find_element("id", "job-count").text  # noqa: E731
    try:
        load(browser, url, "#queue-body tr", what="the first page")
        size = source.page_queries[-1].limit
        assert size < len(ordered)
        wait_for(lambda: rows() == ordered[:size], what="the first page, in queue order")
        assert count() == f"1–{size} of {len(ordered):,}"
        assert browser.find_element("id", "pager").is_displayed()
        assert browser.execute_script(READ_TILES) == {s: f"{n:,}" for s, n in by_state(views).items()}

        wanted = waiting[-23]  # on the last page: the page never had it
        type_search(browser, source.jobs[wanted]["name"])
        wait_for(lambda: rows() == [wanted], what="the service's search to find a job past the first page")
        assert source.page_queries[-1].words == (source.jobs[wanted]["name"],)
        assert count() == "1 · found 1 queued" and not browser.find_element("id", "pager").is_displayed()
        type_search(browser, "no-such-job")
        wait_for(lambda: browser.find_element("id", "queue-none").is_displayed(), what="no match")
        assert rows() == [] and not browser.find_element("id", "queue-empty").is_displayed()

        type_search(browser, "")
        wait_for(lambda: rows() == ordered[:size], what="the first page again")
        press(browser, browser.find_element("id", "page-next"))
        wait_for(lambda: rows() == ordered[size : 2 * size], what="the second page")
        assert count() == f"{size + 1}–{2 * size} of {len(ordered):,}"
        assert source.page_queries[-1].offset == size

        running = [view["id"] for view in views if view["state"] == "running"]
        tile = browser.find_element("xpath", "//*[@id='counts']/button[.//*[contains(@class, 's-running')]]")
        press(browser, tile)
        wait_for(lambda: rows() == running, what="the running jobs, from the first of them")
        assert source.page_queries[-1].states == {"running"} and source.page_queries[-1].offset == 0
        assert page_errors(browser) == []
    finally:
        server.stop()


def test_node_ids_and_addresses_are_shown_as_text_never_as_markup(browser):
    source = FakeService()
    straggler = {"rank": 3, "node": HOSTILE_NODE, "ip": HOSTILE_IP, "ratio": 2.5}
    source.set_health(source.running_id, stragglers=[straggler], hung=True, avoid_nodes=[HOSTILE_NODE])
    server, url = serve(make_app(source), "127.0.0.1", 0)
    try:
        clean_console(browser)
        _, shown, avoiding = open_job_warnings(browser, url, source.running_id, "gpt2-small-owt")
        assert shown["text"] == f"Rank 3 on node <i>n</i> ({HOSTILE_IP}) is a straggler: 2.50x {PER_STEP}"
        assert shown["nodes"] == avoiding["nodes"] == [["<i>n</i>", HOSTILE_NODE]]
        flag = browser.execute_script(READ_FLAGS)[source.running_id]
        assert flag["title"].endswith(f"(node <i>n</i>, {HOSTILE_IP})")
        assert browser.execute_script("return document.querySelectorAll('img, b, i').length") == 0
        assert browser.execute_script("return window.__pwned === undefined") is True
        assert page_errors(browser) == []
    finally:
        server.stop()


READ_QUEUES = """
const text = (node) => (node ? node.textContent : null);
return [...document.querySelectorAll('#queues-body tr')].map(tr => ({
  name: text(tr.querySelector('.name')), key: tr.dataset.queue,
  cohort: text(tr.querySelector('.cohort')), order: text(tr.querySelector('.order')),
  use: [...tr.querySelectorAll('.quota')].map(line => ({
    resource: text(line.querySelector('.res-name')), value: text(line.querySelector('.res-value')),
    width: line.querySelector('.quota-bar').getBoundingClientRect().width,
    parts: Object.fromEntries([...line.querySelectorAll('.seg')].map(
      s => [s.dataset.part, s.getBoundingClientRect().width])),
  })),
  useText: text(tr.querySelector('.use')),
  extra: [...tr.querySelectorAll('.extra div')].map(text),
  limit: text(tr.querySelector('.limit')),
}));
"""


def line_from_page(row: dict) -> str:
    """`queue_lines`'s line for a queue, rebuilt from the page's row: the CLI's words around
    the numbers the page shows."""
    where = {"hard cap": "cap", "—": ""}.get(row["cohort"], f"cohort {row['cohort']}")
    kind = ", ".join(filter(None, [where, row["order"] if row["order"] != DEFAULT_ORDER else ""]))
    use = ", ".join(f"{u['value'].replace(' / ', '/')} {u['resource']}" for u in row["use"]) or row["useText"]
    head = f"queue {row['name']} ({kind})" if kind else f"queue {row['name']}"
    return f"{head}: {use}" + (f"; {', '.join(row['extra'])}" if row["extra"] else "")


def queues_panel_shown(browser) -> bool:
    return browser.find_element("id", "queues").is_displayed()


def test_queues_panel_shows_use_quota_and_borrowing_as_the_cli_does(browser):
    source = FakeService(queues=QUEUES)
    server, url = serve(make_app(source), "127.0.0.1", 0)
    try:
        assert fetch_json(url + "api/info")[1]["queues"] == QUEUES  # passed on as the service gives it
        load(browser, url, "#queues-body tr", len(QUEUES["use"]), "a row per queue")
        assert queues_panel_shown(browser)
        assert browser.find_element("id", "queues-count").text == "5"
        rows = browser.execute_script(READ_QUEUES)
        assert [row["name"] for row in rows] == sorted(QUEUES["use"])  # the CLI's order
        shown = {row["name"]: row for row in rows}

        # the fake's numbers, as the page writes them
        for name, q in QUEUES["use"].items():
            row = shown[name]
            assert row["order"] == q["order"], name
            assert [(u["resource"], u["value"]) for u in row["use"]] == [
                (r, f"{q['used'][r]:g} / {n:g}") for r, n in q["nominal"].items()
            ], name
        research, vision, nlp, batch, scratch = (
            shown[n] for n in ("research", "vision", "nlp", "batch", "scratch")
        )
        assert (research["cohort"], research["use"][0]["value"]) == ("lab", "8 / 4")
        assert research["extra"] == ["borrows 4 GPU"] and research["limit"] == "8 GPU"
        assert vision["extra"] == ["lends 2.54545 GPU"] and nlp["extra"] == ["lends 1.45455 GPU"]
        assert vision["limit"] == nlp["limit"] == "—"  # no limit but the cohort's unused quota
        assert batch["cohort"] == "hard cap" and batch["extra"] == [] and batch["limit"] == "—"
        assert [u["value"] for u in batch["use"]] == ["8 / 64", "0 / 2"]
        assert scratch["use"] == [] and scratch["useText"] == "no quota"

        # each bar: use within the quota, beyond it and lent, against the larger of use and quota
        def fractions(line):
            return {part: width / line["width"] for part, width in line["parts"].items()}

        assert research["use"][0]["width"] > 100
        assert fractions(research["use"][0]) == pytest.approx(
            {"within": 0.5, "borrowed": 0.5, "lent": 0}, abs=0.01
        )
        assert fractions(vision["use"][0]) == pytest.approx(
            {"within": 5 / 12, "borrowed": 0, "lent": 7 * 4 / 11 / 12}, abs=0.01
        )
        assert fractions(nlp["use"][0]) == pytest.approx(
            {"within": 0, "borrowed": 0, "lent": 4 / 11}, abs=0.01
        )
        assert fractions(batch["use"][1]) == pytest.approx({"within": 0, "borrowed": 0, "lent": 0}, abs=0.01)

        # and `orchestrator queue` says the same, line for line
        assert [line_from_page(row) for row in rows] == queue_lines(QUEUES)
        assert page_errors(browser) == []
    finally:
        server.stop()


def test_queue_names_are_shown_as_text_never_as_markup(browser):
    cohort, resource = "<b>lab</b>", "<i>GPU</i>"
    hostile = {
        "config": {
            "cohorts": [cohort],
            "queues": {
                HOSTILE_QUEUE: {
                    "cohort": cohort,
                    "nominal": {resource: 2.0},
                    "borrowing_limit": {resource: 1.0},
                }
            },
        },
        "use": {
            HOSTILE_QUEUE: {
                "cohort": cohort,
                "used": {resource: 3.0},
                "nominal": {resource: 2.0},
                "borrowed": {resource: 1.0},
                "lent": {resource: 0.0},
                "order": "<script>window.__pwned = true</script>",
            }
        },
    }
    source = FakeService(queues=hostile)
    server, url = serve(make_app(source), "127.0.0.1", 0)
    try:
        load(browser, url, "#queues-body tr", what="the queue's row")
        [row] = browser.execute_script(READ_QUEUES)
        assert row["name"] == row["key"] == HOSTILE_QUEUE and row["cohort"] == cohort
        assert row["order"] == "<script>window.__pwned = true</script>"
        assert [(u["resource"], u["value"]) for u in row["use"]] == [(resource, "3 / 2")]
        assert row["extra"] == [f"borrows 1 {resource}"] and row["limit"] == f"1 {resource}"
        assert HOSTILE_QUEUE in browser.find_element("id", "queues").text
        markup = "return document.querySelectorAll('img, b, i, #queues script').length"
        assert browser.execute_script(markup) == 0
        assert browser.execute_script("return window.__pwned === undefined") is True
        assert page_errors(browser) == []
    finally:
        server.stop()


def test_queues_panel_is_hidden_without_a_queue_configuration(browser):
    source = FakeService()  # no queue configuration applied: "queues" is None

    def after_a_fresh_poll():
        """Wait until the page has drawn a poll that began after now."""
        calls = source.info_calls
        wait_for(lambda: source.info_calls >= calls + 2, what="two more polls")

    server, url = serve(make_app(source), "127.0.0.1", 0)
    try:
        browser.get(url)
        wait_for(lambda: browser.find_elements("css selector", "#queue-body tr"), what="the jobs")
        assert not queues_panel_shown(browser)
        assert browser.find_elements("css selector", "#queues-body tr") == []
        with source.lock:  # `orchestrator queues apply`: the panel appears without a reload
            source.queues = QUEUES
        wait_for(lambda: queues_panel_shown(browser), what="the panel to appear")
        with source.lock:  # a configuration without queues shows nothing either
            source.queues = {"config": {"cohorts": ["lab"]}, "use": {}}
        wait_for(lambda: not queues_panel_shown(browser), what="the panel to go")
        assert browser.find_elements("css selector", "#queues-body tr") == []
        with source.lock:
            source.queues = None
        after_a_fresh_poll()
        assert not queues_panel_shown(browser)
        assert browser.find_element("id", "queues-count").text == ""
    finally:
        server.stop()


def test_a_dashboard_address_that_is_not_http_never_becomes_a_link(browser):
    source = FakeService()
    source.info = lambda: {**FakeService.info(source), "dashboard": "javascript:window.__pwned=1"}
    server, url = serve(make_app(source), "127.0.0.1", 0)
    try:
        clean_console(browser)
        browser.get(url)
        wait_for(lambda: browser.find_elements("css selector", "#queue-body tr"), what="the queue")
        time.sleep(0.3)
        assert not browser.find_element("id", "dashboard-link").is_displayed()
        links = browser.execute_script(
            "return Array.from(document.querySelectorAll('a[href]')).map(a => a.getAttribute('href'))"
        )
        assert not [h for h in links if h.startswith("javascript:")]
    finally:
        server.stop()


def test_page_says_when_the_service_cannot_be_reached_and_keeps_its_data(browser):
    source = FakeService()
    server, url = serve(make_app(source), "127.0.0.1", 0)
    stopped = False
    try:
        clean_console(browser)
        browser.get(url)
        wait_for(
            lambda: browser.find_element("id", "live").get_attribute("data-state") == "ok", what="a poll"
        )
        server.stop()
        stopped = True
        wait_for(
            lambda: browser.find_element("id", "live").get_attribute("data-state") == "error",
            timeout=10,
            what="the page to notice",
        )
        assert "cannot reach the orchestrator service" in browser.find_element("id", "live").text
        assert len(browser.find_elements("css selector", "#queue-body tr")) == len(source.jobs)
    finally:
        if not stopped:
            server.stop()


def test_serve_reports_a_port_that_is_taken():
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        with pytest.raises(OSError):
            serve(make_app(FakeService()), "127.0.0.1", taken.getsockname()[1])
    finally:
        taken.close()


# --- submitting over HTTP (the CLI's quick `submit`) ---------------------------------------------


class RecordingSubmitter:
    """What the service does with jobs sent to POST /api/jobs: the schema check, then the queue."""

    def __init__(self, token):
        self.token, self.queued = token, []

    def submit_specs(self, specs, options, package):
        from core.spec import SpecError, validate

        try:
            typed = [validate(raw, "submitted spec") for raw in specs]
        except SpecError as err:
            raise ValueError(str(err).splitlines()[0]) from None
        self.queued += [(spec.name, option, package) for spec, option in zip(typed, options)]
        return [{"id": f"{spec.name}-1"} for spec in typed]


def test_jobs_sent_over_http_need_the_cluster_token_and_a_valid_spec():
    from core.spec import load_spec
    from orchestrator import client

    spec = load_spec("jobs/vit.yaml").model_dump(mode="json", by_alias=True)
    submitter = RecordingSubmitter("s3cret")
    server, url = serve(make_app(FakeService(), submitter=submitter), "127.0.0.1", 0)
    try:
        assert client.api_submit(url, "s3cret", [spec], [{}], b"zip bytes") == [{"id": "vit-fashion-mnist-1"}]
        assert submitter.queued == [("vit-fashion-mnist", {}, b"zip bytes")]
        # a wrong token queues nothing, and is final: the CLI says so, not tries the cluster
        with pytest.raises(client.Refused, match="^missing or wrong cluster token$"):
            client.api_submit(url, "guess", [spec], [{}], b"")
        bad = {**spec, "train": {**spec["train"], "steps": -1}}
        with pytest.raises(client.Refused, match=r"^submitted spec: train\.steps: "):
            client.api_submit(url, "s3cret", [bad], [{}], b"")
        assert len(submitter.queued) == 1
    finally:
        server.stop()
    # without the service's door, a cluster without token auth takes no jobs over HTTP
    server, url = serve(make_app(FakeService(), submitter=RecordingSubmitter(None)), "127.0.0.1", 0)
    try:
        with pytest.raises(client.Refused, match="only on a cluster with token auth"):
            client.api_submit(url, "anything", [spec], [{}], b"")
    finally:
        server.stop()
    read_only = serve(make_app(FakeService()), "127.0.0.1", 0)
    try:
        with pytest.raises(client.Refused, match="takes no jobs"):
            client.api_submit(read_only[1], "anything", [spec], [{}], b"")
    finally:
        read_only[0].stop()
