"""One training run of a job on Ray, as its driver watches it: started through the launcher,
its events shown (progress, checkpoints, evaluations, restarts), its records kept in the
metrics log in storage and reported to the orchestrator service, a stop request forwarded to
the workers (or the run aborted, when it has not begun to train or the service requeued it),
and its summary. `driver.py` runs attempts, one after the other for a queued job.
"""

from __future__ import annotations

import threading
import time

from core import records, storage
from core.spec import JobSpec
from orchestrator.attempt_state import AttemptState, Phase
from orchestrator.monitoring import mlflow_tracking
from orchestrator.monitoring.terminal import Display
from orchestrator.ray import launcher
from orchestrator.ray.run_state import (
    CheckpointSaved,
    RankRecord,
    Records,
    Rewound,
    RunStarted,
    WorkerFailed,
    WorkersStarted,
)

POLL_S = 1.0  # progress lines once a second; each poll is an actor call
REPORT_S = 2.0  # progress to the service
REPORT_RECORDS = 500  # the newest records a report carries to the service (its status page)


class Stopped(Exception):
    """SIGTERM, e.g. from `ray job stop`: leave through ray.shutdown(), not mid-C++."""


# SIGTERM only sets this; the loops raise Stopped at their next turn (at most POLL_S later).
# An exception raised by the handler itself would land inside whatever Ray call the main
# thread is in (ray.wait), which cannot take one.
_sigterm = threading.Event()


def on_sigterm(signum, frame):
    _sigterm.set()


def raise_if_stopped() -> None:
    if _sigterm.is_set():
        raise Stopped()


def preflight(spec: JobSpec, run_uri: str) -> None:
    """Fail before any worker starts when storage is unusable (the message names the URI) or the
    data is not where the job runs."""
    storage.check_writable(run_uri)
    resume = spec.checkpoint.resume
    if resume not in ("auto", "never"):
        try:
            found = storage.exists(resume)
        except Exception as err:
            raise OSError(f"checkpoint.resume: cannot read '{resume}': {err}") from None
        if not found:
            raise OSError(f"checkpoint.resume: no checkpoint at '{resume}'")
    from workers.checks import data_problems  # the data plane's registries

    problems = data_problems(spec)
    if problems:
        raise OSError(problems[0])


