"""The scheduling policy: one queue per Ray cluster, jobs placed on its nodes. Pure: it imports
no Ray (tests/test_layers.py checks it), so it can be simulated and property-tested
(`bench/scheduler_sim.py`); the service (`orchestrator/service/`) runs it on a live cluster.

- `types`: the values passed in and out (`JobRequest`, `Node`, `Allocation`, `Decision`).
- `queue`: queue order (priority, then age, then id) and per-queue quota accounting.
- `admission`: gang placement of all of a job's workers at once, resource arithmetic, and the
  "larger than the cluster" check made at submission.
- `preemption`: which lower-priority preemptible jobs to stop so that a job can start.
- `policy`: one scheduling pass (`Policy.schedule`); `reservation`, the head's reservation and
  the backfill around it; `room`, the free room a pass hands out;
  `victims`, whom it stops for its head (`defrag`: moves when free room is spread too thin);
  `elastic`, resizes and growing; `las` and `cohorts`, the queue orders and fair share.
- `autoscale`: what to ask an autoscaler for (node types that would let waiting jobs start).
- `hangs` and `stragglers`: the rules that call a job hung or a rank a straggler.
- `node_watch`: which nodes stopped answering, around a probe the service injects.
- `permissions`: who may do what (roles, actions, the caller's team and jobs); the service
  asks it before every call.

The FIFO baseline the policy is measured against is `bench/fifo.py`. Design notes:
docs/scheduler.md.
"""

from orchestrator.policy.admission import (
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
from orchestrator.policy.policy import DEFAULT_BACKFILL_WINDOW, Policy
from orchestrator.policy.preemption import choose_victims, victim_rank
from orchestrator.policy.queue import QuotaBook, order_pending, queue_key, quota_reason
from orchestrator.policy.types import Allocation, Decision, JobRequest, Node, Resources

__all__ = [
    "DEFAULT_BACKFILL_WINDOW",
    "Allocation",
    "Decision",
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
