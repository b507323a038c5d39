"""Victim choice: which running jobs to stop so that a waiting job can start (gang).

Only jobs that are `preemptible`, of strictly lower priority than the waiting job, and not
already stopping are candidates. Among the sets of candidates whose release lets the whole
job fit, the choice prefers, in this order: the fewest jobs, the lowest priorities, the most
recently started (they lose the least progress since their last restart).

Finding the smallest such set is a covering problem; the search here is greedy and then
minimal: it repeatedly takes the candidate that frees room for the most workers (ties to
the preferred candidate), then drops every victim the job does not need after all (least
preferred first), then swaps victims for preferred candidates where the job still fits.
It is exact whenever one victim suffices, and never returns a victim that could be spared.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping

from orchestrator.scheduler.admission import EPS, UNBOUNDED, positive, slots
from orchestrator.scheduler.types import Allocation, JobRequest, Node, Resources

# bounds the swap pass (each trial is a few dict operations); keeps the choice fast on big clusters
SWAP_TRIALS = 256


def victim_rank(allocation: Allocation) -> tuple[int, float, str]:
    """Smaller ranks are stopped first: lowest priority, then most recently started."""
    return (allocation.priority, -allocation.started_at, allocation.job_id)


def can_preempt(job: JobRequest, allocation: Allocation) -> bool:
    return allocation.preemptible and not allocation.stopping and allocation.priority < job.priority


class _Room:
    """Free resources per node plus what chosen victims release, counted in the job's workers."""

    def __init__(self, need: Resources, avail: dict[str, Resources]) -> None:
        self.need = need
        self.avail = avail
        self.slots = {node_id: slots(need, free, UNBOUNDED) for node_id, free in avail.items()}
        self.total = sum(self.slots.values())

    def _slots_with(self, node_id: str, release: Resources, sign: int) -> int:
        free = self.avail[node_id]
        count = UNBOUNDED
        for name, amount in self.need.items():
            count = min(
                count, math.floor((free.get(name, 0.0) + sign * release.get(name, 0.0) + EPS) / amount)
            )
            if count <= 0:
                return 0
        return count

    def _fraction_with(self, node_id: str, release: Resources) -> float:
        free = self.avail[node_id]
        return min(
            (free.get(name, 0.0) + release.get(name, 0.0)) / amount for name, amount in self.need.items()
        )

    def gain(self, releases: dict[str, Resources]) -> tuple[int, float]:
        """(workers gained, fraction of a worker gained) if this victim were released too."""
        whole = 0
        part = 0.0
        for node_id, release in releases.items():
            whole += self._slots_with(node_id, release, +1) - self.slots[node_id]
            part += self._fraction_with(node_id, release) - self._fraction_with(node_id, {})
        return whole, part

    def total_after(self, add: Iterable[dict[str, Resources]], remove: Iterable[dict[str, Resources]]) -> int:
        """Total slots if the victims in `add` were released too and those in `remove` were not."""
        changes: dict[str, Resources] = {}
        for releases, sign in [(r, 1) for r in add] + [(r, -1) for r in remove]:
            for node_id, release in releases.items():
                delta = changes.setdefault(node_id, {})
                for name, amount in release.items():
                    delta[name] = delta.get(name, 0.0) + sign * amount
        total = self.total
        for node_id, delta in changes.items():
            total += self._slots_with(node_id, delta, +1) - self.slots[node_id]
        return total

    def apply(self, releases: dict[str, Resources], sign: int) -> None:
        for node_id, release in releases.items():
            free = self.avail[node_id]
            for name, amount in release.items():
                free[name] = free.get(name, 0.0) + sign * amount
            count = slots(self.need, free, UNBOUNDED)
            self.total += count - self.slots[node_id]
            self.slots[node_id] = count


