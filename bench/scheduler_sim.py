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

The workload and the records are bench/scheduler_sim_workload.py's; the summary and the
markdown, bench/scheduler_sim_report.py's.
"""

from __future__ import annotations

import argparse
import datetime
import heapq
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

DECISION_P99_GOAL_MS = 10.0  # a decision holds the service's lock: well under a tick

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from provenance import git_commit  # noqa: E402  (bench/provenance.py: this script's folder is on sys.path)

from bench.fifo import FifoPolicy  # noqa: E402
from bench.scheduler_sim_report import compare, print_result, render_markdown, summarize  # noqa: E402
from bench.scheduler_sim_workload import (  # noqa: E402
    EPS,
    Config,
    JobPlan,
    Outcome,
    SimJob,
    describe_workload,
    make_workload,
)
from core.queues import validate_queue_config  # noqa: E402
from orchestrator.policy import Allocation, JobRequest, Node, Policy  # noqa: E402

# what this simulation measures: priorities, gangs, EASY backfill and preemption by priority,
# with FIFO within a level; it keeps no attained service, which the default order (las-share)
# needs: that order is replayed by `--trace` (`trace_sim.py`) and `scheduler_philly.py`
PRIORITY_FIFO = validate_queue_config({"order": "fifo"})


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
        print_result(name, results[name])
    wall = time.perf_counter() - wall
    ratios = compare(results["policy"], results["fifo"])
    p99 = results["policy"]["decision_ms"]["p99"]
    met = "met" if p99 < DECISION_P99_GOAL_MS else "missed"
    print(f"a scheduling decision, p99: {p99:.2f} ms (goal < {DECISION_P99_GOAL_MS:g} ms: {met})")
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


if __name__ == "__main__":
    sys.exit(main())
