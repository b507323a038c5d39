"""TensorBoard event files of a run's metrics (`metrics.tensorboard: true`).

Every numeric field of a record becomes a scalar at x = its step: training records under
`train/<field>` (`train/loss`, `train/lr`, `train/samples_per_s`, ...), eval records under
`eval/<field>` without the `eval_` prefix (`eval/loss`, `eval/accuracy`); "step" and "time"
are the axes, not scalars ("time" is the event's wall time).

`torch.utils.tensorboard.SummaryWriter` writes local files only. With local checkpoint storage
(a path, NFS, file://) the caller passes `<run dir>/tensorboard/`, next to the checkpoints; with
remote storage (s3://, gs://, ...) it passes a local directory of its own and `mirror`, the
run's `tensorboard/` in storage: the event files are copied there every `mirror_every_s` and
at the end, so `tensorboard --logdir s3://bucket/runs/<run>/tensorboard` shows the run
(TensorBoard reads s3:// through boto3, which takes the same AWS_* settings).

A restart from a checkpoint calls `rewind(history)`: the new event file starts with
TensorBoard's purge marker at step 0, which hides everything earlier files logged, and then
holds `history` again, so TensorBoard shows exactly the run's metrics log.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from core import records, storage

SKIPPED_FIELDS = ("step", "time")


def scalars(record: dict) -> list[tuple[str, float]]:
    """(tag, value) of each numeric field of one record."""
    is_eval = records.is_eval(record)
    out = []
    for key, value in record.items():
        if key in SKIPPED_FIELDS or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        out.append((f"eval/{key.removeprefix('eval_')}" if is_eval else f"train/{key}", float(value)))
    return out


class TensorBoardWriter:
    def __init__(
        self,
        log_dir: str | os.PathLike,
        flush_secs: int = 10,
        mirror: str | None = None,
        mirror_every_s: float = 10.0,
    ):
        text = str(log_dir)
        if "://" in text and not text.startswith("file://"):
            raise ValueError(f"TensorBoard event files go to a local directory, not '{text}'")
        self.log_dir = Path(text.removeprefix("file://"))
        self.flush_secs = flush_secs
        self.mirror, self.mirror_every_s = mirror, mirror_every_s
        self._mirrored: dict[str, int] = {}  # event file -> size when last copied
        self._mirrored_at = time.monotonic()
        self._writer = None

    def _open(self, purge_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: seconds, only when used

        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._writer = SummaryWriter(str(self.log_dir), purge_step=purge_step, flush_secs=self.flush_secs)
        return self._writer

    def rewind(self, history: list[dict]) -> None:
        """TensorBoard now shows exactly `history` (a run's start or restart from a checkpoint)."""
        self.close()
        self._open(purge_step=0)
        self.write(history)

    def write(self, records: list[dict]) -> None:
        writer = self._writer or self._open()
        for record in records:
            step = record.get("step")
            if step is None:
                continue
            walltime = record.get("time")
            walltime = float(walltime) if isinstance(walltime, (int, float)) else None
            for tag, value in scalars(record):
                writer.add_scalar(tag, value, global_step=int(step), walltime=walltime)
        if self.mirror and time.monotonic() - self._mirrored_at >= self.mirror_every_s:
            self.flush()

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()
        self._copy_to_mirror()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._copy_to_mirror()

    def _copy_to_mirror(self) -> None:
        """The event files that grew since the last copy, whole, to `mirror` (TensorBoard's
        files are appended to: a copy is never half of what it was)."""
        if not self.mirror or not self.log_dir.is_dir():
            return
        self._mirrored_at = time.monotonic()
        fs, root = storage.resolve(self.mirror)
        for path in sorted(p for p in self.log_dir.iterdir() if p.is_file()):
            size = path.stat().st_size
            if self._mirrored.get(path.name) == size:
                continue
            fs.create_dir(root, recursive=True)
            with open(path, "rb") as src, fs.open_output_stream(f"{root}/{path.name}") as out:
                shutil.copyfileobj(src, out)
            self._mirrored[path.name] = size
