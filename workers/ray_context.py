"""The Ray Train side of a job: the adapter the loop runs with, and the per-worker function.

The loop (`workers.trainer.train`) is the same as under torchrun; `RayContext` only changes
how a worker learns its rank (Ray Train's context), how checkpoints are saved (each rank
writes its part to a local directory, the only part training waits for, and its upload
thread sends it to `<storage>/<run>/checkpoint_<step>`: `checkpoint_upload.py`; rank 0
announces it once every rank's part is there), where metrics go (the attempt's controller,
`orchestrator/attempt/controller.py`), and how a stop request reaches the loop (rank 0 polls
the controller from a background thread; the loop reads a flag). No worker calls
`ray.train.report` or Ray Train's collectives: the workers need none of Ray Train's barriers,
so a run has no synchronization actor (`orchestrator/ray/internals.py`).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow.fs as pafs
import ray
import ray.train
import torch

from core import storage
from core.run_folder import checkpoint_name
from core.spec import JobSpec
from workers import checkpoint_upload, cpu_priority, replicas
from workers.checkpoint import CheckpointError
from workers.context import RunContext, checkpoint_to_resume

log = logging.getLogger("workers")

# how often rank 0 hands its metrics records to the attempt's controller, and the other ranks
# their own record: each call costs CPU that a busy machine takes from training
SEND_EVERY_S = 2.0
RANK_RECORD_EVERY_S = 5.0
STOP_POLL_S = 1.0  # how often rank 0 asks whether the run should stop
DURABLE_WAIT_S = 600.0  # how long rank 0 waits for the other ranks' parts of a checkpoint
TEARDOWN_UPLOAD_WAIT_S = 120.0  # how long a worker that ends waits for its own uploads


class RayContext(RunContext):
    # the attempt's controller prints progress from the records; a print per record here would only
    # cost time (Ray captures worker output into its log files)
    shows_progress = False
    rank_metrics_every_s = RANK_RECORD_EVERY_S

    def __init__(
        self, spec: JobSpec, run: str, controller, head_node: str | None = None, replica: dict | None = None
    ):
        self.spec, self.name, self.controller = spec, run, controller
        self.head_node = head_node  # the cluster's head node's id, from the launcher
        if replica is not None:  # one of the job's replica groups: which, and their lighthouse
            self.replica_group = replica["group"]
            os.environ[replicas.LIGHTHOUSE_ENV] = replica["lighthouse"]
        self.run_uri = storage.join(spec.checkpoint.storage, run)
        context = ray.train.get_context()
        self.rank = context.get_world_rank()
        self.world_size = context.get_world_size()
        self.local_rank = context.get_local_rank()
        self.group = 0  # which start of the worker group this is (Ray Train restarts it after a failure)
        self._tmp = Path(tempfile.mkdtemp(prefix="orchestrator-"))
        self._pending: list[dict] = []  # metrics records not yet sent
        self._sent_at = time.monotonic()
        self._stop: str | None = None
        self._priority: cpu_priority.Governor | None = None  # a CPU rank's, on the head
        self._polling = threading.Event()
        self._uploads: list[threading.Event] = []  # each checkpoint's part of this rank: sent yet?
        self._settled: list[threading.Event] = []  # ... and, on rank 0, announced and pruned?
        # one upload at a time, in the order of the saves (each sends its files several at once)
        self._uploader = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-upload")

    def setup(self) -> None:
        # Ray Train has already joined the process group (gloo on CPU, NCCL on GPU)
        if self.spec.resources.gpus_per_worker > 0:
            from ray.train.torch import get_device

            self.device = get_device()
        else:
            self.device = torch.device("cpu")
        # this is Ray Train's training thread; the head is where people and the control plane are
        on_head = ray.get_runtime_context().get_node_id() == self.head_node
        peers = cpu_priority.local_peer_pids() if self.device.type == "cpu" else ()
        self._priority = cpu_priority.start(self.device.type, shared_machine=on_head, peers=peers)
        runtime = ray.get_runtime_context()
        group = runtime.get_placement_group_id() or "no-placement-group"
        self.group = ray.get(
            self.controller.join.remote(
                group,
                self.rank,
                self.world_size,
                os.getpid(),
                ray.util.get_node_ip_address(),
                runtime.get_node_id(),
                self.replica_group,
            )
        )
        self.restarts = self.group
        if self.is_main:
            threading.Thread(target=self._poll_stop, name="stop-poller", daemon=True).start()

    def _poll_stop(self) -> None:
        while not self._polling.is_set():
            try:
                asked = self.controller.stop_requested.remote(self.group)
                self._stop = ray.get(asked, timeout=10) or self._stop
            except Exception:  # the driver is gone or busy: keep training, ask again later
                pass
            self._polling.wait(STOP_POLL_S)

    def stop_requested(self) -> str | None:
        return self._stop

    # -- checkpoints ----------------------------------------------------------------------

    def resume_from(self) -> str | None:
        # the newest complete checkpoint in storage, whichever index (Ray's or none) knows it;
        # a restarted worker group always continues its own run
        uri = checkpoint_to_resume(self, "auto" if self.group > 0 else None)
        return self._local(*storage.resolve(uri)) if uri else None

    def _local(self, fs: pafs.FileSystem, path: str) -> str:
        """A checkpoint as a local directory: read in place when local, else downloaded."""
        if isinstance(fs, pafs.LocalFileSystem):
            return path
        local = self._tmp / "resume"
        shutil.rmtree(local, ignore_errors=True)
        local.mkdir(parents=True)
        pafs.copy_files(path, str(local), source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem())
        return str(local)

    def save_checkpoint(
        self,
        step: int,
        write: Callable[[str], None],
        metrics: dict,
        on_durable: Callable[[str], None],
    ) -> str:
        name = checkpoint_name(step)
        local = self._tmp / name
        write(str(local))
        uri = storage.join(self.run_uri, name)
        uploaded, settled = threading.Event(), threading.Event()
        self._uploads.append(uploaded)
        self._settled.append(settled)

        def upload() -> None:
            # on this rank's upload thread, while training goes on; every rank sends its own
            # files, and rank 0 announces the checkpoint once all the ranks' parts are there
            fs, path = storage.resolve(uri)
            sent = False
            try:
                checkpoint_upload.upload(local, fs, path)
                sent = True
            except Exception as err:  # the checkpoint stays incomplete: never announced nor resumed
                log.warning("%s: this rank's part was not uploaded: %s", uri, err)
            finally:
                shutil.rmtree(local, ignore_errors=True)
                uploaded.set()
            try:
                if sent and self.is_main:
                    self._announce(step, uri, on_durable)
            finally:
                settled.set()

        self._uploader.submit(upload)
        if self.is_main:
            self._send()
        return uri

    # -- metrics: batched fire-and-forget calls, never a barrier ---------------------------------

    def log_metrics(self, record: dict) -> None:
        # one actor call per record would cost ~3 ms a step on a busy 2-core machine (the
        # bench measures it): send what has gathered every SEND_EVERY_S instead;
        # records lost with a crashed worker lie after its last checkpoint, which a restart
        # rewinds the log to anyway
        self._pending.append(record)
        if time.monotonic() - self._sent_at >= SEND_EVERY_S:
            self._send()

    def _send(self, durable: bool = False) -> None:
        if self._pending:
            self.controller.log.remote(self.group, self._pending, durable)
            self._pending = []
        self._sent_at = time.monotonic()

    def flush_metrics(self) -> None:
        if self.is_main:  # the controller writes them to the log in storage at once
            self._send(durable=True)

    def log_rank_metrics(self, record: dict) -> None:
        # the loop calls this every `rank_metrics_every_s`: a gauge per rank, the newest wins
        self.controller.log_rank.remote(self.group, self.rank, record)

    def restore_metrics(self, history: list[dict]) -> None:
        if self.is_main and self.spec.fault_tolerance.replica_groups > 1:  # a group comes to lead
            self.controller.lead.remote(self.group, history, self.resumed_from)
        elif self.is_main:
            self.controller.restore.remote(self.group, history, self.resumed_from)

    def replica_healed(self, step: int) -> None:
        if self.is_main:
            self.controller.healed.remote(self.replica_group, step, time.time())

    def _announce(self, step: int, uri: str, on_durable: Callable[[str], None]) -> None:
        # announced and pruned once every rank's part is there
        reason = checkpoint_upload.wait_complete(uri, DURABLE_WAIT_S)
        if reason is None:
            self.controller.checkpoint.remote(self.group, step, uri)
            on_durable(uri)
        else:
            log.warning("%s is not complete %.0f s after its save: %s", uri, DURABLE_WAIT_S, reason)

    def settle_checkpoints(self) -> None:
        # the summary names what pruning left: wait (bounded) for the upload threads' pruning
        deadline = time.monotonic() + TEARDOWN_UPLOAD_WAIT_S
        for settled in self._settled:
            settled.wait(max(deadline - time.monotonic(), 0.0))

    def finish(self, summary: dict) -> None:
        if self.is_main:
            self._send()
            ray.get(self.controller.finish.remote(summary, self.group))

    def teardown(self) -> None:
        self._polling.set()
        if self._priority is not None:
            self._priority.stop()
        if self.is_main:
            self._send()  # a failed run's records up to the failure
        # the local copies go once they are in storage (the upload thread may still be at it)
        deadline = time.monotonic() + TEARDOWN_UPLOAD_WAIT_S
        for uploaded in self._uploads:
            uploaded.wait(max(deadline - time.monotonic(), 0.0))
        self._uploader.shutdown(wait=False)
        shutil.rmtree(self._tmp, ignore_errors=True)


def worth_retrying(err: BaseException) -> bool:
    """Infrastructure failures (a peer died, a network error) may pass on a restart; bad input,
    a checkpoint that does not fit and plain bugs would only fail again."""
    if isinstance(
        err, (CheckpointError, FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)
    ):
        return False
    return isinstance(err, (RuntimeError, OSError, ray.exceptions.RayError))


def train_worker(config: dict) -> None:
    """What each Ray Train worker runs."""
    entered = time.time()
    from workers.run import train

    imported = time.time()
    spec, controller = config["spec"], config["controller"]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if ray.get(controller.fatal.remote()) is not None:
        return  # an earlier worker group failed in a way a restart cannot fix: do not train again
    ctx = RayContext(spec, config["run"], controller, config.get("head_node"), config.get("replica"))
    ctx.started = {"training_function": entered, "loop_imported": imported}
    try:
        summary = train(spec, ctx)
    except Exception as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        ray.get(controller.fail.remote(ctx.rank, reason, worth_retrying(err)))
        raise
    finally:
        ctx.teardown()
    ctx.finish(summary)
