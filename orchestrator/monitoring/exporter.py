"""Prometheus metrics of the orchestrator: one endpoint per cluster, served by the service.

A custom collector builds every metric family at scrape time from what the service knows (the
job table, the newest metrics record of each running job, the cluster's nodes), so nothing can
drift or leak between scrapes. Names follow Prometheus conventions: base units (`_seconds`,
`_bytes`, `_ratio`), `_total` for counters, bounded labels: `job` (a job id), `rank`, and small
enums (`phase`, `state`, `kind`, `resource`) — never a step.

Per-job series are of the jobs that hold resources (admitted, running, stopping) and of those
that ended within `KEEP_FINISHED_S`, so that a dashboard shows how they ended, then dropped
(their full history stays in the metrics log in storage). Waiting jobs are counted, not listed:
by queue, priority and state, with the longest wait and the resources they ask for
(`orchestrator_queue_*`), as Kueue exports its pending workloads per ClusterQueue. At 10,000
waiting jobs, a series set per job was 250,000 samples and ten seconds a scrape
(docs/scaling.md).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

from core.jobs import TERMINAL_VALUES, JobState

KEEP_FINISHED_S = 3600.0
STATES = tuple(state.value for state in JobState)
SAVE_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

# training record field -> (metric name, help, scale)
TRAIN_GAUGES = {
    "step": ("orchestrator_train_step", "Newest training step", 1.0),
    "epoch": ("orchestrator_train_epoch", "Epoch of the newest step (fractional)", 1.0),
    "loss": ("orchestrator_train_loss", "Training loss (mean over the workers)", 1.0),
    "grad_norm": ("orchestrator_train_grad_norm", "Gradient norm before clipping", 1.0),
    "lr": ("orchestrator_train_learning_rate", "Learning rate", 1.0),
    "samples_per_s": (
        "orchestrator_train_samples_per_second",
        "Training samples per second, all workers",
        1.0,
    ),
    "tokens_per_s": ("orchestrator_train_tokens_per_second", "Training tokens per second, all workers", 1.0),
    "tflops_per_worker": ("orchestrator_train_flops_per_second", "Achieved model FLOP/s per worker", 1e12),
    "mfu": ("orchestrator_train_mfu_ratio", "Model FLOPs utilisation (none for fp8 runs)", 1.0),
    "time": ("orchestrator_train_record_time_seconds", "When rank 0 logged its last record (Unix time)", 1.0),
}
EVAL_GAUGES = {
    "eval_loss": ("orchestrator_eval_loss", "Evaluation loss"),
    "eval_accuracy": ("orchestrator_eval_accuracy_ratio", "Evaluation accuracy"),
    "eval_perplexity": ("orchestrator_eval_perplexity", "Evaluation perplexity"),
}
NOT_COUNTED = ("memory", "object_store_memory", "accelerator_type", "node:")  # bytes and labels, not slots
PHASES = {"data_s": "data", "compute_s": "compute", "sync_s": "sync", "optimizer_s": "optimizer"}
MEMORY = {
    "memory_allocated_bytes": "allocated",
    "memory_peak_allocated_bytes": "peak_allocated",
    "memory_peak_reserved_bytes": "peak_reserved",
}


class Snapshot(Protocol):
    """What the service hands the collector at scrape time."""

    def exporter_snapshot(self) -> dict[str, Any]:
        """{"jobs": [view of a job holding resources or ended + "latest": record | None,
        "latest_eval": record | None,
        "ranks": [newest record of each rank but 0], "checkpoint_saves": [seconds, ...],
        "checkpoint_bytes": int | None, "restarts": int],
        "waiting": [{"queue", "priority", "state", "jobs", "oldest_wait_s", "demand": {...}}],
        "nodes": [{"id", "capacity": {...}}], "busy": {resource: amount},
        "mlflow_waiting": {job id: records its MLflow run lacks}}"""
        ...


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class ServiceCollector(Collector):
    def __init__(self, source: Snapshot):
        self.source = source

    def collect(self) -> Iterable:
        snapshot = self.source.exporter_snapshot()
        now = time.time()
        jobs = [
            j
            for j in snapshot["jobs"]
            if j["state"] not in TERMINAL_VALUES or now - (j.get("finished_at") or now) < KEEP_FINISHED_S
        ]
        yield from self._training(jobs)
        yield from self._jobs(jobs, now)
        yield from self._waiting(snapshot.get("waiting") or [])
        yield from self._cluster(snapshot)
        yield self._mlflow_waiting(snapshot.get("mlflow_waiting") or {})

    def _mlflow_waiting(self, waiting: dict[str, int]) -> GaugeMetricFamily:
        """Ended jobs whose MLflow run lacks records while the tracking server does not answer."""
        family = GaugeMetricFamily(
            "orchestrator_job_mlflow_records_waiting",
            "Records of the job's metrics log its MLflow run lacks while the server does not answer",
            labels=["job"],
        )
        for job_id, count in sorted(waiting.items()):
            family.add_metric([job_id], float(count))
        return family

    def _training(self, jobs: list[dict]) -> Iterable:
        gauges = {
            k: GaugeMetricFamily(name, text, labels=["job", "rank"])
            for k, (name, text, _) in TRAIN_GAUGES.items()
        }
        evals = {k: GaugeMetricFamily(name, text, labels=["job"]) for k, (name, text) in EVAL_GAUGES.items()}
        phases = GaugeMetricFamily(
            "orchestrator_train_step_phase_seconds",
            "Mean time per step in each phase over the last logging interval",
            labels=["job", "rank", "phase"],
        )
        memory = GaugeMetricFamily(
            "orchestrator_device_memory_bytes", "Device memory of the worker", labels=["job", "rank", "kind"]
        )
        saves = HistogramMetricFamily(
            "orchestrator_checkpoint_save_seconds",
            "Time training waited for each checkpoint save",
            labels=["job"],
        )
        size = GaugeMetricFamily(
            "orchestrator_checkpoint_size_bytes", "Size of the newest checkpoint", labels=["job"]
        )
        stragglers = GaugeMetricFamily(
            "orchestrator_straggler_ratio",
            "A rank's compute time per step over the median rank's (over 1.2: a straggler)",
            labels=["job", "rank", "node"],
        )
        for job in jobs:
            for s in job.get("straggler_ratios") or []:
                stragglers.add_metric([job["id"], str(s["rank"]), s.get("node") or ""], float(s["ratio"]))
            record, rank = job.get("latest") or {}, str((job.get("latest") or {}).get("rank", 0))
            for key, family in gauges.items():
                if _finite(record.get(key)):
                    family.add_metric([job["id"], rank], float(record[key]) * TRAIN_GAUGES[key][2])
            # the step time split and memory of every rank: rank 0's from its logged record,
            # the others' from the newest record each sent
            for ranked in [record, *(job.get("ranks") or [])]:
                r = str(ranked.get("rank", 0))
                for key, phase in PHASES.items():
                    if _finite(ranked.get(key)):
                        phases.add_metric([job["id"], r, phase], float(ranked[key]))
                for key, kind in MEMORY.items():
                    if _finite(ranked.get(key)):
                        memory.add_metric([job["id"], r, kind], float(ranked[key]))
            for key, family in evals.items():
                value = (job.get("latest_eval") or {}).get(key)
                if _finite(value):
                    family.add_metric([job["id"]], float(value))
            observed = job.get("checkpoint_saves") or []
            if observed:
                buckets = [(str(b), float(sum(1 for s in observed if s <= b))) for b in SAVE_BUCKETS]
                buckets.append(("+Inf", float(len(observed))))
                saves.add_metric([job["id"]], buckets, sum_value=float(sum(observed)))
            if _finite(job.get("checkpoint_bytes")):
                size.add_metric([job["id"]], float(job["checkpoint_bytes"]))
        yield from gauges.values()
        yield from evals.values()
        yield from (phases, memory, saves, size, stragglers)

    def _jobs(self, jobs: list[dict], now: float) -> Iterable:
        state = GaugeMetricFamily(
            "orchestrator_job_state", "1 for the job's current state", labels=["job", "state"]
        )
        wait = GaugeMetricFamily(
            "orchestrator_job_queue_wait_seconds",
            "Time in the queue until admission (every wait of a requeued job)",
            labels=["job"],
        )
        start = GaugeMetricFamily(
            "orchestrator_job_start_time_seconds", "When the job was admitted (Unix time)", labels=["job"]
        )
        end = GaugeMetricFamily(
            "orchestrator_job_end_time_seconds", "When the job ended (Unix time)", labels=["job"]
        )
        priority = GaugeMetricFamily(
            "orchestrator_job_priority", "The job's scheduling priority", labels=["job"]
        )
        restarts = CounterMetricFamily(
            "orchestrator_job_restarts", "Restarts of the job's worker group or driver", labels=["job"]
        )
        preemptions = CounterMetricFamily(
            "orchestrator_job_preemptions", "Times the job was preempted", labels=["job"]
        )
        lost = CounterMetricFamily(
            "orchestrator_job_steps_lost",
            "Training steps redone after preemptions and failures",
            labels=["job"],
        )
        # a rollback moves seconds from training to lost: the training series may step down
        seconds = CounterMetricFamily(
            "orchestrator_job_time",
            "Seconds of the job's wall time in each bucket of its time ledger (docs/monitoring.md)",
            labels=["job", "bucket"],
            unit="seconds",
        )
        hung = GaugeMetricFamily(
            "orchestrator_job_hung",
            "1 from when the hang detector finds the job stalled until it steps again",
            labels=["job"],
        )
        goodput = GaugeMetricFamily(
            "orchestrator_job_goodput_ratio",
            "Kept training time over wall time (scheduling x runtime goodput)",
            labels=["job"],
        )
        for job in jobs:
            for s in STATES:
                state.add_metric([job["id"], s], 1.0 if job["state"] == s else 0.0)
            waited = job.get("waited_s")  # time in the queue only, every wait of a requeued job
            if waited is None:
                waited = (job.get("admitted_at") or now) - job["submitted_at"]
            wait.add_metric([job["id"]], max(waited, 0.0))
            if job["state"] == "running":
                hung.add_metric([job["id"]], 1.0 if job.get("hung") else 0.0)
            ledger = job.get("ledger") or {}
            for bucket, value in (ledger.get("buckets") or {}).items():
                seconds.add_metric([job["id"], bucket], float(value))
            if _finite((ledger.get("goodput") or {}).get("time")):
                goodput.add_metric([job["id"]], float(ledger["goodput"]["time"]))
            if job.get("admitted_at"):
                start.add_metric([job["id"]], job["admitted_at"])
            if job.get("finished_at"):
                end.add_metric([job["id"]], job["finished_at"])
            priority.add_metric([job["id"]], float(job["priority"]))
            restarts.add_metric([job["id"]], float(job.get("restarts") or 0))
            preemptions.add_metric([job["id"]], float(job.get("preemptions") or 0))
            lost.add_metric([job["id"]], float(job.get("steps_lost") or 0))
        yield from (state, wait, start, end, priority, restarts, preemptions, lost, seconds, goodput, hung)

    def _waiting(self, groups: list[dict]) -> Iterable:
        """The waiting jobs, by queue, priority and state (`Views.waiting`)."""
        queued = GaugeMetricFamily(
            "orchestrator_queue_length", "Jobs waiting in the queue", labels=["priority"]
        )
        pending = GaugeMetricFamily(
            "orchestrator_queue_pending_jobs",
            "Jobs waiting in the queue, by queue, priority and state (queued, preempted)",
            labels=["queue", "priority", "state"],
        )
        oldest = GaugeMetricFamily(
            "orchestrator_queue_oldest_wait_seconds",
            "The longest time in the queue of a job waiting now (every wait of a requeued job)",
            labels=["queue", "priority"],
        )
        demand = GaugeMetricFamily(
            "orchestrator_queue_pending_resources",
            "Resources the waiting jobs ask for together, at their full size",
            labels=["queue", "priority", "resource"],
        )
        counts: dict[int, int] = {}
        waits: dict[tuple[str, str], float] = {}
        asked: dict[tuple[str, str, str], float] = {}
        for g in groups:
            queue, level = str(g["queue"]), str(g["priority"])
            counts[g["priority"]] = counts.get(g["priority"], 0) + g["jobs"]
            pending.add_metric([queue, level, g["state"]], float(g["jobs"]))
            waits[(queue, level)] = max(waits.get((queue, level), 0.0), float(g["oldest_wait_s"]))
            for resource, amount in g["demand"].items():
                if not resource.startswith(NOT_COUNTED):
                    key = (queue, level, resource)
                    asked[key] = asked.get(key, 0.0) + amount
        for level, count in sorted(counts.items()):
            queued.add_metric([str(level)], float(count))
        for labels, wait in waits.items():
            oldest.add_metric(list(labels), wait)
        for labels, amount in asked.items():
            demand.add_metric(list(labels), amount)
        yield from (queued, pending, oldest, demand)

    def _cluster(self, snapshot: dict) -> Iterable:
        resources = GaugeMetricFamily(
            "orchestrator_cluster_resources",
            "Resources of the cluster, held by admitted jobs (busy) or not (free)",
            labels=["resource", "state"],
        )
        total: dict[str, float] = {}
        for node in snapshot["nodes"]:
            for name, amount in node["capacity"].items():
                if not name.startswith(NOT_COUNTED):
                    total[name] = total.get(name, 0.0) + amount
        busy = snapshot.get("busy", {})
        for name, amount in sorted(total.items()):
            used = min(busy.get(name, 0.0), amount)
            resources.add_metric([name, "busy"], used)
            resources.add_metric([name, "free"], amount - used)
        nodes = GaugeMetricFamily("orchestrator_cluster_nodes", "Alive nodes of the cluster")
        nodes.add_metric([], float(len(snapshot["nodes"])))
        nodes_lost = CounterMetricFamily(
            "orchestrator_cluster_nodes_lost", "Nodes that died (not drained) since the service started"
        )
        nodes_lost.add_metric([], float(snapshot.get("nodes_lost", 0)))
        yield from (resources, nodes, nodes_lost)
        goodput = snapshot.get("goodput") or {}
        if _finite(goodput.get("time")):
            ratio = GaugeMetricFamily(
                "orchestrator_cluster_goodput_ratio",
                "Kept training time over wall time of the jobs known, weighted by their accelerators",
            )
            ratio.add_metric([], float(goodput["time"]))
            yield ratio


class _One(Collector):
    def __init__(self, metric):
        self.metric = metric

    def collect(self) -> Iterable:
        return [self.metric]


def exposition(registry: Collector) -> bytes:
    """`prometheus_client.generate_latest(registry)`, byte for byte, without its cost per
    sample: it checks and escapes every label name of every sample (20 us each here, a second
    for the 50,000 samples of 1,000 running jobs). Label names here are fixed and valid; label
    values are escaped as it does. A family of another type than gauge, counter or histogram,
    or with timestamps, goes through `generate_latest` itself."""
    out: list[str] = []
    for metric in registry.collect():
        kind, name = metric.type, metric.name
        other = ("_created", "_gsum", "_gcount")  # OpenMetrics' own samples
        if kind not in ("gauge", "counter", "histogram") or any(
            s.timestamp is not None or s.name.endswith(other) for s in metric.samples
        ):
            out.append(generate_latest(_One(metric)).decode())
            continue
        name += "_total" if kind == "counter" else ""
        text = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {text}\n# TYPE {name} {kind}\n")
        for s in metric.samples:
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(s.labels.items()))
            out.append(f"{s.name}{{{labels}}}" if labels else s.name)
            out.append(f" {floatToGoString(s.value)}\n")
    return "".join(out).encode()


def _escape(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def registry_for(source: Snapshot) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ServiceCollector(source))
    return registry


EXPORTED = sorted(
    [name for name, _, _ in TRAIN_GAUGES.values()]
    + [name for name, _ in EVAL_GAUGES.values()]
    + [
        "orchestrator_train_step_phase_seconds",
        "orchestrator_device_memory_bytes",
        "orchestrator_checkpoint_save_seconds",
        "orchestrator_checkpoint_size_bytes",
        "orchestrator_straggler_ratio",
        "orchestrator_job_state",
        "orchestrator_job_queue_wait_seconds",
        "orchestrator_job_start_time_seconds",
        "orchestrator_job_end_time_seconds",
        "orchestrator_job_priority",
        "orchestrator_job_restarts_total",
        "orchestrator_job_preemptions_total",
        "orchestrator_job_steps_lost_total",
        "orchestrator_job_time_seconds_total",
        "orchestrator_job_goodput_ratio",
        "orchestrator_job_hung",
        "orchestrator_job_mlflow_records_waiting",
        "orchestrator_queue_length",
        "orchestrator_queue_pending_jobs",
        "orchestrator_queue_oldest_wait_seconds",
        "orchestrator_queue_pending_resources",
        "orchestrator_cluster_resources",
        "orchestrator_cluster_nodes",
        "orchestrator_cluster_nodes_lost_total",
        "orchestrator_cluster_goodput_ratio",
    ]
)  # every metric name this exporter can produce (counters with their _total), for the dashboard's test
