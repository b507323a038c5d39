"""Who is told of an attempt's changes: each listener gets every event from the workers and every
change of state (`AttemptController._set_state`), and keeps what it needs of them.

    ServiceRecord   the service's record of the job: progress and records every REPORT_S (its
                    reply may carry a stop request), and how the attempt ended
    MetricsLog      the durable metrics log beside the checkpoints (and TensorBoard's files)
    Mlflow          the job's MLflow run, when the spec asks for one
    Terminal        the attempt's lines: the controller's log (`orchestrator logs`), and the
                    feed `orchestrator run` shows on its terminal
"""

from __future__ import annotations

import time
from typing import Any

from core import records
from orchestrator import client
from orchestrator.attempt import policy
from orchestrator.attempt.states import (
    Aborting,
    CheckpointSaved,
    Ended,
    GroupChanged,
    Progress,
    Records,
    Rewound,
    RunStarted,
    State,
    Stopping,
    StopRequested,
    WorkerFailed,
    WorkersStarted,
)

REPORT_S = 2.0  # progress to the service
REPORT_RECORDS = 500  # the newest records a report carries (the status page's curve)


class Listener:
    def event(self, event: Any, progress: Progress) -> None:
        pass

    def state_changed(self, before: State, after: State, progress: Progress) -> None:
        pass


class ServiceRecord(Listener):
    """The attempt as the service's record of its job sees it."""

    def __init__(self, service, job_id: str, attempt: int):
        self.service, self.job_id, self.attempt = service, job_id, attempt
        self.unreported: list[dict] = []  # records the service has not seen yet
        self.rewound = False  # the log was rewound since the last report
        self.reported_at = 0.0
        self.group_placements: list[dict] | None = None  # with replica groups: where each is placed

    def event(self, event: Any, progress: Progress) -> None:
        if isinstance(event, Rewound):
            self.unreported, self.rewound = list(event.records[-REPORT_RECORDS:]), True
        elif isinstance(event, Records):
            self.unreported = (self.unreported + event.records)[-REPORT_RECORDS:]

    def report(self, progress: Progress, final: bool = False) -> StopRequested | None:
        """Progress and records, every REPORT_S (and a last time); a stop request the reply
        carries. A service that is restarting is asked again at the next report."""
        if not final and time.time() - self.reported_at < REPORT_S:
            return None
        sent = {**progress.report(), "records": self.unreported, "rewound": self.rewound}
        try:
            reply = client.call(self.service.report, self.job_id, self.attempt, sent, retries=1)
        except client.ServiceError:
            return None
        self.unreported, self.rewound, self.reported_at = [], False, time.time()
        self.group_placements = reply.get("groups") or self.group_placements
        return StopRequested(reply["stop"], reply.get("reason")) if reply.get("stop") else None

    def finished(self, summary: dict) -> dict:
        """How the attempt ended; the service's view of the job after it (queued again, or ended)."""
        outcome = policy.outcome(summary)
        return client.call(self.service.finished, self.job_id, self.attempt, outcome, summary)


class MetricsLog(Listener):
    def __init__(self, run_uri: str, tensorboard: bool):
        from workers.run_log import RunLog  # the metrics log in storage (and TensorBoard's files)

        self.log = RunLog(run_uri, tensorboard=tensorboard)

    def event(self, event: Any, progress: Progress) -> None:
        if isinstance(event, Rewound):
            self.log.rewind(event.records)
        elif isinstance(event, Records):
            self.log.append(event.records)
            if event.durable:
                self.log.flush()

    def state_changed(self, before: State, after: State, progress: Progress) -> None:
        if isinstance(after, Ended):
            self.log.close()


class Mlflow(Listener):
    """Records (a rewound history too: what lies past the newest step sent is sent) and
    checkpoints to the job's MLflow run, on the tracker's thread; its end once it has ended."""

    def __init__(self, tracker):
        self.tracker = tracker

    def event(self, event: Any, progress: Progress) -> None:
        if isinstance(event, (Records, Rewound)):
            self.tracker.add(event.records)
        elif isinstance(event, CheckpointSaved):
            self.tracker.checkpoint(event.uri)

    def state_changed(self, before: State, after: State, progress: Progress) -> None:
        if isinstance(after, Ended):
            self.tracker.end(after.summary)  # sent as soon as it can be; `wait` bounds the wait

    def wait(self) -> None:
        self.tracker.wait()


class Feed:
    """The terminal's calls, kept for a follower to replay (`orchestrator run`'s own terminal):
    the follower asks for what is new from a cursor; what it has read is dropped, and so is the
    oldest past `keep` (an attempt nobody follows, the service's, keeps no more)."""

    def __init__(self, keep: int = 1000):
        self.calls: list[tuple[str, str, str | None, dict]] = []
        self.dropped, self.keep = 0, keep

    def event(self, job: str, text: str) -> None:
        self._add(("event", job, text, {}))

    def progress(self, job: str, text: str, **values) -> None:
        self._add(("progress", job, text, values))

    def update(self, job: str, **values) -> None:
        self._add(("update", job, None, values))

    def _add(self, call: tuple) -> None:
        self.calls.append(call)
        if len(self.calls) > self.keep:
            del self.calls[0]
            self.dropped += 1

    def since(self, cursor: int) -> tuple[list, int]:
        if cursor > self.dropped:
            del self.calls[: cursor - self.dropped]
            self.dropped = cursor
        return self.calls[max(cursor - self.dropped, 0) :], self.dropped + len(self.calls)


