"""The newest training rates and losses of the running jobs a page of the queue shows, read
incrementally from the service (`LiveRates`), and a job's restarts: what `GET /api/queue`
adds to the service's job views for the status page. Imports no Ray."""

from __future__ import annotations

import collections
import math
import threading
from typing import Protocol

from core.jobs import HOLDING_VALUES, TERMINAL_VALUES
from core.records import is_train

LIVE_KEYS = ("step", "time", "loss", "samples_per_s", "tokens_per_s", "mfu", "tflops_per_worker")


class MetricsSource(Protocol):
    def metrics(self, job_id: str, since_step: int, newest: int | None = None) -> list[dict]:
        """The job's metrics records with step > since_step (`newest`: only that many, the newest)."""
        ...


def restarts(view: dict) -> int:
    """Admissions that did not resume a preemption: a driver that died, a start that timed out."""
    if isinstance(view.get("restarts"), int):
        return view["restarts"]
    return max((view.get("attempt") or 0) - 1 - (view.get("preemptions") or 0), 0)


class LiveRates:
    """The newest training record of each running job, read incrementally (only records past
    the last step seen), so a page of the queue shows throughput and MFU without reading every
    record of its jobs. Finished jobs show their summary's whole-run figures instead."""

    TRAIL = 120  # training losses of a running job's sparkline, the newest

    def __init__(self, source: MetricsSource):
        self.source = source
        self.lock = threading.Lock()
        self.newest: dict[str, tuple[int, dict | None]] = {}  # job id -> (last step seen, record)
        self.trails: dict[str, collections.deque] = {}  # job id -> [step, loss] of its newest records

    def annotate(self, views: list[dict]) -> list[dict]:
        """Copies of `views`, each with "live" (its newest rates, or None) and "restarts"."""
        views = [dict(view) for view in views]  # the source's own dicts stay as they were
        active = set()
        for view in views:
            job_id, state = view.get("id"), view.get("state")
            view["loss_trail"] = None
            if state in HOLDING_VALUES:  # their rates change while we watch
                active.add(job_id)
                view["live"] = self._running(job_id)
                with self.lock:
                    view["loss_trail"] = list(self.trails.get(job_id, ()))
            elif state in TERMINAL_VALUES:
                view["live"] = self._summary(view.get("summary"))
            else:
                view["live"] = None  # waiting: no rate to speak of
            view["restarts"] = restarts(view)
        # forget jobs that stopped running or are on another page: a later look at one reads its
        # newest TRAIL records again, from the service's memory
        with self.lock:
            for job_id in set(self.newest) - active:
                del self.newest[job_id]
                self.trails.pop(job_id, None)
        return views

    def _running(self, job_id: str) -> dict | None:
        with self.lock:
            last_step, record = self.newest.get(job_id, (-1, None))
        try:
            # the first look at a job needs its newest record and trail, not all it kept
            records = self.source.metrics(job_id, last_step, self.TRAIL)
        except KeyError:
            return None
        trail = []
        for r in records:
            step = r.get("step")
            if not isinstance(step, (int, float)):
                continue
            last_step = max(last_step, int(step))
            if is_train(r) and (record is None or step >= record.get("step", -1)):
                record = {k: r[k] for k in LIVE_KEYS if k in r}
            if is_train(r) and isinstance(r.get("loss"), (int, float)) and math.isfinite(r["loss"]):
                trail.append([int(step), float(r["loss"])])
        with self.lock:
            self.newest[job_id] = (last_step, record)
            self.trails.setdefault(job_id, collections.deque(maxlen=self.TRAIL)).extend(trail)
        return record

    @staticmethod
    def _summary(summary: dict | None) -> dict | None:
        if not summary:
            return None
        rates = summary.get("throughput") or {}
        return {
            "step": summary.get("steps"),
            "loss": summary.get("final_train_loss"),
            "samples_per_s": summary.get("samples_per_s"),
            "tokens_per_s": summary.get("tokens_per_s"),
            "mfu": rates.get("mfu"),
            "tflops_per_worker": rates.get("tflops_per_worker"),
        }
