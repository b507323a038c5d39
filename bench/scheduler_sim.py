"""The orchestrator's scheduling policy (priorities, FIFO within a level) on a simulated cluster,
against plain FIFO.

    python bench/scheduler_sim.py                  # 10,000 jobs, 64 nodes x 8 GPUs, seed 0
    python bench/scheduler_sim.py --quick          # a small workload (what the tests run)
    python bench/scheduler_sim.py --jobs 2000 --nodes 16 --seed 3 --out /tmp/sim
    python bench/scheduler_sim.py --trace bench/traces/tiresias-60.csv --nodes 4 --gpus-per-node 8 \
        [--policies fifo,las] [--preempt-cost-s 60] [--with-durations] [--queues FILE] [--json FILE]

With `--trace`, every policy replays the trace instead (`bench/trace_sim.py`): FIFO, FIFO with
EASY backfill and SJF on exact durations (baselines), `default` (the service with nothing
configured), `las`, `las+cohorts` and `las-share`, and `configured` with `--queues FILE`; see
docs/scheduler.md ("Trace replay").

No Ray: the same `Policy` the service runs is called on every event (a job arriving, ending,
or a preempted job having stopped) and its decisions are applied to a simulated cluster.
Preemption is cooperative, as in the product: a victim checkpoints at its current step,
loses no steps and is requeued with its remaining work and its original submission time. A
configurable fraction of victims do not acknowledge: they are killed when the grace period
runs out and lose the steps since their last periodic checkpoint. The simulator asserts its
invariants as it runs (no node over capacity, no job running twice, every job finishes),
then runs the same workload under `FifoPolicy` for comparison. Results go to
`<out>/scheduler_sim.json` and `.md`, with their provenance.
"""

from __future__ import annotations

import argparse
import datetime
import heapq
import json
import math
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from provenance import git_commit  # noqa: E402  (bench/provenance.py: this script's folder is on sys.path)
from sim_stats import decision_summary, percentile  # noqa: E402

from bench.fifo import FifoPolicy  # noqa: E402
from core.queues import validate_queue_config  # noqa: E402
from orchestrator.policy import Allocation, JobRequest, Node, Policy  # noqa: E402

PRIORITY_NAMES = {0: "low", 1: "normal", 2: "high"}
SIZES = (1, 2, 4, 8, 16, 32)  # GPUs per job
SIZE_WEIGHTS = (0.35, 0.20, 0.17, 0.14, 0.09, 0.05)  # many small jobs, few big ones
PRIORITY_WEIGHTS = (0.45, 0.40, 0.15)  # low, normal, high
EPS = 1e-6
# what this simulation measures: priorities, gangs, EASY backfill and preemption by priority,
# with FIFO within a level; it keeps no attained service, which the default order (las-share)
# needs: that order is replayed by `--trace` (`trace_sim.py`) and `scheduler_philly.py`
PRIORITY_FIFO = validate_queue_config({"order": "fifo"})


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