class Attempt:
    """One training run: started, watched (progress, the metrics log in storage, reports to the
    service), stopped on request, summarised."""

    def __init__(
        self,
        spec: JobSpec,
        run: str,
        placement: dict[str, int] | None,
        display: Display,
        queued=None,
        state=None,
    ):
        from workers.run_log import RunLog  # the metrics log in storage (and TensorBoard's files)

        self.spec, self.run_name, self.placement, self.queued = spec, run, placement, queued
        self.run_state = state  # the attempt controller's own, or None: the run gets an actor of its own
        self.aborted_in_place = False  # aborted, and the run ends with this process (not yet)
        self.display, self.name = display, spec.name
        run_uri = storage.join(spec.checkpoint.storage, run)
        self.log = RunLog(run_uri, tensorboard=spec.metrics.tensorboard)
        job = queued.view if queued is not None else {}
        say = lambda text: display.event(spec.name, text)  # noqa: E731
        self.tracker = mlflow_tracking.for_attempt(spec, run_uri, run, job, say)  # None: no tracking
        self.last_report = 0.0
        self.last_step: int | None = None
        self.total_steps = spec.train.steps  # an epoch-based job learns it from its records
        self.last_checkpoint: str | None = None
        self.workers_started = False
        self.restarts = 0
        self.step_times: list[tuple[float, int]] = []  # (time, step): newest record of recent polls
        self.unreported: list[dict] = []  # records the service has not seen yet
        self.rewound = False  # the log was rewound since the last report
        self.stop_sent: str | None = None
        self.state = AttemptState()  # starting, training, restarting, stopping, aborted, ended
        self.checkpoint_step: int | None = None  # of the newest checkpoint (saved or resumed from)
        self.start_step: int | None = None  # the step this run started (or resumed) at
        self.start_time: float | None = None  # and when
        self.ended_as = "aborted"  # what an aborted run reports: stopped, preempted or aborted
        self.ranks: dict[int, dict] = {}  # the newest record of each rank but 0
        self.workers: dict[int, dict] = {}  # rank -> {"pid", "node", "node_id"} of the current group

    def run(self) -> dict:
        handle = launcher.start(self.spec, self.run_name, self.placement, self.run_state)
        try:
            while handle.running:
                handle.join(POLL_S)
                raise_if_stopped()
                self._poll(handle)
            self._poll(handle, final=True)
        finally:
            self.log.close()
        self.state.to(Phase.ENDED)
        self.aborted_in_place = bool(handle.aborted) and not handle.owns_state
        if handle.aborted:
            result = launcher.aborted_summary(handle, self.ended_as, self.last_step, self.last_checkpoint)
        else:
            result = launcher.summary(handle, self.last_step, self.last_checkpoint)
        summary = {**result, "checkpoint_step": self.checkpoint_step, "phases": self.state.path}
        if self.tracker is not None:
            self.tracker.end(summary)  # sent as soon as it can be; the caller waits (wait_tracking)
        return summary

    def wait_tracking(self) -> None:
        """After the attempt is reported: a bounded wait for MLflow to have all of it (not for
        a run aborted in this process: its workers go on until the process ends, and what
        MLflow lacks, its next attempt sends)."""
        if self.tracker is not None and not self.aborted_in_place:
            self.tracker.wait()

    def _poll(self, handle: launcher.RunHandle, final: bool = False) -> None:
        for event in handle.events():
            self._track(event)
            if isinstance(event, Rewound):
                self.log.rewind(event.records)
                self.unreported, self.rewound = list(event.records[-REPORT_RECORDS:]), True
            elif isinstance(event, Records):
                self.log.append(event.records)
                self.unreported = (self.unreported + event.records)[-REPORT_RECORDS:]
            elif isinstance(event, RunStarted):
                self.state.on_run_started()  # from here a stop checkpoints the steps it takes
                self.checkpoint_step = self.start_step = event.step
                self.start_time = event.time
            elif isinstance(event, RankRecord):
                self.ranks[event.rank] = event.record
            elif isinstance(event, WorkerFailed):
                self.state.on_worker_failed()
            elif isinstance(event, WorkersStarted):
                self.ranks, self.workers = {}, dict(event.members)  # a new worker group
                self.start_step = None  # until it has loaded its start
            self._show(event)
        if final:
            self.log.flush()
        if self.queued is not None and (final or time.time() - self.last_report > REPORT_S):
            reply = self.queued.report(
                {
                    **self.progress(),
                    "records": self.unreported,
                    "rewound": self.rewound,
                    "ranks": self.ranks,
                    "workers": self.workers,  # where each rank runs: hang stacks, straggler nodes
                }
            )
            self.unreported, self.rewound = [], False
            self.last_report = time.time()
            if reply.get("stop") and reply["stop"] != self.stop_sent and not final:
                self._stop(handle, reply["stop"], reply.get("reason"))

    def _track(self, event) -> None:
        """To MLflow, when the job asks: records (a rewound history too: what is past the run's
        newest step sent is sent) and checkpoints."""
        if self.tracker is None:
            return
        if isinstance(event, (Records, Rewound)):
            self.tracker.add(event.records)
        elif isinstance(event, CheckpointSaved):
            self.tracker.checkpoint(event.uri)

    def _stop(self, handle: launcher.RunHandle, stop: str, reason: str | None) -> None:
        """Forward the service's stop request: the workers checkpoint and stop at their next
        sum; a run that has not begun to train (no step to keep) or that the service has
        requeued (a node of its died) is aborted at once."""
        self.stop_sent = stop
        if self.state.stop_means_abort(stop):
            self.ended_as = {"abort": "aborted", "preempt": "preempted"}.get(stop, "stopped")
            what = reason if stop == "abort" else f"{self.ended_as} before its first step"
            self.display.event(self.name, f"{what}: ending the run now")
            self.state.to(Phase.ABORTED)
            handle.abort(what)
            return
        self.state.to(Phase.STOPPING)
        handle.request_stop(stop)
        what = "preemption" if stop == "preempt" else "stop"
        self.display.event(self.name, f"{what} requested: the workers checkpoint and stop")
        self.display.update(self.name, state="stopping")

    def progress(self) -> dict:
        step_time = None
        if len(self.step_times) >= 2:
            (t0, s0), (t1, s1) = self.step_times[0], self.step_times[-1]
            step_time = (t1 - t0) / (s1 - s0) if s1 > s0 else None
        return {
            "step": self.last_step,
            "total_steps": self.total_steps,
            "step_time_s": step_time,
            "checkpoint": self.last_checkpoint,
            "workers_started": self.workers_started,
            "restarts": self.restarts,
            "start_step": self.start_step,  # where this run began (None: not yet)
            "start_time": self.start_time,  # and when: a report may come before its first records
        }

    def _show(self, event) -> None:
        say = lambda text: self.display.event(self.name, text)  # noqa: E731
        if isinstance(event, WorkersStarted):
            self.workers_started, self.restarts = True, event.attempt
            who = ", ".join(f"rank {rank} pid {w['pid']} on {w['node']}" for rank, w in event.members.items())
            say(f"{'workers' if event.attempt == 0 else f'restart {event.attempt}: workers'}: {who}")
            self.display.update(self.name, state="running", total=self.spec.train.steps)
        elif isinstance(event, RunStarted):
            for skipped in event.skipped:
                say(f"skipped {skipped['checkpoint']}: {skipped['reason']}")
            if event.attempt:
                say(
                    f"restarted from the checkpoint at step {event.step}"
                    if event.step
                    else "restarted from scratch (no checkpoint yet)"
                )
            elif event.step:
                say(f"resuming at step {event.step}")
            self.last_step = event.step
        elif isinstance(event, CheckpointSaved):
            self.last_checkpoint, self.checkpoint_step = event.uri, event.step
            say(f"checkpoint at step {event.step}: {event.uri}")
        elif isinstance(event, WorkerFailed):
            say(f"rank {event.rank} failed: {event.reason}")
        elif isinstance(event, Records):
            # every evaluation gets its line; of the training records, the newest is what shows
            newest = None
            for r in event.records:
                if records.is_train(r):
                    newest = r
                else:
                    self._show_record(r)
            if newest is not None:
                self._show_record(newest)

    def _show_record(self, r: dict) -> None:
        step = r.get("step")
        self.last_step = step
        if not records.is_train(r):
            self.display.event(self.name, f"eval at step {step}: {records.format_eval(r)}")
            return
        self.step_times = (self.step_times + [(r.get("time", time.time()), step)])[-20:]
        total = self.total_steps = r.get("total_steps") or self.total_steps
        rate, unit = (
            (r["tokens_per_s"], "tokens/s")
            if r.get("tokens_per_s")
            else (r.get("samples_per_s", 0), "samples/s")
        )
        eta = None
        if total and len(self.step_times) >= 2 and self.progress()["step_time_s"]:
            eta = (total - step) * self.progress()["step_time_s"]
        self.display.progress(
            self.name,
            f"step {step}{f'/{total}' if total else ''}  loss {r['loss']:.4f}  "
            f"{r.get('samples_per_s', 0):,.0f} samples/s  lr {r.get('lr', 0):.2e}",
            state="running",
            step=step,
            total=total,
            loss=r["loss"],
            rate=rate,
            rate_unit=unit,
            eta_s=eta,
        )
