"""The synthetic workload of bench/scheduler_sim.py and its records: the configuration, each
job's plan (what is submitted and how long it really takes), a job's state in the simulation,
a run's outcome, and a summary of the workload.

Job sizes are drawn by SIZE_WEIGHTS (many small jobs, few big ones), priorities by
PRIORITY_WEIGHTS, runtimes log-normal; arrivals are Poisson at the rate that offers `load` of
the cluster's GPU-seconds.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass, field

from bench.sim_stats import percentile
from orchestrator.policy import JobRequest

PRIORITY_NAMES = {0: "low", 1: "normal", 2: "high"}
SIZES = (1, 2, 4, 8, 16, 32)  # GPUs per job
SIZE_WEIGHTS = (0.35, 0.20, 0.17, 0.14, 0.09, 0.05)  # many small jobs, few big ones
PRIORITY_WEIGHTS = (0.45, 0.40, 0.15)  # low, normal, high
EPS = 1e-6


@dataclass
class Config:
    jobs: int = 10_000
    nodes: int = 64
    gpus_per_node: int = 8
    cpus_per_node: int = 64
    seed: int = 0
    load: float = 1.0  # offered GPU load: arrival rate x mean GPU-seconds per job / GPUs
    median_runtime_s: float = 1800.0
    runtime_sigma: float = 1.0  # of the log-normal runtime
    preemptible_share_low: float = 0.7  # of low-priority jobs
    estimate_share: float = 0.5  # jobs submitted with a runtime estimate
    checkpoint_every_s: float = 1800.0  # periodic checkpoints, in work time
    ack_s: float = 30.0  # a victim that acknowledges stops this long after being told
    grace_s: float = 300.0  # one that does not is killed after this long
    no_ack_share: float = 0.05  # of victims
    backfill_window: int = 100


@dataclass
class JobPlan:
    """One synthetic job: what is submitted, and how long it really takes."""

    id: str
    submit: float
    gpus: int
    workers: int
    per_worker: dict[str, float]
    priority: int
    preemptible: bool
    steps: int
    step_s: float
    estimate_factor: float | None  # the user's estimate over the true runtime, if given


@dataclass
class SimJob:
    plan: JobPlan
    done_steps: int = 0  # progress saved in a checkpoint, where a restart resumes
    queued_since: float = 0.0
    waited_s: float = 0.0
    started_at: float | None = None  # of the current attempt
    first_start: float | None = None
    finished_at: float | None = None
    generation: int = 0  # bumps on every start or stop, so stale events are ignored
    stopping: bool = False
    unacknowledged: bool = False  # this stop will be a kill at the end of the grace period
    preemptions: int = 0
    lost_steps: int = 0

    def request(self) -> JobRequest:
        plan = self.plan
        remaining_s = (plan.steps - self.done_steps) * plan.step_s
        estimate = None if plan.estimate_factor is None else remaining_s * plan.estimate_factor
        return JobRequest(
            plan.id,
            plan.priority,
            plan.workers,
            plan.per_worker,
            plan.submit,  # the original submission time, kept across requeues (aging)
            plan.preemptible,
            "default",
            estimate,
        )

    def steps_at(self, now: float) -> int:
        return min(self.plan.steps, self.done_steps + int((now - self.started_at) / self.plan.step_s + EPS))


def make_workload(cfg: Config) -> list[JobPlan]:
    rng = random.Random(cfg.seed)
    total_gpus = cfg.nodes * cfg.gpus_per_node
    sizes = [(s, w) for s, w in zip(SIZES, SIZE_WEIGHTS) if s <= total_gpus]
    cpus_per_gpu = cfg.cpus_per_node / cfg.gpus_per_node
    plans = []
    for index in range(cfg.jobs):
        gpus = rng.choices([s for s, _ in sizes], [w for _, w in sizes])[0]
        shape = rng.random()
        if gpus >= cfg.gpus_per_node and gpus % cfg.gpus_per_node == 0 and shape < 0.75:
            # multi-node jobs mostly run one worker per whole node
            workers = gpus // cfg.gpus_per_node
            per_worker = {"GPU": cfg.gpus_per_node, "CPU": cfg.cpus_per_node}
        elif 1 < gpus < cfg.gpus_per_node and shape < 0.5:
            # single-node jobs: one worker holding all the job's GPUs
            workers, per_worker = 1, {"GPU": gpus, "CPU": cpus_per_gpu * gpus}
        else:
            workers, per_worker = gpus, {"GPU": 1, "CPU": rng.choice([cpus_per_gpu / 2, cpus_per_gpu])}
        runtime = min(
            max(rng.lognormvariate(math.log(cfg.median_runtime_s), cfg.runtime_sigma), 120.0), 36 * 3600
        )
        step_s = rng.uniform(0.5, 2.0)
        priority = rng.choices((0, 1, 2), PRIORITY_WEIGHTS)[0]
        plans.append(
            JobPlan(
                id=f"job-{index:05d}",
                submit=0.0,
                gpus=gpus,
                workers=workers,
                per_worker=per_worker,
                priority=priority,
                preemptible=priority == 0 and rng.random() < cfg.preemptible_share_low,
                steps=max(1, round(runtime / step_s)),
                step_s=step_s,
                estimate_factor=rng.uniform(0.9, 1.8) if rng.random() < cfg.estimate_share else None,
            )
        )
    # Poisson arrivals at the rate that offers `load` of the cluster's GPU-seconds
    mean_gpu_s = statistics.fmean(p.gpus * p.steps * p.step_s for p in plans)
    rate = cfg.load * total_gpus / mean_gpu_s
    now = 0.0
    for plan in plans:
        plan.submit = now
        now += rng.expovariate(rate)
    return plans


@dataclass
class Outcome:
    name: str
    jobs: dict[str, SimJob]
    makespan_s: float
    gpu_busy_s: float
    gpu_useful_s: float
    queued_s: float = 0.0  # time during which some job was waiting
    gpu_busy_queued_s: float = 0.0  # GPU-time held during that time
    decision_s: list[float] = field(default_factory=list)
    events: int = 0
    max_pending: int = 0
    preemptions: int = 0
    unacknowledged: int = 0
    invariant_checks: int = 0


def describe_workload(plans: list[JobPlan], total_gpus: int) -> dict:
    runtimes = [p.steps * p.step_s for p in plans]
    return {
        "jobs_by_gpus": {str(size): sum(p.gpus == size for p in plans) for size in SIZES},
        "jobs_by_priority": {
            name: sum(p.priority == level for p in plans) for level, name in PRIORITY_NAMES.items()
        },
        "whole_node_workers": sum(p.per_worker["GPU"] > 1 and p.workers > 1 for p in plans),
        "preemptible": sum(p.preemptible for p in plans),
        "with_estimate": sum(p.estimate_factor is not None for p in plans),
        "runtime_h": {"median": percentile(runtimes, 50) / 3600, "mean": statistics.fmean(runtimes) / 3600},
        "arrivals_span_h": (plans[-1].submit - plans[0].submit) / 3600,
        "offered_gpu_h": sum(p.gpus * r for p, r in zip(plans, runtimes)) / 3600,
        "gpus": total_gpus,
    }