def simulate(name: str, policy, plans: list[JobPlan], cfg: Config) -> Outcome:
    """Run every job of `plans` to completion under `policy`, asserting invariants on the way."""
    rng = random.Random(cfg.seed + 1)  # which victims fail to acknowledge
    capacity = {node.id: node.capacity for node in policy.nodes}
    used = {node_id: {name: 0.0 for name in cap} for node_id, cap in capacity.items()}
    jobs = {plan.id: SimJob(plan) for plan in plans}
    pending: dict[str, JobRequest] = {}
    running: dict[str, Allocation] = {}
    events: list[tuple[float, int, str, str, int]] = []  # (time, seq, kind, job id, generation)
    seq = 0
    for plan in plans:
        events.append((plan.submit, seq, "arrive", plan.id, 0))
        seq += 1
    heapq.heapify(events)
    outcome = Outcome(name, jobs, 0.0, 0.0, 0.0)
    gpus_in_use = 0.0
    clock = 0.0

    def occupy(allocation: Allocation, sign: int) -> None:
        nonlocal gpus_in_use
        for node_id, count in allocation.placement.items():
            node_used = used[node_id]
            for res, amount in allocation.per_worker.items():
                node_used[res] += sign * amount * count
                assert node_used[res] <= capacity[node_id][res] + EPS, f"{node_id} over capacity in {res}"
                assert node_used[res] >= -EPS, f"{node_id}: negative use of {res}"
        gpus_in_use += sign * allocation.per_worker.get("GPU", 0.0) * allocation.workers

    def release(job: SimJob) -> None:
        occupy(running.pop(job.plan.id), -1)
        job.generation += 1
        job.stopping = False
        job.started_at = None

    while events:
        now = events[0][0]
        outcome.gpu_busy_s += gpus_in_use * (now - clock)
        if pending:  # jobs were waiting all along this interval
            outcome.queued_s += now - clock
            outcome.gpu_busy_queued_s += gpus_in_use * (now - clock)
        clock = now
        while events and events[0][0] == now:
            _, _, kind, job_id, generation = heapq.heappop(events)
            job = jobs[job_id]
            if kind == "arrive":
                job.queued_since = now
                pending[job_id] = job.request()
            elif generation != job.generation:
                continue  # the attempt this event belonged to is over
            elif kind == "finish":
                assert job.steps_at(now) == job.plan.steps
                release(job)
                job.done_steps = job.plan.steps
                job.finished_at = now
            elif kind == "stopped":
                steps = job.steps_at(now)
                if job.unacknowledged:
                    # killed without a checkpoint: back to the last periodic one
                    every = max(1, round(cfg.checkpoint_every_s / job.plan.step_s))
                    saved = max(job.done_steps, steps // every * every)
                    job.lost_steps += steps - saved
                    steps = saved
                release(job)
                job.done_steps = steps
                job.queued_since = now
                pending[job_id] = job.request()

        outcome.max_pending = max(outcome.max_pending, len(pending))
        started = time.perf_counter()
        decision = policy.schedule(now, list(pending.values()), list(running.values()))
        outcome.decision_s.append(time.perf_counter() - started)
        outcome.events += 1

        for victim_id in decision.preempt:
            victim = jobs[victim_id]
            head = jobs[decision.reserved_for].plan
            assert victim_id in running and not victim.stopping, f"{victim_id} is not a running job"
            # of equal priority: moved to another node to make room (`defrag.py`)
            assert victim.plan.preemptible and victim.plan.priority <= head.priority, (
                f"{victim_id} may not be preempted"
            )
            victim.stopping = True
            running[victim_id].stopping = True
            victim.preemptions += 1
            outcome.preemptions += 1
            acknowledges = rng.random() >= cfg.no_ack_share
            victim.unacknowledged = not acknowledges
            outcome.unacknowledged += not acknowledges
            heapq.heappush(
                events,
                (
                    now + (cfg.ack_s if acknowledges else cfg.grace_s),
                    seq,
                    "stopped",
                    victim_id,
                    victim.generation,
                ),
            )
            seq += 1
        for job_id, placement in decision.admit:
            job = jobs[job_id]
            assert job_id in pending, f"{job_id} admitted but not pending"
            assert job_id not in running, f"{job_id} would run twice"
            assert sum(placement.values()) == job.plan.workers, f"{job_id}: partial placement {placement}"
            request = pending.pop(job_id)
            allocation = Allocation(
                job_id,
                request.priority,
                dict(placement),
                request.per_worker,
                now,
                request.preemptible,
                request.queue,
                None if request.est_runtime_s is None else now + request.est_runtime_s,
            )
            occupy(allocation, +1)  # asserts capacity
            running[job_id] = allocation
            job.waited_s += now - job.queued_since
            job.started_at = now
            job.first_start = now if job.first_start is None else job.first_start
            job.generation += 1
            remaining_s = (job.plan.steps - job.done_steps) * job.plan.step_s
            heapq.heappush(events, (now + remaining_s, seq, "finish", job_id, job.generation))
            seq += 1
        if outcome.events % 1000 == 0:
            _check_consistency(used, running)
            outcome.invariant_checks += 1

    _check_consistency(used, running)
    unfinished = [job_id for job_id, job in jobs.items() if job.finished_at is None]
    assert not unfinished and not pending and not running, f"{len(unfinished)} job(s) never finished"
    outcome.invariant_checks += 1
    first_submit = min(plan.submit for plan in plans)
    outcome.makespan_s = max(job.finished_at for job in jobs.values()) - first_submit
    outcome.gpu_useful_s = sum(p.gpus * p.steps * p.step_s for p in plans)
    return outcome


def _check_consistency(used: dict[str, dict[str, float]], running: dict[str, Allocation]) -> None:
    """The running total per node equals the sum over running jobs (no leak, nothing twice)."""
    expected = {node_id: dict.fromkeys(node_used, 0.0) for node_id, node_used in used.items()}
    for allocation in running.values():
        for node_id, count in allocation.placement.items():
            for res, amount in allocation.per_worker.items():
                expected[node_id][res] += amount * count
    for node_id, node_used in used.items():
        for res, amount in node_used.items():
            assert abs(expected[node_id][res] - amount) < 1e-3, f"{node_id}: {res} accounting drifted"


def summarize(outcome: Outcome, total_gpus: int) -> dict:
    jobs = outcome.jobs.values()
    waits = {
        PRIORITY_NAMES[level]: [job.waited_s for job in jobs if job.plan.priority == level]
        for level in sorted(PRIORITY_NAMES)
    }
    decision_ms = [s * 1e3 for s in outcome.decision_s]
    capacity_s = total_gpus * outcome.makespan_s
    return {
        "makespan_h": outcome.makespan_s / 3600,
        "gpu_utilisation": outcome.gpu_busy_s / capacity_s,
        "gpu_goodput": outcome.gpu_useful_s / capacity_s,
        # how well the GPUs are packed while there is work waiting (the part the policy decides)
        "gpu_utilisation_queued": outcome.gpu_busy_queued_s / (total_gpus * outcome.queued_s)
        if outcome.queued_s
        else None,
        "queued_h": outcome.queued_s / 3600,
        "wait_h": {
            name: {
                "jobs": len(values),
                "mean": statistics.fmean(values) / 3600 if values else 0.0,
                "p50": percentile(values, 50) / 3600,
                "p99": percentile(values, 99) / 3600,
            }
            for name, values in waits.items()
        },
        "preemptions": outcome.preemptions,
        "unacknowledged_preemptions": outcome.unacknowledged,
        "steps_lost": sum(job.lost_steps for job in jobs),
        "gpu_hours_lost": sum(job.lost_steps * job.plan.step_s * job.plan.gpus for job in jobs) / 3600,
        "decision_ms": decision_summary(decision_ms),
        "max_pending": outcome.max_pending,
        "invariant_checks": outcome.invariant_checks,
        "invariants_held": True,  # any violation stops the run with an AssertionError
    }


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


def compare(policy: dict, fifo: dict) -> dict:
    def ratio(a: float, b: float) -> float | None:
        return a / b if b > 0 else None

    return {
        "utilisation_ratio": ratio(policy["gpu_utilisation"], fifo["gpu_utilisation"]),
        "utilisation_queued_ratio": ratio(
            policy["gpu_utilisation_queued"] or 0.0, fifo["gpu_utilisation_queued"] or 0.0
        ),
        "makespan_ratio": ratio(policy["makespan_h"], fifo["makespan_h"]),
        "p99_wait_ratio": {
            name: ratio(policy["wait_h"][name]["p99"], fifo["wait_h"][name]["p99"])
            for name in policy["wait_h"]
        },
        "mean_wait_ratio": {
            name: ratio(policy["wait_h"][name]["mean"], fifo["wait_h"][name]["mean"])
            for name in policy["wait_h"]
        },
    }


def render_markdown(record: dict) -> str:
    cfg, policy, fifo, ratios = record["config"], record["policy"], record["fifo"], record["comparison"]

    def fmt(value: float | None, digits: int = 2) -> str:
        return "n/a" if value is None else f"{value:.{digits}f}"

    def fmt_share(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.1%}"

    lines = [
        "# Scheduling policy simulation",
        "",
        f"- {record['date']}; commit `{record['commit']}`; command: `{record['command']}`",
        f"- Python {record['machine']['python']} on {record['machine']['platform']},"
        f" {record['machine']['cpus']} CPU(s); wall time {record['wall_s']:.1f} s for both runs",
        f"- workload: {cfg['jobs']:,} jobs on {cfg['nodes']} nodes x {cfg['gpus_per_node']} GPUs"
        f" ({cfg['nodes'] * cfg['gpus_per_node']} GPUs), seed {cfg['seed']}, offered load {cfg['load']:.2f};"
        f" log-normal runtimes (median {cfg['median_runtime_s'] / 60:.0f} min, sigma {cfg['runtime_sigma']});"
        f" {cfg['estimate_share']:.0%} of jobs with a runtime estimate;"
        f" {cfg['no_ack_share']:.0%} of victims do not acknowledge (killed after {cfg['grace_s']:.0f} s)",
        "- wait: total time a job spent queued (first submission to start, plus every requeue);"
        " utilisation: GPU-time held by jobs over GPUs x makespan (while jobs wait: over the time some"
        " job was queued); goodput: GPU-time of the work that was kept",
        "",
        "| | Policy | FIFO | Policy / FIFO |",
        "|---|---:|---:|---:|",
        f"| makespan (h) | {policy['makespan_h']:.1f} | {fifo['makespan_h']:.1f}"
        f" | {fmt(ratios['makespan_ratio'])} |",
        f"| GPU utilisation | {policy['gpu_utilisation']:.1%} | {fifo['gpu_utilisation']:.1%}"
        f" | {fmt(ratios['utilisation_ratio'])} |",
        f"| GPU goodput | {policy['gpu_goodput']:.1%} | {fifo['gpu_goodput']:.1%} | |",
        f"| GPU utilisation while jobs wait | {fmt_share(policy['gpu_utilisation_queued'])}"
        f" | {fmt_share(fifo['gpu_utilisation_queued'])}"
        f" | {fmt(ratios['utilisation_queued_ratio'])} |",
    ]
    for name in policy["wait_h"]:
        p, f = policy["wait_h"][name], fifo["wait_h"][name]
        lines.append(
            f"| wait {name} ({p['jobs']} jobs): mean / p99 (h) | {p['mean']:.2f} / {p['p99']:.2f}"
            f" | {f['mean']:.2f} / {f['p99']:.2f}"
            f" | {fmt(ratios['mean_wait_ratio'][name])} / {fmt(ratios['p99_wait_ratio'][name])} |"
        )
    lines += [
        f"| preemptions (not acknowledged) | {policy['preemptions']} ({policy['unacknowledged_preemptions']})"
        f" | {fifo['preemptions']} | |",
        f"| steps lost (GPU-hours) | {policy['steps_lost']:,} ({policy['gpu_hours_lost']:.1f})"
        f" | {fifo['steps_lost']:,} | |",
        f"| largest queue | {policy['max_pending']:,} | {fifo['max_pending']:,} | |",
        "",
        "Decision time per event (one `schedule` call):",
        "",
        "| | events | mean ms | p50 ms | p99 ms | max ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label, result in (("Policy", policy), ("FIFO", fifo)):
        d = result["decision_ms"]
        lines.append(
            f"| {label} | {d['events']:,} | {d['mean']:.3f} | {d['p50']:.3f} | {d['p99']:.3f}"
            f" | {d['max']:.2f} |"
        )
    lines += [
        "",
        f"Invariants held in both runs (capacity, no job twice, every job finished;"
        f" {policy['invariant_checks']} full accounting checks in the policy run).",
        "",
    ]
    return "\n".join(lines)


def replay_trace(args: argparse.Namespace, argv: list[str] | None) -> int:
    """`--trace`: every policy on the trace, a line each, and the table as JSON (`--json`)."""
    from trace_sim import POLICIES, SimConfig, replay
    from traces import read_trace

    from core.queues import load_queue_config

    jobs = read_trace(args.trace)
    cfg = SimConfig(args.nodes or 8, args.gpus_per_node, args.preempt_cost_s, args.with_durations)
    queues = load_queue_config(args.queues) if args.queues else None
    names = args.policies.split(",") if args.policies else [*POLICIES, *(["configured"] if queues else [])]
    print(f"{args.trace}: {len(jobs):,} jobs on {cfg.nodes} nodes x {cfg.gpus_per_node} GPUs", flush=True)
    results = replay(jobs, cfg, names, queues, log=lambda line: print(line, flush=True))
    if args.json:
        record = {
            "trace": str(args.trace),
            "jobs": len(jobs),
            "config": cfg.__dict__,
            "commit": git_commit(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(
                ["python", Path(sys.argv[0]).as_posix(), *(sys.argv[1:] if argv is None else argv)]
            ),
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "policies": results,
        }
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
        print(f"written to {args.json}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, help="number of jobs (default 10,000; --quick: 300)")
    parser.add_argument("--nodes", type=int, help="simulated nodes (default 64; --quick: 8)")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--cpus-per-node", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--load", type=float, default=Config.load, help="offered GPU load (default 1.0)")
    parser.add_argument("--no-ack-share", type=float, default=Config.no_ack_share)
    parser.add_argument("--backfill-window", type=int, default=Config.backfill_window)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"), help="directory for the results")
    parser.add_argument("--quick", action="store_true", help="a small workload, for tests")
    parser.add_argument(
        "--trace", help="replay this trace (CSV: job_id,submit_time_s,num_gpus,duration_s,...)"
    )
    parser.add_argument("--policies", help="with --trace: comma-separated policy names (default: all)")
    parser.add_argument("--preempt-cost-s", type=float, default=60.0, help="stop handshake + restart")
    parser.add_argument("--with-durations", action="store_true", help="give our policies exact durations")
    parser.add_argument("--queues", help="with --trace: a queue config file, run as policy 'configured'")
    parser.add_argument("--json", help="with --trace: write the table as JSON here")
    args = parser.parse_args(argv)
    if args.trace:
        return replay_trace(args, argv)

    cfg = Config(
        jobs=args.jobs or (300 if args.quick else Config.jobs),
        nodes=args.nodes or (8 if args.quick else Config.nodes),
        gpus_per_node=args.gpus_per_node,
        cpus_per_node=args.cpus_per_node,
        seed=args.seed,
        load=args.load,
        no_ack_share=args.no_ack_share,
        backfill_window=args.backfill_window,
    )
    nodes = [
        Node(f"node-{i:03d}", {"GPU": float(cfg.gpus_per_node), "CPU": float(cfg.cpus_per_node)})
        for i in range(cfg.nodes)
    ]
    total_gpus = cfg.nodes * cfg.gpus_per_node
    plans = make_workload(cfg)
    print(
        f"{cfg.jobs:,} jobs on {cfg.nodes} nodes x {cfg.gpus_per_node} GPUs, seed {cfg.seed},"
        f" offered load {cfg.load:.2f}",
        flush=True,
    )

    wall = time.perf_counter()
    results = {}
    for name, policy in (
        ("policy", Policy(nodes, backfill_window=cfg.backfill_window, queues=PRIORITY_FIFO)),
        ("fifo", FifoPolicy(nodes)),
    ):
        started = time.perf_counter()
        outcome = simulate(name, policy, plans, cfg)
        results[name] = summarize(outcome, total_gpus)
        results[name]["wall_s"] = time.perf_counter() - started
        _print_result(name, results[name])
    wall = time.perf_counter() - wall
    ratios = compare(results["policy"], results["fifo"])
    print(
        f"Policy vs FIFO: utilisation x{ratios['utilisation_ratio']:.2f}, p99 wait "
        + ", ".join(
            f"{name} x{value:.2f}" if value is not None else f"{name} n/a"
            for name, value in ratios["p99_wait_ratio"].items()
        )
    )

    record = {
        "what": "orchestrator scheduling policy vs plain FIFO on a simulated cluster",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "command": " ".join(
            ["python", Path(sys.argv[0]).as_posix(), *(sys.argv[1:] if argv is None else argv)]
        ),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "config": cfg.__dict__,
        "workload": describe_workload(plans, total_gpus),
        "wall_s": wall,
        "policy": results["policy"],
        "fifo": results["fifo"],
        "comparison": ratios,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "scheduler_sim.json").write_text(json.dumps(record, indent=2) + "\n")
    (out / "scheduler_sim.md").write_text(render_markdown(record))
    print(f"written to {out / 'scheduler_sim.json'} and {out / 'scheduler_sim.md'} ({wall:.1f} s)")
    return 0


def _print_result(name: str, result: dict) -> None:
    d = result["decision_ms"]
    waits = ", ".join(f"{level} {w['mean']:.2f}/{w['p99']:.2f} h" for level, w in result["wait_h"].items())
    print(
        f"{name:6s} makespan {result['makespan_h']:.1f} h, GPU utilisation {result['gpu_utilisation']:.1%}"
        f" (goodput {result['gpu_goodput']:.1%}); wait mean/p99 {waits}; preemptions {result['preemptions']}"
        f" ({result['unacknowledged_preemptions']} not acknowledged, {result['steps_lost']:,} steps lost);"
        f" decision ms mean {d['mean']:.3f} p50 {d['p50']:.3f} p99 {d['p99']:.3f} max {d['max']:.2f}"
        f" over {d['events']:,} events; {result['wall_s']:.1f} s",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
