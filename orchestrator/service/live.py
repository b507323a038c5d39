"""The newest metrics of the jobs that report, kept in the service's memory for the status page
and the Prometheus exporter (the durable copy is each run's metrics log in storage)."""

from __future__ import annotations

import collections

from core import metrics_log, records


class LiveMetrics:
    """The newest metrics records of one job, as its driver reports them."""

    # the newest records: the page's loss trail (120) and its charts' refresh; a chart that
    # opens asks for older ones, which come from the run's metrics log (the service keeps
    # a thousand jobs' records in memory: 5,000 each was 5 GB)
    KEEP = 300

    def __init__(self):
        self.records: collections.deque = collections.deque(maxlen=self.KEEP)
        self.latest: dict | None = None
        self.latest_eval: dict | None = None
        self.saves: collections.deque = collections.deque(maxlen=200)
        self.checkpoint_bytes: int | None = None
        self.restarts = 0
        self.ranks: dict[int, dict] = {}  # the newest record of each rank but 0
        self.dropped = False  # older records than those kept were let go

    def clear(self) -> None:
        self.records.clear()
        self.dropped = False
        self.latest = self.latest_eval = None
        self.ranks = {}

    def add(self, batch: list[dict]) -> None:
        seen = self.records[-1].get(records.STEP, -1) if self.records else -1
        for r in batch:
            if r.get(records.STEP, 0) < seen:  # the driver resent what came before a rewind: keep order
                continue
            self.dropped = self.dropped or len(self.records) == self.KEEP
            self.records.append(r)
            kind = records.kind_of(r)
            if kind == records.TRAIN:
                self.latest = r
            elif kind == records.EVAL:
                self.latest_eval = r
            if r.get(records.CHECKPOINT_SAVE_S) is not None:
                self.saves.append(float(r[records.CHECKPOINT_SAVE_S]))
            if r.get(records.CHECKPOINT_BYTES) is not None:
                self.checkpoint_bytes = int(r[records.CHECKPOINT_BYTES])

    def since(self, step: int, newest: int | None = None) -> list[dict]:
        """The records after `step` (only the newest `newest` of them), oldest first. They are
        kept in step order (`add`), so they are found from the newest back: a page polls every
        running job for its newest few."""
        newer = []
        for r in reversed(self.records):
            if r.get(records.STEP, 0) <= step or len(newer) == newest:
                break
            newer.append(r)
        return newer[::-1]

    def older_than(self, step: int) -> bool:
        """Whether records after `step` came before those kept (memory holds only the newest)."""
        return self.dropped and bool(self.records) and self.records[0].get(records.STEP, 0) > step + 1

    def snapshot(self) -> dict:
        return {
            "latest": self.latest,
            "latest_eval": self.latest_eval,
            "ranks": [self.ranks[r] for r in sorted(self.ranks)],
            "checkpoint_saves": list(self.saves),
            "checkpoint_bytes": self.checkpoint_bytes,
        }


def with_logged(kept: list[dict], run_uri: str, since_step: int, newest: int | None) -> list[dict]:
    """`kept` (a job's records after `since_step` in memory) with the older ones memory no
    longer has, read from the run's metrics log; `newest`: only that many, the newest."""
    step = records.STEP
    before = kept[0].get(step, 0) if kept else float("inf")  # the log's part: what memory lacks
    try:
        logged = [r for r in metrics_log.read_metrics(run_uri) if since_step < r.get(step, 0) < before]
    except (FileNotFoundError, OSError):
        logged = []
    found = logged + kept
    return found if newest is None else found[len(found) - newest :] if newest else []
