"""Every change of a queued job's state, in one place, each written to the store at once.

`Lifecycle.set_state` is the only code that assigns `job.state`: it asks
`core.jobs.check_transition` (the table of allowed transitions), writes the history line and
saves the record before anything else learns of the change. The other methods are the
service's verbs (admit, mark running, request a stop, requeue, finish) built on it; they
change the fields that go with a state (placement, stop request, backoff) together with it.
Leaving a state that holds resources ends an attempt, whichever verb did it: `end_attempt`
adds the attempt's service to the job's `attained_s` (what LAS orders by) and clears its placement.
"""

from __future__ import annotations

import logging
import time

from core.jobs import JobState, check_transition
from core.run_folder import checkpoint_step
from orchestrator.policy.las import service_rate
from orchestrator.ray.launcher import group_placements, union
from orchestrator.service.runner import AttemptRunner
from orchestrator.service.store import JobRecord, Store
from orchestrator.service.table import JobTable

log = logging.getLogger("orchestrator.service")

PROGRESS_SAVE_S = 10.0  # a job's record is saved at least this often while only its step moves


class Lifecycle:
    def __init__(self, store: Store, runner: AttemptRunner, config, generation: int):
        self.store, self.runner, self.config, self.generation = store, runner, config, generation
        self.jobs = JobTable(store.load_all())
        self.saved_at: dict[str, float] = {}  # when each job's record was last saved (monotonic)

    def save(self, job: JobRecord) -> None:
        self.store.save(job)
        self.saved_at[job.id] = time.monotonic()

    def save_progress(self, job: JobRecord) -> None:
        """A change of the job's step (and its ledger's records) only: saved if the record was
        not saved for `PROGRESS_SAVE_S`. A report every 2 s from 1,000 jobs was a file written
        per report; a service restarted meanwhile learns the step from the next report."""
        if time.monotonic() - self.saved_at.get(job.id, float("-inf")) >= PROGRESS_SAVE_S:
            self.save(job)

    def set_state(
        self,
        job: JobRecord,
        state: JobState,
        now: float,
        event: str | None = None,
        quiet: bool = False,
        **detail,
    ) -> None:
        """Move `job` to `state` (an allowed transition), log `event` (default: the state's name)
        with `detail` in its history unless `quiet` (the caller logged why), and save it."""
        check_transition(job.id, job.state, state)
        if job.ledger is not None:
            job.ledger.state(state, now)
        if state.is_pending and not job.state.is_pending:
            job.pending_since = now  # back in the queue
        elif job.state.is_pending and not state.is_pending:
            job.waited_s, job.pending_since = job.waited(now), None
        if job.state.holds_resources and not state.holds_resources:
            end_attempt(job, now)
        job.state = state
        self.jobs.moved(job)
        if not quiet:
            job.log(event or state.value, now, **detail)
        self.save(job)

    # -- admission and start -------------------------------------------------------------------

    def admit(self, job: JobRecord, placement: dict[str, int], now: float) -> None:
        job.attempt += 1
        job.placement, job.admitted_at, job.generation = dict(placement), now, self.generation
        job.step_time_s = None  # this attempt measures its own (an elastic job may run at another size)
        groups = job.spec.fault_tolerance.replica_groups
        job.group_placements = group_placements(placement, groups) if groups > 1 else []
        job.replica_groups = {}
        workers, nodes = sum(placement.values()), len(placement)
        if job.ledger is not None:
            job.ledger.workers = workers  # an elastic job's GPU-seconds follow its size
        self.set_state(
            job, JobState.ADMITTED, now, attempt=job.attempt, workers=workers, nodes=nodes, step=job.step
        )
        if job.submission_id is None and (job.launched_by == "service" or job.package):
            self._launch(job, now)

    def _launch(self, job: JobRecord, now: float) -> None:
        try:
            groups = job.spec.fault_tolerance.replica_groups
            job.submission_id, job.driver_node = self.runner.launch(
                job.id, job.attempt, job.package, job.placement, groups
            )
        except Exception as err:
            log.error("%s: cannot start its driver: %s", job.id, err)
            job.log("launch-failed", now, error=str(err).splitlines()[0][:300])
            self.requeue(job, now, backoff=True)
            return
        self.save(job)

    def mark_running(self, job: JobRecord, attempt: int) -> None:
        job.started_at, job.failed_starts = time.time(), 0
        self.set_state(job, JobState.RUNNING, job.started_at, event="running", attempt=attempt, step=job.step)

    def start_timed_out(self, job: JobRecord, now: float) -> None:
        deadline = self.config.start_deadline_s
        log.warning("%s: its workers did not all start within %.0f s; requeued", job.id, deadline)
        job.log("start-timeout", now, deadline_s=deadline)
        if job.submission_id:
            self.runner.stop(job.submission_id)
            job.submission_id = None
        self.requeue(job, now, backoff=True)

    # -- stopping ------------------------------------------------------------------------------

    def request_stop(
        self, job: JobRecord, why: str, now: float, by: str | None = None, resize_to: int | None = None
    ) -> None:
        """Ask a running job to checkpoint and stop: `why` is "preempt" or "stop". A resize is a
        preemption with `resize_to`: the job goes back to the queue, to restart at another size."""
        if job.state is JobState.STOPPING and job.stop_requested == why:
            return
        job.stop_requested, job.stop_requested_at, job.resize_to = why, now, resize_to
        self.set_state(
            job,
            JobState.STOPPING,
            now,
            event="stop-requested",
            why=why,
            **({"for": by} if by else {}),
            step=job.step,
        )

    def stop(self, job: JobRecord, now: float, at_once: bool = False) -> None:
        """`orchestrator stop`: a queued job leaves the queue; a running one checkpoints and
        stops, or with `at_once` its driver is stopped now (its steps since the checkpoint lost)."""
        if job.state.is_terminal:
            return
        if job.state.is_pending:
            self.finish(job, JobState.STOPPED, now, reason="stopped while queued")
            if job.submission_id:  # a driver waiting for admission
                self.runner.stop(job.submission_id)
        elif at_once:
            if job.submission_id:
                self.runner.stop(job.submission_id)
            job.steps_lost += self.steps_since_checkpoint(job)
            self.finish(job, JobState.STOPPED, now, reason="stopped at once (--now)")
        else:
            self.request_stop(job, "stop", now)

    def kill_after_grace(self, job: JobRecord, now: float) -> None:
        """A job asked to stop that has not within its grace period: stop its driver."""
        grace = job.spec.scheduling.preemption_grace_s
        if job.killed or job.stop_requested_at is None or now - job.stop_requested_at <= grace:
            return
        log.warning("%s did not stop within %.0f s: stopping its driver", job.id, grace)
        job.killed = True
        job.log("killed", now, reason=f"no checkpoint within {grace:.0f} s")
        self.save(job)
        if job.submission_id:
            self.runner.stop(job.submission_id)

    def preempted(self, job: JobRecord, now: float, acknowledged: bool) -> None:
        """A victim stopped (acknowledged: it checkpointed and said so) and goes back to the queue."""
        lost = self.steps_since_checkpoint(job)
        job.steps_lost += lost
        job.stop_requested = "preempt"
        if job.resize_to:
            job.resizes += 1
            was = job.placement_size
            detail = dict(
                workers=was, to=job.resize_to, step=job.step, steps_lost=lost, acknowledged=acknowledged
            )
            job.log("resized", now, **detail)
        else:
            job.preemptions += 1
            job.log("preempted", now, step=job.step, steps_lost=lost, acknowledged=acknowledged)
        self.requeue(job, now, backoff=False)

    def driver_gone(self, job: JobRecord, now: float, status: str | None) -> None:
        """The driver of a job that still holds resources ended without saying how."""
        was = job.state
        job.submission_id = None
        if job.stop_requested == "stop":
            self.finish(job, JobState.STOPPED, now, reason="stopped by request")
            return
        if not job.package:
            job.steps_lost += self.steps_since_checkpoint(job)
            self.finish(job, JobState.FAILED, now, reason="its driver exited and it cannot be restarted")
            return
        if job.stop_requested == "preempt":
            self.preempted(job, now, acknowledged=False)
            return
        lost = self.steps_since_checkpoint(job)
        job.steps_lost += lost
        job.log(
            "driver-exited", now, status=status or "unknown", step=job.step, steps_lost=lost, was=was.value
        )
        self.requeue(job, now, backoff=True)

    def node_lost(
        self,
        job: JobRecord,
        nodes: list[str],
        now: float,
        driver_gone: bool = False,
        why: dict[str, str] | None = None,
    ) -> None:
        """A node the job runs on died (Ray declared it dead, or its raylet does not answer:
        `why`, by node): back to its place in the queue (its first submission time), to resume
        from its newest complete checkpoint on the nodes that remain. Its driver resumes it; one
        that is gone too is started again when the job is admitted."""
        if driver_gone:
            job.submission_id = None
        lost = self.steps_since_checkpoint(job)
        job.steps_lost += lost
        job.node_losses += 1
        job.unconfirmed_failure = None
        detail = {"why": why} if why else {}
        job.log("node-lost", now, nodes=nodes, step=job.step, steps_lost=lost, attempt=job.attempt, **detail)
        log.warning("%s: node(s) %s died under it; requeued", job.id, ", ".join(n[:8] for n in nodes))
        if job.stop_requested == "stop":
            self.finish(job, JobState.STOPPED, now, reason="stopped (a node of its was lost meanwhile)")
        else:
            self.requeue(job, now, backoff=False)

    def group_lost(self, job: JobRecord, groups: list[int], why: dict[str, str], now: float) -> None:
        """Nodes died under some of a job's replica groups, not all of them: the others train
        on (the attempt goes on), the lost groups' nodes are no longer the job's, and each
        lost group waits for a place (`group_placed`). Time from here to the replacement's
        heal is the job's degraded time."""
        for group in groups:
            job.group_placements[group] = {}
        job.placement = union(job.group_placements)
        if job.ledger is not None:
            job.ledger.degraded(now)
        where = {"nodes": sorted(why), "why": why}
        job.log("group-lost", now, groups=groups, step=job.step, attempt=job.attempt, **where)
        log.warning(
            "%s: node(s) %s died under replica group(s) %s; the other groups train on",
            job.id,
            ", ".join(n[:8] for n in sorted(why)),
            ", ".join(map(str, groups)),
        )
        self.save(job)

    def group_placed(self, job: JobRecord, group: int, placement: dict[str, int], now: float) -> None:
        """A lost replica group's replacement has its nodes: the attempt starts it there."""
        job.group_placements[group] = dict(placement)
        job.placement = union(job.group_placements)
        job.log("group-placed", now, group=group, nodes=sorted(placement), attempt=job.attempt)
        self.save(job)

    def groups_reported(self, job: JobRecord, view: dict[str, dict], now: float) -> None:
        """The attempt's account of its replica groups: a degraded job is whole again once each
        group trains and the ones that started after the loss have healed from a peer."""
        if view != job.replica_groups:  # a group started, joined, healed or was lost
            job.replica_groups = view
            self.save(job)
        ledger = job.ledger
        if ledger is None or ledger.degraded_since is None or len(view) < len(job.group_placements):
            return
        since = ledger.degraded_since
        # each group trains where the service placed it (not a lost group the attempt has not
        # seen end yet), and those that started after the loss have healed from a peer
        where = [sorted(nodes) for nodes in job.group_placements]
        groups = [view.get(str(i), {}) for i in range(len(where))]
        placed = all(nodes and g.get("nodes") == nodes for g, nodes in zip(groups, where))
        training = all(g.get("state") == "training" for g in groups)
        healed = all(g.get("healed_at") for g in groups if (g.get("started_at") or 0) > since)
        if placed and training and healed:
            ledger.whole(now)
            job.log("groups-whole", now, degraded_s=round(now - since, 1), step=job.step, attempt=job.attempt)
            self.save(job)

    def correct_node_loss(self, job: JobRecord, attempt: int, summary: dict) -> None:
        """The steps a node loss cost, counted when the service noticed it from the last step
        reported (every few seconds), made closer from the ended attempt's own summary: its
        last step and its newest checkpoint the driver knew of. A checkpoint announced after
        the abort can still be the one resumed from: `progress.fold` makes it exact from the
        step the next attempt starts at."""
        event = next(
            (e for e in job.history if e["event"] == "node-lost" and e.get("attempt") == attempt), None
        )
        if event is None or summary.get("steps") is None or summary.get("checkpoint_step") is None:
            return
        exact = max(summary["steps"] - summary["checkpoint_step"], 0)
        job.steps_lost += exact - event["steps_lost"]
        event.update(step=summary["steps"], steps_lost=exact)
        self.save(job)

    def attempt_ended(
        self, job: JobRecord, outcome: str, summary: dict, lost_nodes: dict[str, str], now: float
    ) -> None:
        """The driver says how the current attempt ended (succeeded, failed, stopped or
        preempted) with its summary; `lost_nodes`: those of its nodes that died, and why."""
        job.summary = summary
        if job.ledger is not None and summary.get("checkpoint"):
            job.ledger.checkpointed(checkpoint_step(summary["checkpoint"]))
        job.step = summary.get("steps") or job.step
        job.last_checkpoint = summary.get("checkpoint") or job.last_checkpoint
        if lost_nodes:
            self.node_lost(job, list(lost_nodes), now, why=lost_nodes)
        elif outcome == "failed" and summary.get("retryable"):
            self.hold_failure(job, summary, now)
        elif outcome == "preempted":
            self.preempted(job, now, acknowledged=True)
        elif outcome == "stopped":
            self.finish(job, JobState.STOPPED, now, reason=f"stopped at step {job.step}")
        elif outcome == "succeeded":
            self.finish(job, JobState.SUCCEEDED, now)
        else:
            self.finish(job, JobState.FAILED, now, reason=summary.get("reason") or outcome)

    def hold_failure(self, job: JobRecord, summary: dict, now: float) -> None:
        """A failed attempt, until the service knows whether a node of its died (Ray declares
        a node dead a few seconds after the workers on it stop answering)."""
        job.unconfirmed_failure = {"at": now, "summary": summary}
        job.log("attempt-failed", now, step=job.step, reason=(summary.get("reason") or "")[:300])
        self.save(job)

    def confirm_failure(self, job: JobRecord, now: float) -> None:
        summary = job.unconfirmed_failure["summary"]
        job.unconfirmed_failure = None
        self.finish(job, JobState.FAILED, now, reason=summary.get("reason") or "failed")

    def infrastructure_failure(self, job: JobRecord, now: float) -> None:
        """A held attempt that failed in its collectives while every node of its answered: back to
        its place in the queue, to resume from its newest complete checkpoint, without spending
        `max_failures`; failed once `fault_tolerance.max_infrastructure_failures` are spent (a
        job that breaks its own collectives still ends)."""
        reason = (job.unconfirmed_failure["summary"].get("reason") or "failed")[:300]
        budget = job.spec.fault_tolerance.max_infrastructure_failures
        job.infrastructure_failures += 1
        if 0 <= budget < job.infrastructure_failures:
            job.unconfirmed_failure = None
            self.finish(
                job,
                JobState.FAILED,
                now,
                reason=f"{reason}; its collectives failed {job.infrastructure_failures} times with every "
                f"node answering (fault_tolerance.max_infrastructure_failures: {budget})",
            )
            return
        lost = self.steps_since_checkpoint(job)
        job.steps_lost += lost
        count = str(job.infrastructure_failures) + (f" of {budget}" if budget >= 0 else "")
        log.warning("%s: its collectives failed (%s), every node answering; requeued", job.id, count)
        job.log(
            "infrastructure-failure",
            now,
            step=job.step,
            steps_lost=lost,
            count=count,
            reason=reason,
            attempt=job.attempt,
        )
        self.requeue(job, now, backoff=False)

    def steps_since_checkpoint(self, job: JobRecord) -> int:
        saved = checkpoint_step(job.last_checkpoint) if job.last_checkpoint else 0
        return max(job.step - (saved or 0), 0)

    # -- back to the queue, or the end ---------------------------------------------------------

    def requeue(self, job: JobRecord, now: float, backoff: bool) -> None:
        """Back to the queue (preempted, or queued after a failed start); failed after
        `max_failed_starts` failed starts in a row."""
        if backoff and job.failed_starts + 1 >= self.config.max_failed_starts:
            reason = (
                f"its driver failed to run it {job.failed_starts + 1} times in a row; "
                f"see `orchestrator logs {job.id}`"
            )
            self.finish(job, JobState.FAILED, now, reason=reason)
            return
        state = JobState.PREEMPTED if job.stop_requested == "preempt" else JobState.QUEUED
        if state is JobState.QUEUED and job.ledger is not None:  # not asked to stop: it failed
            job.ledger.failed()
        job.stop_requested, job.stop_requested_at, job.killed = None, None, False
        job.resize_to = None
        job.unconfirmed_failure = None
        if job.driver_node:  # its driver ends with the attempt: the next admission starts one
            job.submission_id = job.driver_node = None
        if backoff:
            job.failed_starts += 1
            wait = self.config.backoff_s * 2 ** (job.failed_starts - 1)
            job.not_before = now + min(wait, self.config.max_backoff_s)
        # the history line is the caller's: preempted, driver-exited, start-timeout, ...
        self.set_state(job, state, now, quiet=True)

    def finish(self, job: JobRecord, state: JobState, now: float, reason: str | None = None) -> None:
        job.finished_at, job.reason = now, reason or job.reason
        job.stop_requested, job.unconfirmed_failure, job.resize_to = None, None, None
        self.set_state(job, state, now, step=job.step, **({"reason": reason} if reason else {}))


def end_attempt(job: JobRecord, now: float) -> None:
    """An attempt ends (finished, preempted, failed, resized, requeued): its service joins the
    job's `attained_s` and its resources are given back. The service is counted from
    `admitted_at`, as the policy counts the current attempt (`Allocation.started_at`)."""
    if job.admitted_at is not None and job.placement:
        job.attained_s += max(0.0, now - job.admitted_at) * service_rate(job.per_worker, job.placement_size)
    job.placement, job.group_placements = {}, []
    if job.ledger is not None:
        job.ledger.whole(now)
