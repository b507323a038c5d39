"""Gang admission: does a job fit, all workers at once, each worker whole on one node?

A placement is node id -> number of workers there. `place` packs a job the way that keeps
large holes free for the jobs that need them: as few nodes as possible (the nodes with the
most room first), and the last part on the node it fills most tightly (best fit). A job never
goes on the nodes it avoids (`JobRequest.avoid_nodes`): to it they are not there.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from orchestrator.policy.types import Allocation, JobRequest, Node, Resources

# Amounts are floats (0.5 CPU); a tolerance keeps 0.1 + 0.2 from failing to fit into 0.3.
EPS = 1e-9
# the "how many workers fit" of a job that asks for nothing
UNBOUNDED = 1 << 30


def fits(need: Mapping[str, float], have: Mapping[str, float]) -> bool:
    """True when every amount in `need` is available in `have` (missing names count as 0)."""
    return all(amount <= have.get(name, 0.0) + EPS for name, amount in need.items() if amount > 0)


def add(a: Mapping[str, float], b: Mapping[str, float]) -> Resources:
    out = dict(a)
    for name, amount in b.items():
        out[name] = out.get(name, 0.0) + amount
    return out


def subtract(a: Mapping[str, float], b: Mapping[str, float]) -> Resources:
    out = dict(a)
    for name, amount in b.items():
        out[name] = out.get(name, 0.0) - amount
    return out


def scale(a: Mapping[str, float], factor: float) -> Resources:
    return {name: amount * factor for name, amount in a.items()}


def positive(a: Mapping[str, float]) -> Resources:
    """Only the amounts that constrain anything (zero requests never block a placement)."""
    return {name: amount for name, amount in a.items() if amount > 0}


def format_resources(a: Mapping[str, float]) -> str:
    """`{"GPU": 4, "CPU": 32.0}` -> "4 GPU, 32 CPU" (for notes and error messages)."""
    parts = [f"{amount:g} {name}" for name, amount in a.items() if amount > EPS]
    return ", ".join(parts) if parts else "nothing"


def slots(need: Mapping[str, float], free: Mapping[str, float], limit: int) -> int:
    """How many workers needing `need` (positive amounts only) fit into `free`, at most `limit`."""
    count = limit
    for name, amount in need.items():
        count = min(count, math.floor((free.get(name, 0.0) + EPS) / amount))
        if count <= 0:
            return 0
    return count


def place(job: JobRequest, free_by_node: Mapping[str, Mapping[str, float]]) -> dict[str, int] | None:
    """Where all `job.workers` workers go at once, or None when they do not all fit.

    The job spans as few nodes as it can (nodes with room for the most workers first), and
    the remainder goes to the node with the least room that still holds it, so big holes stay
    free for big jobs. Ties go to the smaller node id, so the result is deterministic. The
    nodes in `job.avoid_nodes` are skipped.
    """
    need = list(positive(job.per_worker).items())
    avoid = job.avoid_nodes
    room = []
    total = 0
    for node_id, free in free_by_node.items():
        if avoid and node_id in avoid:
            continue
        # `slots` inlined: this loop is the hot path of a scheduling pass
        count = UNBOUNDED
        for name, amount in need:
            fitting = math.floor((free.get(name, 0.0) + EPS) / amount)
            if fitting < count:
                count = fitting
                if count <= 0:
                    break
        if count > 0:
            room.append((count, node_id))
            total += count
    if total < job.workers:
        return None
    room.sort(key=lambda item: (-item[0], item[1]))
    placement: dict[str, int] = {}
    remaining = job.workers
    start = 0
    while remaining > 0:
        if room[start][0] >= remaining:
            # best fit: among the nodes that hold all that is left, the one with the least room
            best = start
            for index in range(start + 1, len(room)):
                if room[index][0] < remaining:
                    break
                if room[index][0] < room[best][0]:
                    best = index
            placement[room[best][1]] = remaining
            return placement
        count, node_id = room[start]
        placement[node_id] = count
        remaining -= count
        start += 1
    return placement


def free_capacity(nodes: Iterable[Node], allocations: Iterable[Allocation]) -> dict[str, Resources]:
    """Node id -> what is not held by any allocation (stopping ones still hold theirs).

    Allocations on nodes that are gone are ignored: their resources left with the node.
    """
    free = {node.id: dict(node.capacity) for node in nodes}
    for allocation in allocations:
        for node_id, count in allocation.placement.items():
            node_free = free.get(node_id)
            if node_free is None:
                continue
            for name, amount in allocation.per_worker.items():
                node_free[name] = node_free.get(name, 0.0) - amount * count
    return free


def fits_cluster(job: JobRequest, nodes: Iterable[Node]) -> bool:
    """True when the job would fit the cluster if it were empty (the check at submission)."""
    return place(job, {node.id: node.capacity for node in nodes}) is not None


def usable_nodes(job: JobRequest, nodes: Iterable[Node]) -> list[Node]:
    """The nodes the job may be placed on: all but those it avoids."""
    return [node for node in nodes if node.id not in job.avoid_nodes]


def oversize_reason(job: JobRequest, nodes: Iterable[Node]) -> str | None:
    """None when the job fits the empty cluster; otherwise why not, in one sentence."""
    why = oversize_why(job, nodes)
    return None if why is None else f"job {job.id} {why}"


def oversize_why(job: JobRequest, nodes: Iterable[Node]) -> str | None:
    """`oversize_reason` without the job's id ("needs ..."): the same for every job of its
    shape, so a policy may cache it per shape."""
    nodes = list(nodes)
    if fits_cluster(job, nodes):
        return None
    need = positive(job.per_worker)
    shape = f"{job.workers} worker(s) x ({format_resources(need)})"
    avoided = len(nodes) - len(usable := usable_nodes(job, nodes))
    if avoided:  # judged on the nodes it may use, and said so
        shape += f" away from {avoided} node(s) it avoids"
        nodes = usable
    if not nodes:
        return f"needs {shape} but the cluster has no nodes"
    if not any(slots(need, node.capacity, 1) for node in nodes):
        # the node that comes closest to holding one worker, to show what a node offers
        largest = max(nodes, key=lambda node: min(node.capacity.get(n, 0.0) / a for n, a in need.items()))
        offers = {name: largest.capacity.get(name, 0.0) for name in need}
        missing = [name for name in need if all(node.capacity.get(name, 0.0) <= 0 for node in nodes)]
        if missing:
            return f"needs {shape} but no node has any {', '.join(missing)}"
        return (
            f"needs {shape}, more than any single node offers"
            f" (node {largest.id} has {format_resources(offers)}); a worker cannot span nodes"
        )
    room = sum(slots(need, node.capacity, job.workers) for node in nodes)
    return (
        f"needs {shape} but the whole cluster has room for only {room} such worker(s) ({len(nodes)} node(s))"
    )
