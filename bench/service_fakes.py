"""The cluster a scale benchmark of the orchestrator service runs against, without Ray: a node
table of GPU nodes, a runner that "starts" drivers by naming them, and the reports those
drivers would send (`orchestrator/attempt.py`: `QueuedJob.report` every 2 s while a job runs).

Everything here belongs to the benchmark (bench/service_scale.py); the service is handed it
through `ClusterAccess`, the same door its Ray cluster comes in by.
"""

from __future__ import annotations

import itertools
import math
import random

from orchestrator.client import attempt_name
from orchestrator.ray.launcher import driver_node
from orchestrator.ray.node_health import HealthChecks
from orchestrator.service.cluster_access import ClusterAccess

GPUS_PER_NODE = 8
SIZES = (4, 2, 1, 1)  # workers of the running jobs, in turn: four jobs fill one 8-GPU node
REPORT_RECORDS = 500  # the most records one report carries (orchestrator/attempt.py)
STEPS_PER_REPORT = 8  # 2 s between reports at 0.25 s a step
LOG_EVERY = 10  # metrics.log_every's default: a record every 10 steps


class FakeRunner:
    """Ray's Jobs API as the service uses it: a launched driver runs until it is stopped."""

    def __init__(self):
        self.status: dict[str, str] = {}

    def launch(
        self, job_id: str, attempt: int, package_uri: str, placement: dict, groups: int = 1
    ) -> tuple[str, str | None]:
        sid = attempt_name(job_id, attempt)
        self.status[sid] = "RUNNING"
        return sid, driver_node(placement)

    def stop(self, sid: str) -> None:
        self.status[sid] = "STOPPED"

    def statuses(self, ray_jobs: bool = False) -> dict[str, str]:
        return dict(self.status)


def node_table(gpus: int) -> list[dict]:
    """What `ray.nodes()` lists: a head without GPUs and nodes of 8 GPUs holding `gpus` in all
    (the last one fewer, if so): nothing is left over for a queued job."""
    head = _node(0, {"CPU": 8.0, "memory": 32e9, "node:__internal_head__": 1.0})
    sizes = [GPUS_PER_NODE] * (gpus // GPUS_PER_NODE) + (
        [gpus % GPUS_PER_NODE] if gpus % GPUS_PER_NODE else []
    )
    workers = [_node(i, {"CPU": 64.0, "GPU": float(n), "memory": 512e9}) for i, n in enumerate(sizes, 1)]
    return [head, *workers]


def _node(i: int, resources: dict) -> dict:
    address = f"10.0.{i // 250}.{i % 250 + 1}"
    return {
        "NodeID": f"{i:056x}",
        "Alive": True,
        "Resources": {**resources, f"node:{address}": 1.0},
        "NodeManagerAddress": address,
        "NodeManagerPort": 40000,
    }


def cluster_for(running: int) -> tuple[ClusterAccess, FakeRunner]:
    """A cluster that `running` jobs of SIZES (in turn) fill exactly, and its runner."""
    gpus = sum(SIZES[i % len(SIZES)] for i in range(running))
    table = node_table(gpus)
    runner = FakeRunner()
    access = ClusterAccess(
        owner="bench-service",
        runner=runner,
        node_table=lambda: table,
        draining=set,
        probe=lambda address, port: None,  # every raylet answers
        health_checks=HealthChecks(),
        autoscaler=None,
        token="bench-token",
    )
    return access, runner


# -- what a driver reports ------------------------------------------------------------------------


def train_record(step: int, time: float, rng: random.Random) -> dict:
    """Rank 0's record of a logged step (workers/trainer.py's fields)."""
    return {
        "step": step,
        "time": time,
        "rank": 0,
        "epoch": step / 1000,
        "loss": 2.5 * math.exp(-step / 5000) + rng.random() * 0.05,
        "lr": 3e-4,
        "grad_norm": 1.0 + rng.random(),
        "samples_per_s": 900.0 + rng.random() * 50,
        "tokens_per_s": 460000.0 + rng.random() * 1000,
        "tflops_per_worker": 310.0 + rng.random(),
        "mfu": 0.31 + rng.random() * 0.01,
        "data_s": 0.002 + rng.random() * 1e-3,
        "compute_s": 0.21 + rng.random() * 1e-2,
        "sync_s": 0.02 + rng.random() * 1e-3,
        "optimizer_s": 0.01 + rng.random() * 1e-3,
        "memory_allocated_bytes": 40_000_000_000 + rng.randrange(1_000_000),
        "memory_peak_allocated_bytes": 61_000_000_000,
        "memory_peak_reserved_bytes": 64_000_000_000,
    }


def rank_record(rank: int, step: int, time: float, rng: random.Random) -> dict:
    """Another rank's newest record of itself: its step-time split and memory."""
    return {
        "step": step,
        "time": time,
        "rank": rank,
        "data_s": 0.002,
        "compute_s": 0.21 + rng.random() * 1e-2,
        "sync_s": 0.02,
        "optimizer_s": 0.01,
        "memory_allocated_bytes": 40_000_000_000,
        "memory_peak_reserved_bytes": 64_000_000_000,
    }


class Driver:
    """One running job's driver: its steps, its records, its reports."""

    def __init__(self, job_id: str, attempt: int, placement: dict[str, int], started: float, seed: int):
        self.job_id, self.attempt, self.started = job_id, attempt, started
        self.rng = random.Random(seed)
        self.step, self.checkpoint = 0, None
        ranks = itertools.chain.from_iterable([node] * count for node, count in sorted(placement.items()))
        self.workers = {
            rank: {"pid": 10_000 + rank, "node": f"10.0.0.{rank + 1}", "node_id": node}
            for rank, node in enumerate(ranks)
        }

    def report(self, steps: int, now: float) -> dict:
        """The progress of `steps` more steps, with a record every LOG_EVERY of them (the newest
        REPORT_RECORDS, as the driver keeps them) and a checkpoint every 500."""
        first, self.step = self.step, self.step + steps
        logged = range((first // LOG_EVERY + 1) * LOG_EVERY, self.step + 1, LOG_EVERY)
        span = max(self.step - first, 1)
        records = [train_record(s, now - 0.25 * (self.step - s), self.rng) for s in logged[-REPORT_RECORDS:]]
        if self.step // 500 > first // 500:
            self.checkpoint = f"/ckpt/{self.job_id}/checkpoint_{self.step // 500 * 500:08d}"
        return {
            "step": self.step,
            "total_steps": 1_000_000,
            "step_time_s": 0.25 if span else None,
            "checkpoint": self.checkpoint,
            "workers_started": True,
            "restarts": 0,
            "start_step": 0,
            "start_time": self.started,
            "records": records,
            "rewound": False,
            "ranks": {r: rank_record(r, self.step, now, self.rng) for r in self.workers if r},
            "workers": {r: dict(w) for r, w in self.workers.items()},
        }