def choose_victims(
    job: JobRequest,
    allocations: Iterable[Allocation],
    nodes: Iterable[Node],
    free_by_node: Mapping[str, Mapping[str, float]],
) -> list[str] | None:
    """Job ids to stop so that `job` fits, most preferred first; [] if it fits without any.

    Allocations already `stopping` are never chosen again, and the resources they hold count
    as released (they are on their way out): a job that will fit once they have stopped gets
    [] and waits for them. None when even stopping every candidate would not make it fit.
    """
    need = positive(job.per_worker)
    allocations = list(allocations)
    node_ids = [node.id for node in nodes]
    avail = {node_id: dict(free_by_node.get(node_id, {})) for node_id in node_ids}
    for allocation in allocations:
        if allocation.stopping:
            _release_into(avail, allocation)
    room = _Room(need, avail)
    if room.total >= job.workers:
        return []

    candidates = sorted((a for a in allocations if can_preempt(job, a)), key=victim_rank)
    releases = {a.job_id: _releases(a, need, avail) for a in candidates}
    candidates = [a for a in candidates if releases[a.job_id]]
    if not candidates or room.total_after([releases[a.job_id] for a in candidates], []) < job.workers:
        return None

    chosen = _drop_unneeded(job, _greedy(job, candidates, releases, room), releases, room)
    taken = {a.job_id for a in chosen}
    pool = [a for a in candidates if a.job_id not in taken]  # in rank order
    # swap a victim for a preferred candidate where the job still fits (same count, better ranks)
    trials = 0
    for allocation in sorted(chosen, key=victim_rank, reverse=True):
        for candidate in pool:
            if trials >= SWAP_TRIALS or victim_rank(candidate) >= victim_rank(allocation):
                break
            trials += 1
            add, remove = releases[candidate.job_id], releases[allocation.job_id]
            if room.total_after([add], [remove]) >= job.workers:
                room.apply(remove, -1)
                room.apply(add, +1)
                chosen = [candidate if a.job_id == allocation.job_id else a for a in chosen]
                pool = sorted(
                    [a for a in pool if a.job_id != candidate.job_id] + [allocation], key=victim_rank
                )
                break
    # a preferred candidate may free more than the victim it replaced: drop what that spares
    chosen = _drop_unneeded(job, chosen, releases, room)
    return [a.job_id for a in sorted(chosen, key=victim_rank)]


def _greedy(
    job: JobRequest, candidates: list[Allocation], releases: dict[str, dict[str, Resources]], room: _Room
) -> list[Allocation]:
    """Take candidates until the job fits: each time the one that frees room for the most workers.

    Ties go to the preferred candidate (`candidates` is in rank order); a candidate that alone
    makes the job fit is preferred by rank among all those that would. Gains only change for
    candidates sharing a node with the one just taken, so only those are recomputed: a heap
    with stale entries skipped keeps a 256-victim choice on 512 jobs fast.
    """
    rank = {a.job_id: index for index, a in enumerate(candidates)}
    by_node: dict[str, list[Allocation]] = {}
    for allocation in candidates:
        for node_id in releases[allocation.job_id]:
            by_node.setdefault(node_id, []).append(allocation)
    gains = {a.job_id: room.gain(releases[a.job_id]) for a in candidates}
    heap = [(-whole, -part, rank[job_id], job_id) for job_id, (whole, part) in gains.items()]
    heapq.heapify(heap)
    left = {a.job_id: a for a in candidates}  # insertion (rank) order
    chosen: list[Allocation] = []
    while room.total < job.workers:
        remaining = job.workers - room.total
        while (-heap[0][0], -heap[0][1]) != gains[heap[0][3]] or heap[0][3] not in left:
            heapq.heappop(heap)  # stale: taken, or its gain changed since
        whole, part = -heap[0][0], -heap[0][1]
        if whole >= remaining:
            # the last one: among all that finish the job alone, the preferred
            best = next(a for a in left.values() if gains[a.job_id][0] >= remaining)
        elif whole == 0 and part <= 0:
            # none helps on its own (one frees GPUs, another the CPUs of that node): take the
            # preferred; the pruning afterwards drops it if it turns out useless
            best = next(iter(left.values()))
        else:
            best = left[heap[0][3]]
        del left[best.job_id]
        chosen.append(best)
        room.apply(releases[best.job_id], +1)
        touched = {
            a.job_id: a for node_id in releases[best.job_id] for a in by_node[node_id] if a.job_id in left
        }
        for job_id in touched:
            gains[job_id] = room.gain(releases[job_id])
            heapq.heappush(heap, (-gains[job_id][0], -gains[job_id][1], rank[job_id], job_id))
    return chosen


def _drop_unneeded(
    job: JobRequest, chosen: list[Allocation], releases: dict[str, dict[str, Resources]], room: _Room
) -> list[Allocation]:
    """The victims without those the job does not need after all (least preferred dropped first).

    One pass leaves a minimal set: sparing a victim only shrinks what is released, so a
    victim found necessary stays necessary.
    """
    dropped = set()
    for allocation in sorted(chosen, key=victim_rank, reverse=True):
        release = releases[allocation.job_id]
        if room.total_after([], [release]) >= job.workers:
            room.apply(release, -1)
            dropped.add(allocation.job_id)
    return [a for a in chosen if a.job_id not in dropped]


def _releases(allocation: Allocation, need: Resources, avail: dict[str, Resources]) -> dict[str, Resources]:
    """Node id -> what the allocation gives back there, limited to what the job needs."""
    out = {}
    for node_id, count in allocation.placement.items():
        if node_id in avail and count > 0:
            release = {name: allocation.per_worker.get(name, 0.0) * count for name in need}
            if any(amount > 0 for amount in release.values()):
                out[node_id] = release
    return out


def _release_into(avail: dict[str, Resources], allocation: Allocation) -> None:
    for node_id, count in allocation.placement.items():
        free = avail.get(node_id)
        if free is not None:
            for name, amount in allocation.per_worker.items():
                free[name] = free.get(name, 0.0) + amount * count
