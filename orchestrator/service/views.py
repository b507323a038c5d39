"""What the service shows: a job's view (the CLI's `status` and `queue`, the status page, the
HTTP API), the Prometheus exporter's snapshot, the cluster's goodput and use, and the use of
each configured queue. Plain JSON built from the service's tables; nothing here changes them.
The service calls these under its lock.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from core.jobs import JobState
from core.ledger import cluster_goodput
from orchestrator.client import attempt_name
from orchestrator.monitoring.exporter import KEEP_FINISHED_S
from orchestrator.monitoring.queue_query import QueueQuery
from orchestrator.policy.admission import add, scale
from orchestrator.policy.cohorts import CohortBook
from orchestrator.service.cycle import SchedulingCycle, allocation
from orchestrator.service.health import Watchdog
from orchestrator.service.live import LiveMetrics
from orchestrator.service.store import JobRecord
from orchestrator.service.table import TERMINAL, table_of

GOODPUT_EVERY_S = 2.0  # the cluster's goodput is summed at most this often


class Views:
    def __init__(
        self,
        jobs: dict[str, JobRecord],
        live: dict[str, LiveMetrics],
        watchdog: Watchdog,
        cycle: SchedulingCycle,
    ):
        self.jobs, self.live, self.watchdog, self.cycle = table_of(jobs), live, watchdog, cycle
        self._goodput: dict[float | None, tuple[float, dict]] = {}  # since -> (when, goodput)

    def job(self, job: JobRecord, history: bool = True) -> dict[str, Any]:
        """A job's record as plain JSON, with what the service knows of it beyond the record."""
        view = job.to_json(spec=False, history=history, ledger=False)  # the typed spec stays here
        view["ledger"] = job.ledger.view(time.time(), self.mfu(job.id)) if job.ledger is not None else None
        view["note"] = self.cycle.notes.get(job.id)
        view["stragglers"] = self.watchdog.stragglers(job.id) if job.state.holds_resources else []
        watch = self.watchdog.watches.get(job.id) if job.state.holds_resources else None
        view["hung"] = bool(watch is not None and watch.clock.fired)  # until it steps again
        view["remaining_s"] = job.remaining_s
        view["waited_s"] = job.waited(time.time())
        res = job.spec.resources
        view["elastic"] = [res.min_workers, res.max_workers] if res.elastic else None
        # what runs it: its attempt's controller
        view["submission"] = job.submission_id or (attempt_name(job.id, job.attempt) if job.attempt else None)
        return view

    def queue(self, include_finished: bool = False, waiting: int | None = None) -> list[dict[str, Any]]:
        """The jobs in queue order (`queue_key`); `waiting`: only the first that many of the
        jobs waiting (the rest are counted in `cluster()["jobs"]`), for a person reading a
        queue of thousands."""
        order = self.cycle.admission_order(time.time())
        pending = [self.jobs[job_id] for job_id in (order if waiting is None else order[:waiting])]
        holding = sorted(self.jobs.holding(), key=_age_order)
        ended = sorted(self.jobs.in_states(TERMINAL), key=_age_order) if include_finished else []
        return [self.job(j, history=False) for j in [*holding, *pending, *ended]]

    def queue_page(self, query: QueueQuery) -> dict[str, Any]:
        """One page of the jobs `query` asks for, in queue order, with how many match it and
        how many match its search in each state (`GET /api/queue?offset=&limit=&state=&q=`).
        Views are built for the page's jobs only: 50 of them, not the 11,000 in the table."""
        page = query.select(self.jobs.values(), _state_name, self._searched, self.queue_key())
        return page.reply(query, [self.job(j, history=False) for j in page.jobs])

    def queue_key(self) -> Callable[[JobRecord], tuple]:
        """Sort key of the queue as shown: the jobs holding resources, then the waiting ones in
        the order the policy admits them (`SchedulingCycle.admission_order`: the one order, the
        scheduler's), then the finished ones; each of the first and last by priority and age."""
        rank = {job_id: n for n, job_id in enumerate(self.cycle.admission_order(time.time()))}

        def key(job: JobRecord) -> tuple:
            if job.state.holds_resources:
                return (0, 0, *_age_order(job))
            if job.id in rank:
                return (1, rank[job.id], 0, 0.0, "")
            return (2, 0, *_age_order(job))

        return key

    def _searched(self, job: JobRecord) -> tuple[str | None, ...]:
        """The fields a search looks in, queue_query.SEARCHED's, in its order."""
        note = self.cycle.notes.get(job.id)
        return (job.id, job.name, job.run, job.queue, job.user, job.sweep, job.state.value, note, job.reason)

    def cluster(self) -> dict[str, Any]:
        """The cluster's part of the service's `info()`: nodes, resources, jobs by state, goodput
        and queues."""
        cycle = self.cycle
        counts = {s.value: self.jobs.count(s) for s in JobState if self.jobs.count(s)}
        return {
            "resources": {"total": self.total(), "busy": self.busy()},
            "nodes": len(cycle.nodes),
            "draining": sorted(cycle.draining),
            "unreachable": cycle.watch.unreachable(),  # Ray lists them alive; their raylets do not answer
            "node_events": list(cycle.node_events),
            # nodes the autoscaler may still add, by type, and what it was asked for (None: no autoscaler)
            "autoscaler": None
            if cycle.node_types is None
            else {"may_add": dict(cycle.scale_left), "asked_for": dict(cycle.scaling_for)},
            "jobs": counts,
            "goodput": self.cluster_goodput(time.time()),
            "queues": self.queues(),
        }

    def exporter_snapshot(self) -> dict[str, Any]:
        """What the Prometheus collector reads at each scrape (see monitoring/exporter.py): a
        view of each job that holds resources or ended within `KEEP_FINISHED_S`, and the
        waiting jobs counted by queue, priority and state (`waiting()`), not one by one."""
        now, jobs = time.time(), []
        ended = (j for j in self.jobs.in_states(TERMINAL) if now - (j.finished_at or now) < KEEP_FINISHED_S)
        for job in [*self.jobs.holding(), *ended]:
            view = self.job(job, history=False)
            live = self.live.get(job.id)
            view.update(live.snapshot() if live else {})
            view["straggler_ratios"] = self.watchdog.ratios(job.id) if job.state.holds_resources else []
            view["restarts"] = (live.restarts if live else 0) + sum(
                1 for e in job.history if e["event"] == "driver-exited"
            )
            jobs.append(view)
        nodes = [{"id": n.id, "capacity": dict(n.capacity)} for n in self.cycle.nodes]
        return {
            "jobs": jobs,
            "waiting": self.waiting(now),
            "nodes": nodes,
            "busy": self.busy(),
            "nodes_lost": self.cycle.nodes_lost,
            "goodput": self.cluster_goodput(time.time()),
        }

    def waiting(self, now: float) -> list[dict[str, Any]]:
        """The waiting jobs by (queue, priority, state): how many, the longest wait so far and
        the resources they ask for together, at their full size (what Kueue exports of its
        pending workloads per ClusterQueue: a count, not a series per workload)."""
        groups: dict[tuple, dict[str, Any]] = {}
        for job in self.jobs.pending():
            key = (job.queue, job.priority, job.state.value)
            group = groups.get(key)
            if group is None:
                group = groups[key] = {"jobs": 0, "oldest_wait_s": 0.0, "demand": {}}
            group["jobs"] += 1
            group["oldest_wait_s"] = max(group["oldest_wait_s"], job.waited(now))
            demand = group["demand"]
            for resource, amount in job.per_worker.items():
                demand[resource] = demand.get(resource, 0.0) + amount * job.workers
        return [
            {"queue": q, "priority": p, "state": state, **group}
            for (q, p, state), group in sorted(groups.items(), key=lambda item: (item[0][0], -item[0][1]))
        ]

    def mfu(self, job_id: str) -> float | None:
        live = self.live.get(job_id)
        return (live.latest or {}).get("mfu") if live is not None else None

    def cluster_goodput(self, now: float, since: float | None = None) -> dict:
        """Goodput over the jobs in the table (those alive after `since`), each weighted by its
        accelerators (docs/monitoring.md). The sum over every job's ledger (0.3 s at 11,000
        jobs) is kept for `GOODPUT_EVERY_S`: `info()` and each scrape read it."""
        kept = self._goodput.get(since)
        if kept is not None and 0 <= now - kept[0] < GOODPUT_EVERY_S:
            return dict(kept[1])  # a copy: the caller's to change
        ledgers = [
            (job.ledger, self.mfu(job.id))
            for job in self.jobs.values()
            if job.ledger is not None and (since is None or (job.finished_at or now) >= since)
        ]
        self._goodput = {since: (now, cluster_goodput(ledgers, now).as_dict())}
        return dict(self._goodput[since][1])

    def total(self) -> dict[str, float]:
        return functools.reduce(add, (node.capacity for node in self.cycle.nodes), {})

    def busy(self) -> dict[str, float]:
        held = (scale(j.per_worker, j.workers) for j in self.jobs.holding())
        return functools.reduce(add, held, {})

    def queues(self) -> dict | None:
        """The queue configuration (as written: defaults left out) and each queue's use now
        (None: no configuration)."""
        config = self.cycle.policy.queue_config
        if config is None:
            return None
        running = [allocation(j) for j in self.jobs.holding()]
        use = CohortBook(config, running).report()
        for name, queue in config.queues.items():
            if name not in use:  # a hard cap, or a queue with an order only
                mine = [a for a in running if a.queue == name]
                used = {r: sum(a.per_worker.get(r, 0.0) * a.workers for a in mine) for r in queue.nominal}
                use[name] = {
                    "cohort": None,
                    "used": used,
                    "nominal": dict(queue.nominal),
                    "borrowed": {},
                    "lent": {},
                }
            use[name]["order"] = queue.order
        return {"config": config.model_dump(mode="json", exclude_defaults=True), "use": use}


def _state_name(job: JobRecord) -> str:
    return job.state.value


def _age_order(job: JobRecord) -> tuple:
    return (-job.priority, job.submitted_at, job.id)
