"""Trace replay: every policy on the same job trace, with the published baselines beside it.

Called by `bench/scheduler_sim.py --trace FILE.csv` (see `bench/traces.py` for the format).
No Ray: the policies' `schedule` is called on every event (a job arriving, ending, a victim
having stopped, or a `Decision.wake_at` time) and the decisions are applied to a simulated
cluster of `nodes` x `gpus_per_node` GPUs (the last node may have fewer: `SimConfig.of_gpus`).

Placement rule: one GPU per worker; a job of up to G GPUs (G per node) runs on one node (one
gang of its GPUs), a larger one on whole nodes: ceil(GPUs / G) nodes, all G GPUs of each
(Tiresias' consolidated placement; the rest of a last partial node stays idle).

A preemption costs `preempt_cost_s` (60 s by default): the victim holds its GPUs for half of
it without progress (the stop handshake and checkpoint), and when it starts again the other
half passes before it makes progress (the restart). Nothing else is lost (zero-loss
preemption). Policies run without durations unless `with_durations`; the baselines that need
them (`fifo-backfill`, `sjf-oracle`) always get the exact ones.
"""

from __future__ import annotations

import heapq
import math
import statistics
import time
from dataclasses import dataclass, field

from las_candidates import CANDIDATES
from sim_stats import decision_summary, percentile
from traces import TraceJob

from bench.fifo import FifoPolicy
from core.queues import QueueConfig, validate_queue_config
from orchestrator.policy import Allocation, Decision, JobRequest, Node, Policy
from orchestrator.policy.admission import free_capacity, place
from orchestrator.policy.las import LAS_SHARE_SETTINGS, LAS_SHARE_TUNING

POLICIES = ("fifo", "fifo-backfill", "sjf-oracle", "default", "las", "las+cohorts", "las-share")
ORACLES = {"fifo-backfill", "sjf-oracle"}  # always given exact durations


@dataclass
class SimConfig:
    nodes: int
    gpus_per_node: int
    preempt_cost_s: float = 60.0
    with_durations: bool = False
    last_node_gpus: int | None = None  # fewer GPUs on the last node (a cluster sized in GPUs)

    @classmethod
    def of_gpus(cls, gpus: int, gpus_per_node: int, **kwargs) -> SimConfig:
        """`gpus` GPUs as full nodes and one partial node for the rest (a load sweep sizes
        clusters in GPUs: whole nodes are too coarse for a VC of 16 GPUs)."""
        nodes, rest = divmod(gpus, gpus_per_node)
        return cls(nodes + bool(rest), gpus_per_node, last_node_gpus=rest or None, **kwargs)

    def node_gpus(self) -> list[int]:
        sizes = [self.gpus_per_node] * self.nodes
        if self.last_node_gpus is not None:
            sizes[-1] = self.last_node_gpus
        return sizes

    @property
    def total_gpus(self) -> int:
        return sum(self.node_gpus())

    def full_nodes(self) -> int:
        return sum(size == self.gpus_per_node for size in self.node_gpus())


