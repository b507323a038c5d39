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

Shrinking comes before stopping (`choose_shrinks`): candidates that are elastic (they may
run at a smaller size) give back workers instead of stopping. A shrunk job is modelled as
dropping workers from its placement, from the nodes where it has the fewest first (ties by
node id), so that whole nodes come free and the rest of its placement stays where it is.
Candidates are taken in victim order, each shrunk one allowed size at a time until the job
fits, and then every earlier one is given back as many workers as the job can spare (least
preferred first). The caller may still turn such a plan down (`accept`: the policy checks
that the shrunk jobs can start again beside the job), and the search goes on shrinking.
Shrinking and stopping are not mixed: when shrinking every candidate to its smallest size is
not enough, the caller stops whole jobs with `choose_victims`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Mapping

from orchestrator.policy.admission import EPS, UNBOUNDED, place, positive, slots
from orchestrator.policy.types import Allocation, JobRequest, Node, Resources

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
    eligible: Callable[[Allocation], bool] | None = None,
    rank: Callable[[Allocation], tuple] = victim_rank,
) -> list[str] | None:
    """Job ids to stop so that `job` fits, most preferred first; [] if it fits without any.

    Allocations already `stopping` are never chosen again, and the resources they hold count
    as released (they are on their way out): a job that will fit once they have stopped gets
    [] and waits for them. None when even stopping every candidate would not make it fit.
    `eligible` and `rank` replace `can_preempt` and `victim_rank` for other reasons to
    preempt than priority (LAS within a queue, reclaim of borrowed quota).
    """
    eligible = eligible or (lambda allocation: can_preempt(job, allocation))
    need = positive(job.per_worker)
    allocations = list(allocations)
    node_ids = [node.id for node in nodes if node.id not in job.avoid_nodes]  # only where it may go
    avail = {node_id: dict(free_by_node.get(node_id, {})) for node_id in node_ids}
    for allocation in allocations:
        if allocation.stopping:
            _release_into(avail, allocation)
    room = _Room(need, avail)
    if room.total >= job.workers:
        return []

    candidates = sorted((a for a in allocations if eligible(a) and not a.stopping), key=rank)
    releases = {a.job_id: _releases(a, need, avail) for a in candidates}
    candidates = [a for a in candidates if releases[a.job_id]]
    if not candidates or room.total_after([releases[a.job_id] for a in candidates], []) < job.workers:
        return None

    chosen = _drop_unneeded(job, _greedy(job, candidates, releases, room), releases, room, rank)
    taken = {a.job_id for a in chosen}
    pool = [a for a in candidates if a.job_id not in taken]  # in rank order
    # swap a victim for a preferred candidate where the job still fits (same count, better ranks)
    trials = 0
    for allocation in sorted(chosen, key=rank, reverse=True):
        for candidate in pool:
            if trials >= SWAP_TRIALS or rank(candidate) >= rank(allocation):
                break
            trials += 1
            add, remove = releases[candidate.job_id], releases[allocation.job_id]
            if room.total_after([add], [remove]) >= job.workers:
                room.apply(remove, -1)
                room.apply(add, +1)
                chosen = [candidate if a.job_id == allocation.job_id else a for a in chosen]
                pool = sorted([a for a in pool if a.job_id != candidate.job_id] + [allocation], key=rank)
                break
    # a preferred candidate may free more than the victim it replaced: drop what that spares
    chosen = _drop_unneeded(job, chosen, releases, room, rank)
    return [a.job_id for a in sorted(chosen, key=rank)]


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
    job: JobRequest,
    chosen: list[Allocation],
    releases: dict[str, dict[str, Resources]],
    room: _Room,
    rank: Callable[[Allocation], tuple] = victim_rank,
) -> list[Allocation]:
    """The victims without those the job does not need after all (least preferred dropped first).

    One pass leaves a minimal set: sparing a victim only shrinks what is released, so a
    victim found necessary stays necessary.
    """
    dropped = set()
    for allocation in sorted(chosen, key=rank, reverse=True):
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
    _add_workers(avail, allocation.placement, allocation.per_worker)


