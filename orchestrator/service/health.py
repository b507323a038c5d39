"""The service's watch over running jobs, and what it does about hung jobs and straggling ranks
(docs/monitoring.md).

The watch (`Watchdog`) is fed by the drivers' reports (`OrchestratorService.report`, through
`progress.py`): the newest step, the records (rank 0's, with its step-time split), the other
ranks' own records, and the job's workers (rank -> pid, node). It applies the rules of
`orchestrator/policy/hangs.py` and `stragglers.py`, and says which running jobs are hung (asked
by the scheduling loop) and which ranks straggle (asked by the views and the exporter). Memory
only: a restarted service starts watching afresh.

`Health` acts on it, for the service (`actor.py`), under the service's lock:

    a hung job     its ranks' stacks are saved beside the run and named in a `hung` line of its
                   history, then its ranks are ended (SIGKILL): Ray Train counts a failure
                   against `fault_tolerance.max_failures` and restarts the group from the newest
                   checkpoint. All on a thread of its own: scheduling goes on meanwhile.
    a straggler    a `straggler` line in its history (`on_straggler: warn`). With
                   `restart_excluding_node`, the straggler's node also joins the job's
                   `avoid_nodes` (stored with its record) and the job is preempted: it
                   checkpoints and goes back to the queue (no failure, no step lost), and the
                   policy places it on other nodes. Never when the job would not fit the cluster
                   without that node (it would wait for good): then it only warns, and its
                   history says why. At most once per node and job.

The watch is read on every driver's report and imports no Ray; what acts (`stacks`, the
cycle's `request`) is imported where it is used.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from core import records, run_folder, storage
from core.jobs import JobState
from orchestrator.policy.hangs import StepClock, start_timeout_s, timeout_s
from orchestrator.policy.stragglers import StragglerWindow
from orchestrator.service.store import JobRecord

if TYPE_CHECKING:
    from orchestrator.service.cycle import SchedulingCycle
    from orchestrator.service.lifecycle import Lifecycle

RESTART_AWAY = "restart_excluding_node"

log = logging.getLogger("orchestrator.service")


# -- the watch ----------------------------------------------------------------------------------


@dataclass
class Watch:
    attempt: int
    clock: StepClock = field(default_factory=StepClock)
    window: StragglerWindow = field(default_factory=StragglerWindow)
    workers: dict[int, dict] = field(default_factory=dict)  # rank -> {"pid", "node", "node_id"}
    group: int = 0  # restarts of the worker group within the attempt
    acted_on: set[int] = field(default_factory=set)  # stragglers already acted on


class Watchdog:
    def __init__(self):
        self.watches: dict[str, Watch] = {}

    def _watch(self, job: JobRecord) -> Watch:
        watch = self.watches.get(job.id)
        if watch is None or watch.attempt != job.attempt:
            watch = self.watches[job.id] = Watch(job.attempt)
        return watch

    def observe(self, job: JobRecord, progress: dict, now: float) -> None:
        """A driver's report of the job's current attempt."""
        watch = self._watch(job)
        group = int(progress.get("restarts") or 0)
        if group != watch.group:  # a new worker group: new ranks, new windows
            watch.group, watch.window, watch.workers, watch.acted_on = group, StragglerWindow(), {}, set()
        if progress.get("workers"):
            watch.workers = {int(rank): dict(w) for rank, w in progress["workers"].items()}
        batch = progress.get("records") or []
        watch.clock.add_records(batch)
        watch.clock.observe(
            progress.get("step"), group, now, progress.get("start_step"), workers_up=bool(watch.workers)
        )
        for r in batch:
            if records.is_train(r):
                watch.window.add(int(r.get("rank", 0)), int(r[records.STEP]), r.get("compute_s"))
        for rank, r in (progress.get("ranks") or {}).items():
            if records.STEP in r:
                watch.window.add(int(rank), int(r[records.STEP]), r.get("compute_s"))

    def forget(self, job_id: str) -> None:
        self.watches.pop(job_id, None)

    # -- hangs -------------------------------------------------------------------------------

    def timeout_s(self, job: JobRecord, start: bool = False) -> float:
        """The job's hang timeout; `start`: its start timeout (before a group's first step)."""
        watch = self.watches.get(job.id)
        p95 = watch.clock.p95_interval_s() if watch is not None else None
        rule = start_timeout_s if start else timeout_s
        return rule(job.spec.fault_tolerance.hang_timeout_s, p95)

    def hung(self, jobs: list[JobRecord], now: float) -> list[tuple[JobRecord, Watch, float]]:
        """The running jobs hung now, each with its watch and the timeout it ran past (the
        start timeout for a worker group without a first step); each stall once."""
        out = []
        for job in jobs:
            watch = self.watches.get(job.id)
            if job.state is not JobState.RUNNING or watch is None or watch.attempt != job.attempt:
                continue
            spec, clock = job.spec, watch.clock
            timeout, start = self.timeout_s(job), self.timeout_s(job, start=True)
            every = (spec.checkpoint.every_steps, spec.train.eval_every)
            if watch.workers and clock.hung(
                now, timeout, spec.metrics.log_every, every, job.total_steps, start
            ):
                clock.fired = True
                out.append((job, watch, timeout if clock.armed else start))
        return out

    # -- stragglers --------------------------------------------------------------------------

    def stragglers(self, job_id: str) -> list[dict]:
        """[{"rank", "node", "ip", "ratio"}] of the job's flagged ranks, slowest first."""
        watch = self.watches.get(job_id)
        if watch is None:
            return []
        flagged = []
        for rank, ratio in watch.window.stragglers().items():
            worker = watch.workers.get(rank, {})
            flagged.append(
                {"rank": rank, "node": worker.get("node_id"), "ip": worker.get("node"), "ratio": ratio}
            )
        return sorted(flagged, key=lambda s: -s["ratio"])

    def ratios(self, job_id: str) -> list[dict]:
        """Every rank's compute ratio (once the windows are full), for the exporter."""
        watch = self.watches.get(job_id)
        if watch is None:
            return []
        return [
            {"rank": rank, "node": watch.workers.get(rank, {}).get("node_id"), "ratio": ratio}
            for rank, ratio in watch.window.ratios().items()
        ]

    def new_stragglers(self, job_id: str) -> list[dict]:
        """Flagged ranks not acted on yet (each straggler once per worker group)."""
        watch = self.watches.get(job_id)
        if watch is None:
            return []
        fresh = [s for s in self.stragglers(job_id) if s["rank"] not in watch.acted_on]
        watch.acted_on |= {s["rank"] for s in fresh}
        return fresh


