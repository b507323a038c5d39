"""A run's metrics, as the loop (or the driver that watches it) hands them over: the durable
Parquet log in `<run>/metrics/` and, with `metrics.tensorboard: true`, TensorBoard event files.

Whoever writes calls `rewind(history)` once when a run (re)starts from a checkpoint (or from
scratch, with []), then `append(records)` as records come, and `close()` at the end.
"""

from __future__ import annotations

import logging
import tempfile

from core import storage
from core.metrics_log import MetricsWriter
from core.run_folder import TENSORBOARD_DIR
from workers.tensorboard import TensorBoardWriter

log = logging.getLogger("workers")


def tensorboard_writer(run_uri: str) -> TensorBoardWriter:
    """Event files in `<run>/tensorboard/`: written there for local storage; for remote storage
    (SummaryWriter writes local files only) written to a local directory of this process's and
    copied there."""
    folder = storage.join(run_uri, TENSORBOARD_DIR)
    if storage.is_local(run_uri):
        return TensorBoardWriter(storage.resolve(folder)[1])
    name = run_uri.partition("?")[0].rstrip("/").rsplit("/", 1)[-1]
    return TensorBoardWriter(tempfile.mkdtemp(prefix=f"orchestrator-tensorboard-{name}-"), mirror=folder)


class RunLog:
    def __init__(self, run_uri: str, tensorboard: bool = False, flush_every_s: float = 5.0):
        self.metrics = MetricsWriter(run_uri, flush_every_s=flush_every_s)
        self.tensorboard = tensorboard_writer(run_uri) if tensorboard else None
        if self.tensorboard is not None:
            where = self.tensorboard.mirror or self.tensorboard.log_dir
            log.info("TensorBoard event files: %s", where)

    def rewind(self, history: list[dict]) -> None:
        self.metrics.rewind(history)
        if self.tensorboard is not None:
            self.tensorboard.rewind(history)

    def append(self, records: list[dict]) -> None:
        self.metrics.append(records)
        if self.tensorboard is not None:
            self.tensorboard.write(records)

    def flush(self) -> None:
        self.metrics.flush()
        if self.tensorboard is not None:
            self.tensorboard.flush()

    def close(self) -> None:
        self.metrics.flush()
        if self.tensorboard is not None:
            self.tensorboard.close()
