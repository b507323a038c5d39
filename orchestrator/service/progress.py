"""A driver's progress report (`OrchestratorService.report`, every 2 s while a job runs),
folded into what the service keeps of the job, in this order:

1. its live metrics (memory only: the status page and the exporter), cleared on a rewind;
2. its time ledger (`account`): the start of a run first, then the records, then a checkpoint;
3. the watchdog's clocks and windows (hangs and stragglers);
4. the fields of its record (step, total steps, step time, checkpoint, a resume).

The progress: step, total_steps, step_time_s, checkpoint, workers_started, restarts (worker
groups Ray Train restarted), start_step (where this group's run began), records (rank 0's,
since the last report), rewound, ranks (the other ranks' newest records), workers (rank ->
pid and node), start_time (when this group's run began).
"""

from __future__ import annotations

import time

from core.run_folder import checkpoint_step
from orchestrator.service.health import Watchdog
from orchestrator.service.live import LiveMetrics
from orchestrator.service.store import JobRecord

# what a report changed in the job's record (the caller saves it): nothing, its step (and its
# ledger's records) only, or more (a checkpoint, a resume, a loss made exact, its total steps)
NOTHING, STEP, RECORD = 0, 1, 2


def fold(job: JobRecord, progress: dict, live: LiveMetrics, watchdog: Watchdog) -> int:
    """Fold one report of the job's current attempt in; returns what changed in its record:
    NOTHING, STEP or RECORD (the caller saves a RECORD at once, a STEP every few seconds)."""
    if progress.get("rewound"):
        live.clear()
    live.add(progress.get("records") or [])
    account(job, progress)
    watchdog.observe(job, progress, time.time())
    if progress.get("ranks") is not None:
        live.ranks = dict(progress["ranks"])
    if progress.get("restarts") is not None:
        live.restarts = int(progress["restarts"])
    changed = NOTHING
    for key, level in (("step", STEP), ("total_steps", RECORD), ("step_time_s", NOTHING)):
        if progress.get(key) is not None and getattr(job, key) != progress[key]:
            setattr(job, key, progress[key])
            changed = max(changed, level)
    if progress.get("checkpoint") and progress["checkpoint"] != job.last_checkpoint:
        job.last_checkpoint = progress["checkpoint"]
        changed = RECORD
    start = progress.get("start_step")
    if start is not None and _exact_loss(job, int(start)):
        changed = RECORD
    if start and job.attempt == 1 and "resuming" not in (e["event"] for e in job.history):
        # a job run again under a name whose run has checkpoints continues that run
        job.log("resuming", run=job.run, step=start)
        changed = RECORD
    return changed


# the losses the service counts when it notices them, from the last step and checkpoint it knew
_ESTIMATED_LOSSES = ("node-lost", "infrastructure-failure")


def _exact_loss(job: JobRecord, start: int) -> bool:
    """The steps the previous attempt's node loss (or collective failure) cost, made exact
    once this attempt has loaded its start: the steps from there to where the loss found the
    job. Whether the record changed."""
    event = next(
        (
            e
            for e in reversed(job.history)
            if e["event"] in _ESTIMATED_LOSSES and e.get("attempt") == job.attempt - 1
        ),
        None,
    )
    if event is None or "resumed_at" in event or event.get("step") is None:
        return False
    exact = max(int(event["step"]) - start, 0)
    job.steps_lost += exact - int(event.get("steps_lost") or 0)
    event.update(steps_lost=exact, resumed_at=start)
    return True


def account(job: JobRecord, progress: dict) -> None:
    """A driver's report in the job's time ledger: the start of a run first (a resume below
    the newest step reached rolls training back), then the records, then a new checkpoint."""
    ledger, now = job.ledger, time.time()
    if ledger is None:
        return
    batch = progress.get("records") or []
    times = [r["time"] for r in batch if isinstance(r.get("time"), (int, float))]
    first = min([now, *times])  # the run began before the records it sent
    if int(progress.get("restarts") or 0):  # a worker group Ray Train restarted: a failure
        ledger.regrouped([job.attempt, int(progress["restarts"])], first)
    if progress.get("start_step") is not None:
        run = [job.attempt, int(progress.get("restarts") or 0)]
        began = progress.get("start_time")
        ledger.began(
            run, progress["start_step"], min(first, began) if isinstance(began, (int, float)) else first
        )
    for record in batch:
        ledger.record(record, now)
    if progress.get("checkpoint") and progress["checkpoint"] != job.last_checkpoint:
        ledger.checkpointed(checkpoint_step(progress["checkpoint"]))
