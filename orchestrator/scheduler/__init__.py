"""The orchestrator service's scheduler: one queue per Ray cluster, jobs placed on its nodes.

Pure policy (no Ray, so it can be simulated and property-tested; `bench/scheduler_sim.py`):

- `types`: the values passed in and out (`JobRequest`, `Node`, `Allocation`, `Decision`).
- `queue`: queue order (priority, then age, then id) and per-queue quota accounting.
- `admission`: gang placement of all of a job's workers at once, resource arithmetic, and the
  "larger than the cluster" check made at submission.
- `preemption`: which lower-priority preemptible jobs to stop so that a job can start.
- `policy`: one scheduling pass (`Policy.schedule`); `room`, the free room a pass hands out;
  `victims`, whom it stops for its head (`defrag`: moves when free room is spread too thin);
  `elastic`, resizes and growing; `las` and `cohorts`, the queue orders and fair share.
- `fifo`: `FifoPolicy`, the baseline.

Ray side, imported on its own (never from here, so the pure modules stay importable without
Ray): `actor.py`, the detached service actor and the calls it answers; `cycle.py`, its
scheduling pass; `lifecycle.py`, every change of a job's state; `store.py`, the durable job
table; `progress.py`, a driver's report folded in; `health.py`, what the service does about
hangs and stragglers; `views.py`, what it shows; `submission.py`, `live.py`, `runner.py`,
`client.py`. Design notes: docs/scheduler.md.
"""

from orchestrator.scheduler.admission import (
    add,
    fits,
    fits_cluster,
    format_resources,
    free_capacity,
    oversize_reason,
    place,
    scale,
    subtract,
)
from orchestrator.scheduler.fifo import FifoPolicy
from orchestrator.scheduler.policy import DEFAULT_BACKFILL_WINDOW, Policy
from orchestrator.scheduler.preemption import choose_victims, victim_rank
from orchestrator.scheduler.queue import QuotaBook, order_pending, queue_key, quota_reason
from orchestrator.scheduler.types import Allocation, Decision, JobRequest, Node, Resources

__all__ = [
    "DEFAULT_BACKFILL_WINDOW",
    "Allocation",
    "Decision",
    "FifoPolicy",
    "JobRequest",
    "Node",
    "Policy",
    "QuotaBook",
    "Resources",
    "add",
    "choose_victims",
    "fits",
    "fits_cluster",
    "format_resources",
    "free_capacity",
    "oversize_reason",
    "order_pending",
    "place",
    "queue_key",
    "quota_reason",
    "scale",
    "subtract",
    "victim_rank",
]
