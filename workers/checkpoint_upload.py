"""A rank's part of a checkpoint, from local disk to storage, and knowing when the whole of it
is there.

Each rank writes its part to local disk first (the only part training waits for), then
uploads it: on Ray from the rank's upload thread (`workers/ray_context.py`), off the
training path. `upload` sends several files at once, and pyarrow writes
each file's parts in the background (S3 multipart uploads), so one large shard does not hold
up the rest. Ray's own uploader sends one file at a time to S3 (`use_threads=False`, for an
old pyarrow deadlock); bench/checkpoint_storage.py measures the difference.

A checkpoint is durable once it is complete in storage (`checkpoint_files.incomplete_reason`:
every rank's files at full size, manifest included); rank 0 waits for that (`wait_complete`)
before the run announces the checkpoint or prunes older ones.
"""

from __future__ import annotations

import logging
import posixpath
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow.fs as pafs

from workers.checkpoint_files import incomplete_reason

UPLOAD_THREADS = 8
_BUFFER = 8 << 20

log = logging.getLogger("workers")


def upload(local_dir: str | Path, fs: pafs.FileSystem, path: str) -> int:
    """Every file under `local_dir` to `path` on `fs`, UPLOAD_THREADS at a time; the bytes sent."""
    local_dir = Path(local_dir)
    files = sorted(p for p in local_dir.rglob("*") if p.is_file())
    for folder in sorted({posixpath.dirname(p.relative_to(local_dir).as_posix()) for p in files}):
        fs.create_dir(posixpath.join(path, folder) if folder else path, recursive=True)

    def send(source: Path) -> int:
        with (
            open(source, "rb") as src,
            fs.open_output_stream(posixpath.join(path, source.relative_to(local_dir).as_posix())) as out,
        ):
            shutil.copyfileobj(src, out, _BUFFER)
        return source.stat().st_size

    with ThreadPoolExecutor(min(UPLOAD_THREADS, max(len(files), 1))) as pool:
        return sum(pool.map(send, files))


def wait_complete(uri: str, timeout_s: float, poll_s: float = 0.25, max_poll_s: float = 2.0) -> str | None:
    """Wait until the checkpoint at `uri` is complete in storage (the other ranks upload
    their parts meanwhile); None once it is, else why it still is not after `timeout_s`.
    Each look lists and reads storage in Python, on a thread that shares the interpreter lock
    with training: the looks thin out (x1.5 each, to `max_poll_s`) while an upload is long."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            reason = incomplete_reason(uri)
        except Exception as err:  # a listing that failed now may work at the next poll
            reason = f"cannot be read ({type(err).__name__}: {err})"
        if reason is None or time.monotonic() > deadline:
            return reason
        time.sleep(poll_s)
        poll_s = min(poll_s * 1.5, max_poll_s)