def replay(calls: list, display) -> None:
    """A feed's calls, shown on `display` (a `monitoring.terminal.Display`)."""
    for kind, job, text, values in calls:
        if kind == "event":
            display.event(job, text)
        elif kind == "progress":
            display.progress(job, text, **values)
        else:
            display.update(job, **values)


class Terminal(Listener):
    """What a person reads of the attempt, on each of `screens` (a Display, a Feed)."""

    def __init__(self, name: str, total_steps: int | None, screens: list):
        self.name, self.total_steps, self.screens = name, total_steps, screens

    def say(self, text: str) -> None:
        for screen in self.screens:
            screen.event(self.name, text)

    def update(self, **values) -> None:
        for screen in self.screens:
            screen.update(self.name, **values)

    def state_changed(self, before: State, after: State, progress: Progress) -> None:
        if isinstance(after, Stopping):
            what = "preemption" if after.request == "preempt" else "stop"
            self.say(f"{what} requested: the workers checkpoint and stop")
            self.update(state="stopping")
        elif isinstance(after, Aborting):
            self.say(f"{after.why}: ending the run now")

    def event(self, event: Any, progress: Progress) -> None:
        if isinstance(event, WorkersStarted):
            who = ", ".join(f"rank {rank} pid {w['pid']} on {w['node']}" for rank, w in event.members.items())
            if progress.replica_groups:  # one of the job's groups, started or started again
                self.say(f"replica group {event.replica}: workers: {who}")
            else:
                self.say(f"{'workers' if event.group == 0 else f'restart {event.group}: workers'}: {who}")
            self.update(state="running", total=self.total_steps)
        elif isinstance(event, GroupChanged) and event.fields.get("state") == "lost":
            self.say(f"replica group {event.group} lost ({event.fields.get('reason')}); the others train on")
        elif isinstance(event, GroupChanged) and event.fields.get("healed_step") is not None:
            self.say(f"replica group {event.group} healed from a peer at step {event.fields['healed_step']}")
        elif isinstance(event, RunStarted):
            for skipped in event.skipped:
                self.say(f"skipped {skipped['checkpoint']}: {skipped['reason']}")
            if event.group and not progress.replica_groups:
                self.say(
                    f"restarted from the checkpoint at step {event.step}"
                    if event.step
                    else "restarted from scratch (no checkpoint yet)"
                )
            elif event.step:
                self.say(f"resuming at step {event.step}")
        elif isinstance(event, CheckpointSaved):
            self.say(f"checkpoint at step {event.step}: {event.uri}")
        elif isinstance(event, WorkerFailed):
            self.say(f"rank {event.rank} failed: {event.reason}")
        elif isinstance(event, Records):
            # every evaluation gets its line; of the training records, the newest is what shows
            for r in event.records:
                if not records.is_train(r):
                    self.say(f"eval at step {r.get('step')}: {records.format_eval(r)}")
            train = [r for r in event.records if records.is_train(r)]
            if train:
                self._show_step(train[-1], progress)

    def requeued(self, after: dict, summary: dict) -> None:
        """The attempt ended and the service queued the job again (or is deciding whether a
        node of its died): why, and where it resumes from."""
        last = (after.get("history") or [{}])[-1]
        if last.get("event") == "node-lost":
            why = f"a node it ran on was lost at step {last.get('step')}"
        elif last.get("event") == "infrastructure-failure":
            step, count = last.get("step"), last["count"]
            why = f"its collectives failed at step {step} with every node answering ({count})"
        elif after["state"] == "preempted":
            why = f"preempted at step {summary.get('steps')}"
        elif after["state"] in ("admitted", "running", "stopping"):
            why = "its attempt failed; waiting to learn whether a node of its was lost"
        else:
            why = f"its attempt ended ({summary['status']})"
        resume = summary.get("checkpoint") or "the start (no checkpoint yet)"
        self.say(f"{why}: back in the queue; it resumes from {resume}")
        self.update(state=after["state"])

    def _show_step(self, r: dict, progress: Progress) -> None:
        step, total = r.get("step"), progress.total_steps
        tokens = r.get("tokens_per_s")
        rate, unit = (tokens, "tokens/s") if tokens else (r.get("samples_per_s", 0), "samples/s")
        step_time = progress.step_time_s
        eta = (total - step) * step_time if total and step_time else None
        text = (
            f"step {step}{f'/{total}' if total else ''}  loss {r['loss']:.4f}  "
            f"{r.get('samples_per_s', 0):,.0f} samples/s  lr {r.get('lr', 0):.2e}"
        )
        values = dict(state="running", step=step, total=total, loss=r["loss"], rate=rate, rate_unit=unit)
        for screen in self.screens:
            screen.progress(self.name, text, **values, eta_s=eta)