class SjfOracle:
    """Shortest job first on exact durations: every pass starts the shortest jobs that fit,
    skipping those that do not (no reservation, no preemption). An upper bound on what
    ordering alone can do for the average JCT; no real scheduler knows the durations."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes

    def schedule(self, now: float, pending: list[JobRequest], running: list[Allocation]) -> Decision:
        free = free_capacity(self.nodes, running)
        decision = Decision()
        for job in sorted(pending, key=lambda j: (j.est_runtime_s, j.submitted_at, j.id)):
            placement = place(job, free)
            if placement is not None:
                for node_id, count in placement.items():
                    free[node_id]["GPU"] -= job.per_worker["GPU"] * count
                decision.admit.append((job.id, placement))
        return decision


def queue_config(
    jobs: list[TraceJob], total_gpus: int, cohorts: bool, las: dict | None = None
) -> QueueConfig:
    """Every queue of the trace with order `las`; with `cohorts`, all in one cohort with equal
    nominal quotas that add up to the cluster (and no borrowing limit). `las`: LAS settings
    (the queue file's `las:` section; None: the defaults)."""
    names = sorted({job.queue for job in jobs})
    share = total_gpus / len(names)
    queues = {
        name: {"order": "las", **({"cohort": "all", "nominal": {"GPU": share}} if cohorts else {})}
        for name in names
    }
    raw = {"cohorts": ["all"] if cohorts else [], "queues": queues}
    return validate_queue_config(raw | ({"las": las} if las is not None else {}))


def make_policy(name: str, nodes: list[Node], jobs: list[TraceJob], total_gpus: int, queues=None):
    if name == "fifo":
        return FifoPolicy(nodes)
    if name == "fifo-backfill":  # FIFO within a priority level: EASY backfill is all that reorders
        return Policy(nodes, preemption=False, queues=validate_queue_config({"order": "fifo"}))
    if name == "sjf-oracle":
        return SjfOracle(nodes)
    if name == "default":  # what the service runs with no queue file: las-share since issue 34
        return Policy(nodes)
    if name in ("las", "las+cohorts"):
        return Policy(nodes, queues=queue_config(jobs, total_gpus, cohorts=name == "las+cohorts"))
    if name == "las-share":  # LAS with the top share and victims in reverse queue order (`las.py`)
        config = queue_config(jobs, total_gpus, cohorts=False, las=LAS_SHARE_SETTINGS.model_dump())
        return Policy(nodes, queues=config, las_tuning=LAS_SHARE_TUNING)
    if name == "configured":
        return Policy(nodes, queues=queues)
    if name in CANDIDATES:  # issue 51's sweep: LAS settings and tuning tried against `default`
        las, tuning = CANDIDATES[name]
        return Policy(nodes, queues=queue_config(jobs, total_gpus, cohorts=False, las=las), las_tuning=tuning)
    raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")


@dataclass
class Run:
    """One job in the simulation."""

    job: TraceJob
    workers: int
    per_worker: dict[str, float]
    remaining_s: float  # work left, in seconds of running
    request: JobRequest | None = None
    attained_s: float = 0.0  # GPU-seconds held in finished attempts
    queued_since: float = 0.0
    waited_s: float = 0.0
    started_at: float | None = None
    restart_s: float = 0.0  # the overhead before this attempt makes progress
    generation: int = 0
    preemptions: int = 0
    finished_at: float | None = None

    @property
    def gpus(self) -> float:
        return self.per_worker["GPU"] * self.workers


@dataclass
class Outcome:
    runs: dict[str, Run]
    decision_s: list[float] = field(default_factory=list)
    busy_gpu_s: float = 0.0
    waiting_s: float = 0.0  # time during which some job waited
    busy_waiting_gpu_s: float = 0.0
    idle_short_gpu_s: float = 0.0  # idle while every waiting job needs more GPUs than are free
    contended_s: float = 0.0  # time during which every queue had a job waiting
    queue_gpu_s: dict[str, float] = field(default_factory=dict)  # GPU-time per queue, contended
    makespan_s: float = 0.0


def shape(gpus: int, per_node: int) -> tuple[int, dict[str, float]]:
    """Workers and GPUs per worker under the placement rule (module docstring)."""
    if gpus <= per_node:
        return 1, {"GPU": float(gpus)}
    return math.ceil(gpus / per_node), {"GPU": float(per_node)}


def simulate(policy, jobs: list[TraceJob], cfg: SimConfig, oracle: bool) -> Outcome:
    """Replay `jobs` under `policy` to the last job's end, checking capacity on the way."""
    per_node = cfg.gpus_per_node
    runs = {job.id: Run(job, *shape(job.gpus, per_node), remaining_s=job.duration) for job in jobs}
    queues = sorted({job.queue for job in jobs})
    out = Outcome(runs, queue_gpu_s=dict.fromkeys(queues, 0.0))
    events = [(job.submit, index, "arrive", job.id, 0) for index, job in enumerate(jobs)]
    heapq.heapify(events)
    seq = len(events)
    pending: dict[str, JobRequest] = {}
    running: dict[str, Allocation] = {}
    capacity = {f"n{i:04d}": float(size) for i, size in enumerate(cfg.node_gpus())}
    used = dict.fromkeys(capacity, 0.0)
    total_gpus = cfg.total_gpus
    half = cfg.preempt_cost_s / 2
    clock, busy, last_wake = events[0][0], 0.0, None
    short = False  # after the last pass: every waiting job needs more GPUs than are free in all
    queue_busy = dict.fromkeys(queues, 0.0)

    def enqueue(run: Run, now: float) -> None:
        run.queued_since = now
        est = run.remaining_s + run.restart_s if oracle else None
        job = run.job
        run.request = JobRequest(
            job.id, job.priority, run.workers, run.per_worker, job.submit, True, job.queue, est,
            user=job.user, attained_s=run.attained_s, queued_since=now,
        )  # fmt: skip
        pending[job.id] = run.request

    def occupy(allocation: Allocation, sign: int) -> None:
        nonlocal busy
        for node_id, count in allocation.placement.items():
            used[node_id] += sign * allocation.per_worker["GPU"] * count
            assert -1e-6 <= used[node_id] <= capacity[node_id] + 1e-6, f"{node_id} over capacity"
        gpus = allocation.per_worker["GPU"] * allocation.workers
        busy += sign * gpus
        queue_busy[allocation.queue] += sign * gpus

    def stop(run: Run, now: float) -> None:
        """The attempt ends: its GPUs come free and its service is added up."""
        occupy(running.pop(run.job.id), -1)
        run.attained_s += (now - run.started_at) * run.gpus
        run.generation += 1
        run.started_at = None

    while events:
        now = events[0][0]
        span = now - clock
        out.busy_gpu_s += busy * span
        if pending:
            out.waiting_s += span
            out.busy_waiting_gpu_s += busy * span
            if short:
                out.idle_short_gpu_s += (total_gpus - busy) * span
            if len(queues) > 1 and len({pending_job.queue for pending_job in pending.values()}) == len(
                queues
            ):
                out.contended_s += span
                for name, amount in queue_busy.items():
                    out.queue_gpu_s[name] += amount * span
        clock = now
        while events and events[0][0] == now:
            _, _, kind, job_id, generation = heapq.heappop(events)
            if kind == "wake":
                continue
            run = runs[job_id]
            if kind == "arrive":
                enqueue(run, now)
            elif generation != run.generation:
                continue  # an event of an attempt that is over
            elif kind == "finish":
                stop(run, now)
                run.remaining_s, run.finished_at = 0.0, now
            elif kind == "stopped":
                stop(run, now)
                run.restart_s = half
                enqueue(run, now)

        started = time.perf_counter()
        decision = policy.schedule(now, list(pending.values()), list(running.values()))
        out.decision_s.append(time.perf_counter() - started)
        assert not decision.resize, "trace jobs are not elastic"
        for victim_id in decision.preempt:
            run = runs[victim_id]
            allocation = running[victim_id]
            assert not allocation.stopping, f"{victim_id} is already stopping"
            allocation.stopping = True
            run.preemptions += 1
            progress = max(0.0, now - run.started_at - run.restart_s)
            run.remaining_s = max(0.0, run.remaining_s - progress)
            run.generation += 1  # its finish event no longer counts
            heapq.heappush(events, (now + half, seq, "stopped", victim_id, run.generation))
            seq += 1
        for job_id, placement in decision.admit:
            run = runs[job_id]
            assert job_id in pending and job_id not in running, f"{job_id} admitted twice"
            assert sum(placement.values()) == run.workers, f"{job_id}: partial placement"
            request = pending.pop(job_id)
            allocation = Allocation(
                job_id, request.priority, dict(placement), run.per_worker, now, True, request.queue,
                None if request.est_runtime_s is None else now + request.est_runtime_s,
                user=request.user, attained_s=run.attained_s, submitted_at=request.submitted_at,
            )  # fmt: skip
            occupy(allocation, +1)
            running[job_id] = allocation
            run.waited_s += now - run.queued_since
            run.started_at = now
            run.generation += 1
            end = now + run.restart_s + run.remaining_s
            heapq.heappush(events, (end, seq, "finish", job_id, run.generation))
            seq += 1
        free_gpus = total_gpus - busy
        short = bool(pending) and min(runs[job_id].gpus for job_id in pending) > free_gpus + 1e-9
        wake = getattr(decision, "wake_at", None)
        if wake is not None and wake != last_wake:
            heapq.heappush(events, (wake, seq, "wake", "", 0))
            seq, last_wake = seq + 1, wake

    unfinished = [job_id for job_id, run in runs.items() if run.finished_at is None]
    assert not unfinished and not pending and not running, f"{len(unfinished)} job(s) never finished"
    out.makespan_s = max(run.finished_at for run in runs.values()) - min(job.submit for job in jobs)
    return out


def summarize(out: Outcome, total_gpus: int, fair: dict[str, float]) -> dict:
    runs = list(out.runs.values())
    jct = [run.finished_at - run.job.submit for run in runs]
    decision_ms = [s * 1e3 for s in out.decision_s]
    result = {
        "avg_jct_s": statistics.fmean(jct),
        "median_jct_s": percentile(jct, 50),
        "p99_jct_s": percentile(jct, 99),
        "avg_wait_s": statistics.fmean(run.waited_s for run in runs),
        "makespan_s": out.makespan_s,
        "utilisation": out.busy_gpu_s / (total_gpus * out.makespan_s),
        "utilisation_while_waiting": out.busy_waiting_gpu_s / (total_gpus * out.waiting_s)
        if out.waiting_s
        else None,
        # the idle GPU-time while jobs wait that no placement could use: every waiting job
        # needed more GPUs than were free in all (the rest: spread over nodes, reserved, quota)
        "idle_short_while_waiting": out.idle_short_gpu_s / (total_gpus * out.waiting_s)
        if out.waiting_s
        else None,
        "preemptions_per_job": sum(run.preemptions for run in runs) / len(runs),
        "decision_ms": decision_summary(decision_ms),
    }
    if len(fair) > 1:
        total = sum(out.queue_gpu_s.values())
        shares = {name: (out.queue_gpu_s[name] / total if total else None) for name in fair}
        result["fair_share"] = {
            "contended_s": out.contended_s,
            "queues": {name: {"share": shares[name], "fair_share": fair[name]} for name in fair},
            "jain": jain([shares[name] / fair[name] for name in fair]) if total else None,
        }
    return result


def jain(values: list[float]) -> float:
    """Jain's fairness index: 1 when every queue gets its fair share, 1/n at worst."""
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


def replay(jobs: list[TraceJob], cfg: SimConfig, names, queues: QueueConfig | None = None, log=print) -> dict:
    """Every policy in `names` on the trace: policy name -> summary (with its wall time)."""
    total_gpus = cfg.total_gpus
    nodes = [Node(f"n{i:04d}", {"GPU": float(size)}) for i, size in enumerate(cfg.node_gpus())]
    biggest = max(cfg.node_gpus())
    for job in jobs:
        workers, per_worker = shape(job.gpus, cfg.gpus_per_node)
        if workers > (cfg.full_nodes() if workers > 1 else 1) or per_worker["GPU"] > biggest:
            raise ValueError(f"job {job.id} needs {job.gpus} GPUs, more than the cluster's {total_gpus}")
    names_in_trace = sorted({job.queue for job in jobs})
    fair = {name: 1 / len(names_in_trace) for name in names_in_trace}
    results = {}
    for name in names:
        policy = make_policy(name, nodes, jobs, total_gpus, queues)
        started = time.perf_counter()
        out = simulate(policy, jobs, cfg, oracle=name in ORACLES or cfg.with_durations)
        results[name] = summarize(out, total_gpus, fair)
        results[name]["wall_s"] = time.perf_counter() - started
        log(format_row(name, results[name]))
    return results


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def format_row(name: str, r: dict) -> str:
    d = r["decision_ms"]
    line = (
        f"{name:13s} avg JCT {r['avg_jct_s'] / 3600:7.2f} h, median {r['median_jct_s'] / 3600:6.2f} h,"
        f" p99 {r['p99_jct_s'] / 3600:7.2f} h, avg wait {r['avg_wait_s'] / 3600:6.2f} h,"
        f" makespan {r['makespan_s'] / 3600:7.1f} h, utilisation {r['utilisation']:.1%}"
        f" ({_share(r['utilisation_while_waiting'])} while jobs wait),"
        f" preemptions/job {r['preemptions_per_job']:.2f}; decision p99 {d['p99']:.2f} ms;"
        f" {r['wall_s']:.1f} s"
    )
    fair = r.get("fair_share")
    if fair and fair["jain"] is not None:
        shares = ", ".join(
            f"{q} {v['share']:.1%} (fair {v['fair_share']:.0%})" for q, v in fair["queues"].items()
        )
        line += f"\n{'':13s} GPU time while every queue waits: {shares}; Jain {fair['jain']:.3f}"
    return line
