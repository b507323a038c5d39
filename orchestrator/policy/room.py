"""Free room per node within one scheduling pass, and the arithmetic of releasing and taking it.

A pass starts from the free resources per node and hands them out; `View` answers "does this
job shape fit" quickly (a view only shrinks within a pass), `Spare` is what backfill may use
beside the head's reservation, and `shadow` estimates when the head fits as running jobs end.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from operator import attrgetter

from orchestrator.policy.admission import EPS, UNBOUNDED, place, positive, slots
from orchestrator.policy.types import Allocation, JobRequest, Resources

# workers, per-worker resources, the nodes it avoids: everything a placement verdict depends on
Shape = tuple[int, tuple[tuple[str, float], ...], frozenset[str]]


def shape_of(job: JobRequest) -> Shape:
    # dict order is part of the key: equal dicts in another order only miss a cache, never hit wrongly
    return (job.workers, tuple(job.per_worker.items()), job.avoid_nodes)


def at_sizes(job: JobRequest) -> list[tuple[JobRequest, Shape]]:
    """The job at each of its allowed sizes, largest first, with its shape (one for a fixed job)."""
    if not job.sizes:
        return [(job, shape_of(job))]
    return [(request, shape_of(request)) for request in map(job.at_size, job.sizes)]


class View:
    """Resources per node that a pass may still hand out, with cluster totals.

    Within a pass a view only shrinks, so a job shape that did not fit will not fit later in
    the pass, and neither will a shape with at least as many workers each needing at least as
    much and avoiding at least the same nodes: both are answered without another placement search.
    """

    def __init__(self, by_node: dict[str, Resources]) -> None:
        self.by_node = by_node
        self.totals: Resources = {}
        for node_free in by_node.values():
            for name, amount in node_free.items():
                self.totals[name] = self.totals.get(name, 0.0) + amount
        self._failed_shapes: set[Shape] = set()
        self._failed: list[tuple[int, Resources, frozenset[str]]] = []

    def place(self, job: JobRequest, shape: Shape) -> dict[str, int] | None:
        if shape in self._failed_shapes:
            return None
        need, avoid = job.per_worker, job.avoid_nodes
        for workers, failed_need, failed_avoid in self._failed:
            if (
                job.workers >= workers
                and failed_avoid <= avoid
                and all(need.get(n, 0.0) >= a for n, a in failed_need.items())
            ):
                self._failed_shapes.add(shape)
                return None
        placement = None
        if all(a * job.workers <= self.totals.get(n, 0.0) + EPS for n, a in need.items() if a > 0):
            placement = place(job, self.by_node)
        if placement is None:
            self._failed_shapes.add(shape)
            self._failed.append((job.workers, positive(need), avoid))
        return placement

    def set_node(self, node_id: str, resources: Resources) -> None:
        old = self.by_node[node_id]
        for name in resources.keys() | old.keys():
            self.totals[name] = self.totals.get(name, 0.0) + resources.get(name, 0.0) - old.get(name, 0.0)
        self.by_node[node_id] = resources

    def take(self, placement: Mapping[str, int], per_worker: Mapping[str, float]) -> None:
        for node_id, count in placement.items():
            self.set_node(node_id, minus(self.by_node[node_id], per_worker, count))


class Spare(View):
    """What backfill may use beside the head's reservation: free now, and free when it starts."""

    def __init__(self, free: dict[str, Resources], headroom: dict[str, Resources]) -> None:
        self.free = free  # the pass's free resources per node (kept current by the pass)
        self.headroom = headroom  # per node when the head starts: free then, minus its placement
        super().__init__({node_id: self._min_of_both(node_id) for node_id in free})

    def _min_of_both(self, node_id: str) -> Resources:
        free, room = self.free[node_id], self.headroom[node_id]
        return {name: min(amount, room.get(name, 0.0)) for name, amount in free.items()}

    def refresh(self, node_ids: Iterable[str]) -> None:
        for node_id in node_ids:
            self.set_node(node_id, self._min_of_both(node_id))

    def take_headroom(self, placement: Mapping[str, int], per_worker: Mapping[str, float]) -> None:
        for node_id, count in placement.items():
            self.headroom[node_id] = minus(self.headroom[node_id], per_worker, count)


def take(room: dict[str, Resources], placement: Mapping[str, int], per_worker: Mapping[str, float]) -> None:
    """Take a placement's workers out of `room` (per node, in place)."""
    for node_id, count in placement.items():
        room[node_id] = minus(room[node_id], per_worker, count)


def minus(resources: Mapping[str, float], per_worker: Mapping[str, float], count: int) -> Resources:
    out = dict(resources)
    for name, amount in per_worker.items():
        out[name] = out.get(name, 0.0) - amount * count
    return out


def released(free: Mapping[str, Resources], allocations: Iterable[Allocation]) -> dict[str, Resources]:
    """Free resources per node once these allocations have let go of theirs."""
    out = {node_id: dict(node_free) for node_id, node_free in free.items()}
    for allocation in allocations:
        for node_id, count in allocation.placement.items():
            if node_id in out:
                out[node_id] = minus(out[node_id], allocation.per_worker, -count)
    return out


def headroom(
    avail: Mapping[str, Resources], placement: Mapping[str, int], head: JobRequest
) -> dict[str, Resources]:
    """Per node: what is left at the head's start once its placement is taken out."""
    out = {node_id: dict(node_avail) for node_id, node_avail in avail.items()}
    for node_id, count in placement.items():
        out[node_id] = minus(out[node_id], head.per_worker, count)
    return out


def shadow(
    now: float, head: JobRequest, free: Mapping[str, Resources], held: list[Allocation]
) -> tuple[float | None, dict[str, Resources]]:
    """When the head fits if held jobs end as estimated, and the free resources at that time.

    Stopping jobs go first (they end now), then jobs by estimated end (an overdue estimate
    counts as now), then jobs without an estimate, oldest first; the time is None as soon as
    one of those is needed. Slots are counted per node as releases come in, so each release
    costs only the nodes it touches; the nodes the head avoids hold none of its workers.
    """
    need, avoid = positive(head.per_worker), head.avoid_nodes
    avail = {node_id: dict(node_free) for node_id, node_free in free.items()}
    room = {
        node_id: 0 if node_id in avoid else slots(need, node_free, UNBOUNDED)
        for node_id, node_free in avail.items()
    }
    total = sum(room.values())
    if total >= head.workers:
        return now, avail
    stopping = [a for a in held if a.stopping]
    known = sorted((a for a in held if not a.stopping and a.est_end is not None), key=attrgetter("est_end"))
    unknown = sorted((a for a in held if not a.stopping and a.est_end is None), key=attrgetter("started_at"))
    releases = [(now, a) for a in stopping] + [(max(now, a.est_end), a) for a in known]
    releases += [(None, a) for a in unknown]
    for when, allocation in releases:
        for node_id, count in allocation.placement.items():
            node_avail = avail.get(node_id)
            if node_avail is None:
                continue
            for name, amount in allocation.per_worker.items():
                node_avail[name] = node_avail.get(name, 0.0) + amount * count
            fresh = 0 if node_id in avoid else slots(need, node_avail, UNBOUNDED)
            total += fresh - room[node_id]
            room[node_id] = fresh
        if total >= head.workers:
            return when, avail
    return None, avail