def _add_workers(
    avail: dict[str, Resources], placement: Mapping[str, int], per_worker: Mapping[str, float]
) -> None:
    """Give the workers of `placement` back to `avail` (nodes that are gone are skipped)."""
    for node_id, count in placement.items():
        free = avail.get(node_id)
        if free is not None:
            for name, amount in per_worker.items():
                free[name] = free.get(name, 0.0) + amount * count


def shrunk_placement(placement: Mapping[str, int], size: int) -> tuple[dict[str, int], dict[str, int]]:
    """(kept, dropped): a placement cut down to `size` workers, and the workers it gives back.

    Workers go from the nodes where the job has the fewest first (ties by node id), so the
    nodes it barely uses come free whole instead of leaving a worker's hole on every node.
    """
    drop = sum(placement.values()) - size
    kept, dropped = dict(placement), {}
    for node_id, count in sorted(placement.items(), key=lambda item: (item[1], item[0])):
        if drop <= 0:
            break
        taken = min(count, drop)
        dropped[node_id] = taken
        kept[node_id] = count - taken
        drop -= taken
    return {n: c for n, c in kept.items() if c > 0}, dropped


def choose_shrinks(
    job: JobRequest,
    allocations: Iterable[Allocation],
    nodes: Iterable[Node],
    free_by_node: Mapping[str, Mapping[str, float]],
    accept: Callable[[dict[str, int]], bool] | None = None,
) -> dict[str, int] | None:
    """Elastic jobs to shrink so that `job` fits: job id -> its new size; None if none does it.

    Candidates are those `choose_victims` could stop that have an allowed size below their
    current one. A plan counts only if `job` fits into the free resources plus the workers the
    shrunk jobs give back, and `accept(plan)` agrees (the caller checks there that the shrunk
    jobs can start again beside `job`). Stopping jobs count as released, as in `choose_victims`.
    """
    allocations = list(allocations)
    candidates = sorted(
        (a for a in allocations if a.sizes and can_preempt(job, a) and _smaller_sizes(a)), key=victim_rank
    )
    if not candidates:
        return None
    by_id = {a.job_id: a for a in candidates}
    avail = {node.id: dict(free_by_node.get(node.id, {})) for node in nodes}
    for allocation in allocations:
        if allocation.stopping:
            _add_workers(avail, allocation.placement, allocation.per_worker)

    def fits_with(plan: dict[str, int]) -> bool:
        trial = {node_id: dict(free) for node_id, free in avail.items()}
        for job_id, size in plan.items():
            allocation = by_id[job_id]
            _add_workers(trial, shrunk_placement(allocation.placement, size)[1], allocation.per_worker)
        return place(job, trial) is not None

    # a quick "no": not even shrinking every candidate as far as it goes makes room
    if not fits_with({a.job_id: _smaller_sizes(a)[-1] for a in candidates}):
        return None
    plan: dict[str, int] = {}
    for index, allocation in enumerate(candidates):
        sizes = _smaller_sizes(allocation)
        for size in sizes:  # largest first: the least shrink that lets the job fit
            trial = {**plan, allocation.job_id: size}
            if fits_with(trial):
                trial = _give_back(candidates[:index], trial, fits_with)
                if accept is None or accept(trial):
                    return trial
        plan[allocation.job_id] = sizes[-1]
    return None


def _smaller_sizes(allocation: Allocation) -> list[int]:
    """The allowed sizes below its current size, largest first ([] for a job of one size)."""
    return [size for size in allocation.sizes if size < allocation.workers] if allocation.elastic else []


def _give_back(
    shrunk: list[Allocation], plan: dict[str, int], fits: Callable[[dict[str, int]], bool]
) -> dict[str, int]:
    """The plan with each fully shrunk earlier candidate kept as large as the job still `fits`.

    Least preferred first, as `_drop_unneeded` does: one that needs no shrink leaves the plan.
    """
    for allocation in sorted(shrunk, key=victim_rank, reverse=True):
        current = allocation.workers
        larger = [current] + [size for size in allocation.sizes if plan[allocation.job_id] < size < current]
        for size in larger:  # largest first: not shrunk at all, then one size less, ...
            trial = {**plan, allocation.job_id: size}
            if size == current:
                del trial[allocation.job_id]
            if fits(trial):
                plan = trial
                break
    return plan
