"""The exporter's text (`exporter.exposition`, what GET /metrics serves) is
`prometheus_client.generate_latest`'s, byte for byte, for every kind of family the collector
builds; label values that need escaping included. And waiting jobs are counted per queue,
priority and state, never given series of their own. No Ray, no service: a made-up snapshot.
"""

import time

import prometheus_client
from prometheus_client.core import InfoMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from orchestrator.monitoring.exporter import exposition, registry_for

NOW = time.time()


class Source:
    def exporter_snapshot(self) -> dict:
        running = {
            "id": 'odd "job"\\ with\na newline',
            "state": "running",
            "priority": 5,
            "submitted_at": NOW - 100.0,
            "admitted_at": NOW - 90.0,
            "waited_s": 10.0,
            "latest": {"rank": 0, "step": 120, "loss": 1.5, "data_s": 0.01, "mfu": float("nan")},
            "ranks": [{"rank": 1, "compute_s": 0.2, "memory_allocated_bytes": 2.5e9}],
            "latest_eval": {"eval_loss": 1.75},
            "checkpoint_saves": [0.2, 3.0, 400.0],
            "checkpoint_bytes": 1_234_567_890,
            "restarts": 1,
            "ledger": {"buckets": {"training": 80.0, "queued": 10.0}, "goodput": {"time": 0.8}},
            "straggler_ratios": [{"rank": 1, "ratio": 1.25, "node": "10.0.0.2"}],
        }
        ended = {**running, "id": "ended", "state": "failed", "finished_at": NOW - 5.0, "latest": None}
        waiting = [
            {"queue": "research", "priority": 3, "state": "queued", "jobs": 7, "oldest_wait_s": 4000.0,
             "demand": {"GPU": 28.0, "CPU": 28.0, "memory": 1e9}},
            {"queue": "research", "priority": 3, "state": "preempted", "jobs": 2, "oldest_wait_s": 60.0,
             "demand": {"GPU": 4.0}},
        ]  # fmt: skip
        return {
            "jobs": [running, ended],
            "waiting": waiting,
            "nodes": [{"id": "n1", "capacity": {"GPU": 8.0, "CPU": 32.0, "memory": 1e11}}],
            "busy": {"GPU": 4.0},
            "nodes_lost": 1,
            "goodput": {"time": 0.5},
        }


class WithInfo(Collector):
    def collect(self):
        info = InfoMetricFamily("orchestrator_build", "A family of another kind", value={"version": "1"})
        return [info]


def test_the_text_is_generate_latests_byte_for_byte():
    registry = registry_for(Source())
    registry.register(WithInfo())  # goes through generate_latest itself
    assert exposition(registry) == prometheus_client.generate_latest(registry)
    empty = CollectorRegistry(auto_describe=False)
    assert exposition(empty) == prometheus_client.generate_latest(empty) == b""


def test_waiting_jobs_are_counted_per_queue_priority_and_state():
    text = exposition(registry_for(Source())).decode()
    assert 'orchestrator_queue_pending_jobs{priority="3",queue="research",state="queued"} 7.0' in text
    assert 'orchestrator_queue_pending_jobs{priority="3",queue="research",state="preempted"} 2.0' in text
    assert 'orchestrator_queue_oldest_wait_seconds{priority="3",queue="research"} 4000.0' in text
    assert 'orchestrator_queue_pending_resources{priority="3",queue="research",resource="GPU"} 32.0' in text
    demand = [line for line in text.splitlines() if line.startswith("orchestrator_queue_pending_resources{")]
    assert len(demand) == 2 and not any('resource="memory"' in line for line in demand)  # bytes, not slots
    assert 'orchestrator_queue_length{priority="3"} 9.0' in text