# -- what the service does about it ------------------------------------------------------------


class Health:
    def __init__(
        self,
        lifecycle: Lifecycle,
        cycle: SchedulingCycle,
        watchdog: Watchdog,
        lock: threading.RLock,
        dashboard: str,
        token: str | None,
    ):
        self.lifecycle, self.cycle, self.watchdog, self.lock = lifecycle, cycle, watchdog, lock
        self.jobs = lifecycle.jobs
        self.dashboard, self.token = dashboard, token

    # -- hangs -----------------------------------------------------------------------------------

    def check_hangs(self, now: float) -> None:
        """Running jobs without step progress for longer than their hang timeout (or without a
        first step for longer than their start timeout): their stacks are taken and their ranks
        ended on a thread of their own. Called under the service's lock."""
        for job, watch, timeout in self.watchdog.hung(self.jobs.holding(), now):
            clock = watch.clock
            stalled = clock.stalled_s(now)
            what = f"no step after {job.step}" if clock.armed else "no first step"
            log.warning("%s: %s for %.0f s (timeout %.0f s): hung", job.id, what, stalled, timeout)
            hang = dict(
                attempt=job.attempt,
                step=job.step,
                workers=dict(watch.workers),
                stalled_s=stalled,
                progress=(clock.group, clock.step, clock.armed),
            )
            threading.Thread(
                target=self._on_hang, args=(job.id, hang, timeout), name=f"hang-{job.id}", daemon=True
            ).start()

    def _on_hang(self, job_id: str, hang: dict, timeout: float) -> None:
        from orchestrator.service import stacks

        with self.lock:
            job = self.jobs[job_id]
            run_uri = run_folder.run_uri(job.spec, job.run)
            folder = run_folder.hang_folder(run_uri, hang["attempt"], hang["step"])
        taken = stacks.stacks(self.dashboard, self.token, hang["workers"])
        try:
            fs, path = storage.resolve(folder)
            fs.create_dir(path, recursive=True)
            for rank, text in taken.items():
                with fs.open_output_stream(f"{path}/rank-{rank}.txt") as out:
                    out.write(text.encode())
        except OSError as err:
            log.error("%s: cannot save the stacks of its hang in %s: %s", job_id, folder, err)
        with self.lock:
            job = self.jobs[job_id]
            watch = self.watchdog.watches.get(job_id)
            if job.attempt != hang["attempt"] or job.state is not JobState.RUNNING or watch is None:
                return  # it ended or moved on meanwhile
            clock = watch.clock
            if (clock.group, clock.step, clock.armed) != hang["progress"]:
                log.warning("%s stepped again while its stacks were taken: not restarted", job_id)
                return
            job.log(
                "hung",
                step=hang["step"],
                stalled_s=round(hang["stalled_s"], 1),
                timeout_s=round(timeout, 1),
                **({} if clock.armed else {"before": "the first step of its worker group"}),
                stacks=folder,
                ranks={str(rank): stacks.where(text) for rank, text in taken.items()},
            )
            self.lifecycle.save(job)
        try:
            stacks.kill(hang["workers"])
        except Exception as err:
            log.error("%s: cannot end its hung ranks: %s", job_id, err)

    # -- stragglers ------------------------------------------------------------------------------

    def stragglers(self, job: JobRecord, now: float) -> bool:
        """A `straggler` line in the job's history for each rank newly flagged, and the job's
        `on_straggler` action. Returns whether the job changed (a restart has saved it already)."""
        fresh = self.watchdog.new_stragglers(job.id)
        for s in fresh:
            log.warning(
                "%s: rank %d computes %.2fx the median rank's (node %s)",
                *(job.id, s["rank"], s["ratio"], s["node"]),
            )
            detail = dict(rank=s["rank"], node=s["node"], ip=s["ip"], ratio=round(s["ratio"], 3))
            if job.spec.fault_tolerance.on_straggler != RESTART_AWAY:
                job.log("straggler", now, **detail)
                continue
            refusal = self._cannot_restart_away(job, s["node"])
            if refusal:
                log.warning("%s: %s", job.id, refusal)
                job.log("straggler", now, **detail, action=refusal)
                continue
            node, slow = s["node"], f"rank {s['rank']} straggles, {s['ratio']:.2f}x the median"
            action = f"restarting away from node {node}: {slow}"
            log.warning("%s: %s", job.id, action)
            job.log("straggler", now, **detail, action=action)
            job.avoid_nodes = sorted({*job.avoid_nodes, node})
            self.lifecycle.request_stop(job, "preempt", now, by=f"straggler on node {node}")  # saves
        return bool(fresh)

    def _cannot_restart_away(self, job: JobRecord, node: str | None) -> str | None:
        """Why the job is not restarted away from `node` (a warning only), or None."""
        from orchestrator.service.cycle import request

        if node is None:
            return "warning only: the straggler's node is not known"
        if node in job.avoid_nodes:
            return f"warning only: node {node} is avoided already"
        if job.state is not JobState.RUNNING:
            return f"warning only: the job is {job.state.value}"
        trial = dataclasses.replace(request(job), avoid_nodes=frozenset({*job.avoid_nodes, node}))
        reason = self.cycle.policy.rejection_reason(trial)
        if reason:
            return f"warning only, not restarted away from node {node}: {reason}"
        return None
