"""The fake orchestrator service the status page's tests serve (tests/test_status_page*.py):
a small cluster with jobs in every state, whose running GPT job keeps training while the
browser watches."""

from __future__ import annotations

import json
import math
import random
import threading
import time

from core.ledger import Goodput, Ledger, cluster_goodput
from orchestrator.monitoring.queue_query import SEARCHED, QueueQuery
from tests.status_page_helpers import (
    DASHBOARD,
    HOSTILE_NAME,
    HOSTILE_NOTE,
    HOSTILE_URI,
    _job,
    _loss,
    _trained,
)


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
