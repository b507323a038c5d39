"""Moving running jobs to make room: when the head of the queue is blocked by fragmentation.

A head can wait although enough resources are free in total: they are spread over nodes in
pieces smaller than one of its workers (an 8-GPU job, and one free GPU on each of eight
nodes). Nothing else that waits fits those pieces either, so they stay idle until a whole
node drains, which with long jobs takes hours. Gandiva (OSDI'18) showed that migrating jobs
to pack them fixes this; here a move is the zero-loss preemption the service already has
(checkpoint, stop, start again elsewhere from the same step).

`plan_moves` looks for the fewest GPUs (or workers) to move: it drains the cheapest nodes
one at a time until the head fits on what they free, and checks that every job it moves
fits again into the pieces left once the head is placed. The plan is kept only when all of
that holds, so a move never leaves a job without room to start again.

Moved jobs must consent as they do to preemption (`preemptible`, and not of higher priority
than the head), and each attempt must have run `min_run_s`, so a job is moved at most once
per `min_run_s` of running and the overhead stays bounded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from orchestrator.policy.admission import EPS, place, positive
from orchestrator.policy.room import released, take
from orchestrator.policy.types import Allocation, JobRequest, Resources

DEFAULT_MIN_RUN_S = 600.0


def fragmented(head: JobRequest, free: Mapping[str, Resources]) -> bool:
    """The head does not fit, although the free resources add up to what it needs."""
    need = positive(head.per_worker)
    for name, amount in need.items():
        if sum(node.get(name, 0.0) for node in free.values()) + EPS < amount * head.workers:
            return False
    return place(head, free) is None


def plan_moves(
    head: JobRequest,
    running: Iterable[Allocation],
    free: Mapping[str, Resources],
    now: float,
    min_run_s: float = DEFAULT_MIN_RUN_S,
) -> list[str] | None:
    """Running jobs to move so that `head` fits and each of them fits again elsewhere; None if
    no plan does. `free`: free resources per node (jobs stopping already count as released)."""
    if not fragmented(head, free):
        return None
    on_node: dict[str, list[Allocation]] = {node_id: [] for node_id in free}
    for allocation in running:
        for node_id in allocation.placement:
            if node_id in on_node:
                on_node[node_id].append(allocation)
    drainable = [
        (_cost(jobs), node_id)
        for node_id, jobs in on_node.items()
        if jobs and node_id not in head.avoid_nodes and all(_movable(a, head, now, min_run_s) for a in jobs)
    ]
    moved: dict[str, Allocation] = {}
    for _, node_id in sorted(drainable):
        for allocation in on_node[node_id]:
            moved[allocation.job_id] = allocation
        if _fits_after(head, list(moved.values()), free):
            return sorted(moved, key=lambda job_id: -_gpus(moved[job_id]))
    return None


def _fits_after(head: JobRequest, moved: list[Allocation], free: Mapping[str, Resources]) -> bool:
    """The head fits once `moved` are gone, and then each of them fits again (largest first)."""
    room = released(free, moved)
    placement = place(head, room)
    if placement is None:
        return False
    take(room, placement, head.per_worker)
    for allocation in sorted(moved, key=lambda a: (-_gpus(a), a.job_id)):
        again = JobRequest(
            allocation.job_id,
            0,
            allocation.workers,
            allocation.per_worker,
            0.0,
            avoid_nodes=allocation.avoid_nodes,
        )
        spot = place(again, room)
        if spot is None:
            return False
        take(room, spot, allocation.per_worker)
    return True


def _movable(allocation: Allocation, head: JobRequest, now: float, min_run_s: float) -> bool:
    return (
        allocation.preemptible
        and not allocation.stopping
        and not allocation.starting
        and allocation.priority <= head.priority
        and now - allocation.started_at >= min_run_s
    )


def _gpus(allocation: Allocation) -> float:
    return allocation.per_worker.get("GPU", 0.0) * allocation.workers


def _cost(jobs: list[Allocation]) -> tuple[float, int]:
    """What draining a node costs: the GPUs that move, then the workers."""
    return (sum(_gpus(a) for a in jobs), sum(a.workers for a in jobs))
