"""A job run through the orchestrator service, as its driver sees it: queued (or attached to the
record the service started this attempt controller for), admitted, run on the nodes the
service counted, maybe preempted, and reported; the service decides what comes next.

An attempt controller the service started (`orchestrator.attempt_controller`, given the job's
id) runs on the job's own node and for one attempt: the next admission starts a new one on its
nodes. A driver that queued its job itself (`ray job submit`, or `orchestrator run` from a
terminal) waits for each admission and runs every attempt.
"""

from __future__ import annotations

import time

from core import storage
from core.jobs import TERMINAL_VALUES
from core.spec import JobSpec
from orchestrator import client as service_client
from orchestrator.attempt import Attempt, preflight, raise_if_stopped
from orchestrator.monitoring.terminal import Display


class QueuedJob:
    """A job run through the orchestrator service: queued, admitted, run, maybe preempted and
    run again, until it ends."""

    WAIT_S = 1.0

    def __init__(self, spec: JobSpec, service, job_id: str | None, display: Display, state=None):
        self.spec, self.service, self.display, self.name = spec, service, display, spec.name
        self.state = state  # the attempt controller's run state, when this runs in one
        submission = service_client.own_submission_id()
        if job_id:
            view = service_client.call(service.attach, job_id, submission)
        else:
            view = service_client.call(
                service.register,
                spec,
                {"submission_id": submission},
                service_client.package_if_in_ray_job(),
            )
        self.job_id, self.run_id, self.attempt = view["id"], view["run"], view["attempt"]
        self.view = view  # who and where: queue, user, team, sweep (MLflow's tags)
        # an attempt controller runs on the attempt's nodes, for that attempt only
        self.one_attempt = bool(job_id)
        self.finished_attempt = 0  # the newest attempt this driver ran and reported
        display.event(
            self.name,
            f"queued as {self.job_id} (priority {view['priority']}); checkpoints in "
            f"{storage.join(spec.checkpoint.storage, self.run_id)}",
        )
        display.update(self.name, state="queued", total=spec.train.steps)

    def preflight(self) -> None:
        """Storage and data checks; a failure no retry can mend fails the job in the queue at
        once, with the real reason (not a retried start)."""
        try:
            preflight(self.spec, storage.join(self.spec.checkpoint.storage, self.run_id))
        except OSError as err:
            service_client.call(self.service.fail, self.job_id, str(err).splitlines()[0])
            raise

    def run(self) -> dict:
        summary = self._summary("stopped", "stopped while queued")
        while True:
            view = self._wait_admission()
            if view["state"] in TERMINAL_VALUES:  # stopped while queued, or the service's verdict
                summary.update(status=view["state"], job_id=self.job_id, reason=view.get("reason"))
                return summary
            self.attempt, self.view = view["attempt"], {**self.view, "attempt": view["attempt"]}
            attempt = None
            if view["state"] == "stopping":  # stopped or preempted before this driver started it
                outcome = "preempted" if view["stop"] == "preempt" else "stopped"
                summary = self._summary(outcome, f"{outcome} before it started")
            else:
                attempt = self._attempt(view)
                summary = attempt.run()
            outcome = {"stopped_early": "succeeded"}.get(summary["status"], summary["status"])
            after = service_client.call(self.service.finished, self.job_id, self.attempt, outcome, summary)
            self.finished_attempt = self.attempt
            if attempt is not None:
                attempt.wait_tracking()  # the attempt is reported: its resources are free
            self.display.update(self.name, state=after["state"])
            if after["state"] in TERMINAL_VALUES:
                summary["job_id"] = self.job_id
                return summary
            self._say_requeued(after, summary)
            if self.one_attempt:
                summary.update(handed_back=True, job_id=self.job_id)
                return summary

    def _attempt(self, admitted: dict) -> Attempt:
        spec = self.spec.model_copy(deep=True)
        if spec.resources.elastic:  # the size the service admitted it at
            spec = spec.at_size(sum(admitted["placement"].values()))
        if self.attempt > 1:  # a later admission continues the job's own checkpoints
            spec.checkpoint.resume = "auto"
        accum = f", {spec.train.grad_accum} micro-batches per step" if self.spec.resources.elastic else ""
        self.display.event(
            self.name,
            f"admitted (attempt {self.attempt}): {spec.resources.num_workers} "
            f"worker(s) on {len(admitted['placement'])} node(s){accum}",
        )
        self.display.update(self.name, state="admitted", note=None)
        return Attempt(spec, self.run_id, admitted["placement"], self.display, queued=self, state=self.state)

    def _say_requeued(self, after: dict, summary: dict) -> None:
        """The attempt ended and the job is queued again (or the service is deciding whether a
        node of its died): say why, and go back to waiting."""
        last = (after.get("history") or [{}])[-1]
        if last.get("event") == "node-lost":
            why = f"a node it ran on was lost at step {last.get('step')}"
        elif last.get("event") == "infrastructure-failure":
            why = (
                f"its collectives failed at step {last.get('step')} with every node answering"
                f" ({last['count']})"
            )
        elif after["state"] == "preempted":
            why = f"preempted at step {summary.get('steps')}"
        elif after["state"] in ("admitted", "running", "stopping"):
            why = "its attempt failed; waiting to learn whether a node of its was lost"
        else:
            why = f"its attempt ended ({summary['status']})"
        resume = summary.get("checkpoint")
        self.display.event(
            self.name,
            f"{why}: back in the queue; it resumes from {resume or 'the start (no checkpoint yet)'}",
        )

    def _summary(self, status: str, reason: str) -> dict:
        return {
            "job": self.spec.name,
            "run": self.run_id,
            "status": status,
            "steps": None,
            "reason": reason,
            "samples_per_s": 0.0,
            "checkpoint": None,
        }

    def _wait_admission(self) -> dict:
        """The service's view once the job is admitted (a newer attempt), asked to stop before
        it started, or ended; meanwhile the queue notes, as they change."""
        shown = None
        while True:
            state = service_client.call(self.service.admission, self.job_id)
            newer = state["attempt"] > self.finished_attempt
            if state["state"] in TERMINAL_VALUES or (newer and state["state"] in ("admitted", "stopping")):
                return state
            if state["state"] in ("queued", "preempted"):
                line = state.get("note") or (
                    f"queued behind {state['ahead']} job(s)" if state["ahead"] else "queued"
                )
            else:  # this attempt still holds its nodes: the service is deciding about it
                line = "waiting for the service's verdict on the failed attempt (probing its nodes)"
            if line != shown:
                self.display.event(self.name, line)
                self.display.update(self.name, state=state["state"], note=line)
                shown = line
            time.sleep(self.WAIT_S)
            raise_if_stopped()

    def report(self, progress: dict) -> dict:
        """Progress to the service; its reply may carry a stop request ("stop", "preempt",
        "abort") and why."""
        try:
            return service_client.call(self.service.report, self.job_id, self.attempt, progress, retries=1)
        except service_client.ServiceError:
            return {}  # the service is restarting: keep training, report again later
