"""Which of the nodes Ray lists alive the service has reason to think dead.

Ray's node table says a node is dead only once the cluster's health checks give up on it
(15 s to over a minute with Ray's defaults; `orchestrator/ray/node_health.py`). The service
probes every live node itself, in the background, every `every_s`:

    unreachable   its raylet refused a connection (nothing listens there), or did not answer
                  twice in a row: no job is placed there, the jobs on it are requeued
    in doubt      a job on it just failed in its collectives (a peer reset, a rank gone), and
                  no probe has answered since: no job is placed there until one does

A node that answers again is usable again. Pure bookkeeping around an injected `probe`
(address, port) -> None or why: the tests drive it with a fake clock and fake probes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

PROBE_EVERY_S = 2.0
MISSES = 2  # probes in a row without an answer before a node counts as unreachable


@dataclass
class _Probe:
    started: float
    future: Future


class NodeWatch:
    def __init__(
        self,
        probe: Callable[[str, int], str | None],
        every_s: float = PROBE_EVERY_S,
        clock: Callable[[], float] = time.time,
        pool: ThreadPoolExecutor | None = None,
    ):
        self.probe, self.every_s, self.clock = probe, every_s, clock
        self.pool = pool or ThreadPoolExecutor(8, thread_name_prefix="node-probe")
        self.pending: dict[str, _Probe] = {}
        self.last_started: dict[str, float] = {}
        self.answered_at: dict[str, float] = {}  # start time of the newest probe that was answered
        self.misses: dict[str, tuple[int, str]] = {}  # node -> (probes in a row that failed, why)
        self.doubted: dict[str, float] = {}  # node -> since when

    def update(self, nodes: dict[str, tuple[str, int]]) -> list[str]:
        """Take in finished probes and start new ones for `nodes` ({id: (address, raylet port)},
        those Ray lists alive). Returns the nodes that became unreachable just now."""
        before = set(self.unreachable())
        for node in list(self.pending):
            if node not in nodes:
                del self.pending[node]
            elif self.pending[node].future.done():
                self._record(node, self.pending.pop(node))
        for gone in set(self.last_started) - set(nodes):  # Ray no longer lists it: forget it
            for table in (self.last_started, self.answered_at, self.misses, self.doubted):
                table.pop(gone, None)
        now = self.clock()
        for node, (address, port) in nodes.items():
            due = node in self.doubted or now - self.last_started.get(node, -1e18) >= self.every_s
            if node not in self.pending and due:
                self.last_started[node] = now
                self.pending[node] = _Probe(now, self.pool.submit(self.probe, address, port))
        return sorted(set(self.unreachable()) - before)

    def _record(self, node: str, probe: _Probe) -> None:
        try:
            why = probe.future.result()
        except Exception as err:  # a probe that itself broke says nothing about the node
            why = f"probe failed: {err}"
        if why is None:
            self.answered_at[node] = probe.started
            self.misses.pop(node, None)
            if self.doubted.get(node, float("inf")) <= probe.started:
                del self.doubted[node]
            return
        count = self.misses.get(node, (0, ""))[0] + 1
        # a refused connection is certain: nothing listens where the raylet was
        self.misses[node] = (MISSES if why == "refused" else count, why)

    def unreachable(self) -> dict[str, str]:
        """{node: why} of the nodes whose raylet does not answer."""
        return {node: why for node, (count, why) in self.misses.items() if count >= MISSES}

    def doubt(self, nodes: list[str], since: float) -> None:
        """A job on `nodes` failed in its collectives at `since`: hold them until a probe
        started after it is answered."""
        for node in nodes:
            self.doubted[node] = max(self.doubted.get(node, since), since)

    def cleared(self, node: str, since: float) -> bool:
        """Whether a probe started at or after `since` was answered."""
        return self.answered_at.get(node, -1e18) >= since

    def unusable(self) -> set[str]:
        """Nodes no job may be placed on now: unreachable or in doubt."""
        return set(self.unreachable()) | set(self.doubted)
