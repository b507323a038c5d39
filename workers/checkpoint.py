"""Training checkpoints: everything needed to continue a run exactly where it stopped.

Layout of one checkpoint directory:
    .metadata, *.distcp   model and optimizer, via torch.distributed.checkpoint (each rank
                          writes its own shard; loads reshard across world sizes)
    trainer.pt            step, scheduler, grad scaler, early stopping, world size (rank 0)
    rng/rank_<r>.pt       each rank's RNG states (dropout and friends)
    metrics.jsonl         the metrics log up to this step (rank 0), so a resumed run
                          neither loses nor repeats a logged step
    manifest.json         written last (rank 0): every other file with its size and checksum
                          (workers/checkpoint_files.py: what complete and intact mean)

Model and optimizer state go through `get_state_dict`/`set_state_dict`, which give the same
fully-qualified names for a plain model, DDP, FSDP2 (sharded DTensors), compiled blocks and
activation-checkpointed blocks. A checkpoint therefore loads into any strategy and any
world size: DCP reads each tensor's pieces from whichever shard files hold them.

Each rank checksums the files it wrote right after writing them; rank 0 gathers the lists and
writes the manifest. `save_async` (checkpoint.async) stages model and optimizer state into CPU
memory, the only part that blocks training, and writes and checksums the shard files in the
background into a staging directory. `PendingSave.publish` later moves them into the
checkpoint directory next to the files written synchronously (trainer.pt, RNG, metrics,
manifest): a checkpoint is never visible before it is complete.

torch.distributed.checkpoint is imported by the functions that save and load, not with this
module: it costs ~0.5 s of CPU, which every Ray Train worker (and the driver-side actor that
hands them their training function) would otherwise pay before its first training step.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from workers.checkpoint_files import (
    MANIFEST_FILE,
    METADATA_FILE,
    METRICS_FILE,
    TRAINER_FILE,
    damage_reason,
    file_entries,
    incomplete_reason,
    write_manifest,
)

log = logging.getLogger("workers.checkpoint")


class CheckpointError(RuntimeError):
    pass


def _first_failure(err: BaseException) -> str:
    """The readable cause of a DCP failure: CheckpointException wraps each rank's exception."""
    failures = getattr(err, "failures", None)
    if failures:
        err = next(iter(failures.values()))[0]  # a rank's failure: (exception, traceback)
    text = str(err).strip()
    return text.splitlines()[-1] if text else type(err).__name__


def rng_state() -> dict[str, Any]:
    name, keys, pos, has_gauss, cached = np.random.get_state()
    # numpy's state as plain values, so that it loads with weights_only=True
    state = {
        "python": random.getstate(),
        "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _own_files(directory: Path, rank: int) -> list[str]:
    """The model and optimizer files this rank wrote: DCP's file system writer names shard
    files __<rank>_<n>.distcp, and rank 0 writes .metadata."""
    names = sorted(path.name for path in directory.glob(f"__{rank}_*.distcp"))
    return names + ([METADATA_FILE] if rank == 0 else [])


def save(
    directory: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    trainer_state: dict,
    history: list[dict],
    rank: int,
    checksums: bool = True,
) -> None:
    """Collective: every rank calls it with the same directory (local to the rank).
    `checksums=False` lists sizes only: the baseline bench/checkpoint_checksums.py times."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model_state, optim_state = get_state_dict(model, optimizer)
    with warnings.catch_warnings():  # a single process is a fine way to save, not a warning
        warnings.filterwarnings("ignore", message=".*assuming the intent is to")
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(directory))
    rng_file = _write_rng(directory, rng_state(), rank)
    entries = file_entries(directory, [*_own_files(directory, rank), rng_file], checksums)
    _finish(directory, trainer_state, history, rank, entries, checksums)
    _barrier()


def _write_rng(directory: Path, rng: dict, rank: int) -> str:
    name = f"rng/rank_{rank:05d}.pt"
    (directory / "rng").mkdir(parents=True, exist_ok=True)
    torch.save(rng, directory / name)
    return name


def _finish(
    directory: Path,
    trainer_state: dict,
    history: list[dict],
    rank: int,
    entries: dict[str, dict],
    checksums: bool = True,
) -> None:
    """Collective: rank 0 gathers every rank's file entries, then writes the metrics log, the
    trainer state and, last, the manifest that makes the checkpoint complete."""
    gathered = _gather(entries)
    if rank != 0:
        return
    with open(directory / METRICS_FILE, "w") as out:
        out.writelines(json.dumps(record) + "\n" for record in history)
    torch.save({**trainer_state, "manifest": MANIFEST_FILE}, directory / TRAINER_FILE)
    files = {name: entry for part in gathered for name, entry in part.items()}
    files.update(file_entries(directory, [METRICS_FILE, TRAINER_FILE], checksums))
    write_manifest(directory, int(trainer_state["step"]), files)


def _gather(entries: dict[str, dict]) -> list[dict[str, dict]]:
    """Every rank's entries on rank 0 ([] elsewhere)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [entries]
    everyone = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(entries, everyone, dst=0, group=checkpoint_group())
    return everyone or []


_group: tuple[object, object] | None = None  # (the default group it was made for, the group)
_checksummer: ThreadPoolExecutor | None = None


def checkpoint_group():
    """A gloo group for checkpoint collectives: the background writer's must not interleave
    with the training's on the default group, and async save and object collectives need a
    CPU backend under NCCL. Collective the first time (per process group)."""
    global _group
    if not dist.is_initialized():
        return None
    if _group is None or _group[0] is not dist.group.WORLD:
        _group = (dist.group.WORLD, dist.new_group(backend="gloo"))
    return _group[1]


def _checksum_when_written(written: Future, staging: Path, rank: int) -> dict[str, dict]:
    written.result()
    return file_entries(staging, _own_files(staging, rank))


@dataclass
class PendingSave:
    """A checkpoint whose shard files are being written and checksummed in the background."""

    step: int
    staging: Path
    future: Future  # this rank's file entries, once its files are written and checksummed
    trainer_state: dict
    history: list[dict]
    rng: dict
    rank: int
    metrics: dict

    def wait(self) -> None:
        self.future.result()

    def publish(self, directory: str | Path) -> None:
        """Collective: move this rank's shard files into `directory` and write the rest (after `wait`)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        entries = dict(self.future.result())
        for name in entries:
            shutil.move(str(self.staging / name), str(directory / name))  # a rename on the same file system
        rng_file = _write_rng(directory, self.rng, self.rank)
        entries.update(file_entries(directory, [rng_file]))
        _finish(directory, self.trainer_state, self.history, self.rank, entries)


def save_async(
    staging: str | Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    trainer_state: dict,
    history: list[dict],
    rank: int,
    metrics: dict,
) -> PendingSave:
    """Collective: stage state into CPU memory (blocking), write and checksum it in the background."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    global _checksummer
    staging = Path(staging)
    staging.mkdir(parents=True, exist_ok=True)  # ranks may share it: no one clears it here
    model_state, optim_state = get_state_dict(model, optimizer)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to")
        written = dcp.async_save(
            {"model": model_state, "optim": optim_state},
            checkpoint_id=str(staging),
            process_group=checkpoint_group(),
        )
    if _checksummer is None:
        _checksummer = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-checksums")
    checksummed = _checksummer.submit(_checksum_when_written, written, staging, rank)
    # RNG and metrics as of this step: they are written when the checkpoint is published
    return PendingSave(
        step, staging, checksummed, dict(trainer_state), list(history), rng_state(), rank, dict(metrics)
    )


def load(
    directory: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    rank: int,
    world_size: int,
) -> tuple[dict, list[dict]]:
    """Restore model, optimizer and RNG in place; return (trainer_state, metrics history)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    directory = Path(directory)
    reason = incomplete_reason(str(directory))
    if reason is not None:
        raise CheckpointError(f"'{directory}' is not a complete checkpoint: {reason}")
    # plain containers and tensors only: nothing in a checkpoint may run code when read
    trainer_state = torch.load(directory / TRAINER_FILE, weights_only=True)
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*assuming the intent is to")
            dcp.load(state, checkpoint_id=str(directory))
    except (Exception, CheckpointException) as err:  # DCP's CheckpointException is a BaseException
        # resume checked the bytes of a checkpoint with a manifest; one without may be damaged
        unchecked = "" if trainer_state.get("manifest") else " (or is damaged: it has no checksums to tell)"
        raise CheckpointError(
            f"checkpoint '{directory}' does not fit this model{unchecked}: {_first_failure(err)}"
        ) from err
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])

    rng_file = directory / "rng" / f"rank_{rank:05d}.pt"
    if trainer_state["world_size"] == world_size and rng_file.exists():
        set_rng_state(torch.load(rng_file, weights_only=True))
    else:
        # a different world size has no matching per-rank RNG stream: reseed deterministically
        seed = int(trainer_state["seed"]) * 7919 + int(trainer_state["step"]) * 31 + rank
        random.seed(seed), np.random.seed(seed % 2**32), torch.manual_seed(seed)
        if rank == 0:
            log.warning(
                "resuming a %d-worker checkpoint on %d workers: weights and optimizer are "
                "resharded exactly; dropout RNG streams are reseeded",
                trainer_state["world_size"],
                world_size,
            )
    history = []
    metrics_file = directory / METRICS_FILE
    if metrics_file.exists():
        history = [json.loads(line) for line in metrics_file.read_text().splitlines() if line]
    return trainer_state, history


def read_model_state(directory: str | Path) -> dict[str, torch.Tensor]:
    """The full, unsharded model state dict of a checkpoint, read on the CPU in this process.

    Works for a checkpoint of any strategy and world size: the names are the model's own
    (no DDP/compile/checkpoint-wrapper prefixes) and DCP assembles each tensor from its shards.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    directory = Path(directory)
    if not (directory / METADATA_FILE).exists():
        raise CheckpointError(f"'{directory}' is not a checkpoint directory (no .metadata)")
    damage = damage_reason(str(directory))
    if damage is not None:
        raise CheckpointError(f"checkpoint '{directory}' is damaged: {damage}")
    metadata = FileSystemReader(str(directory)).read_metadata()
    state = {
        key.removeprefix("model."): torch.empty(item.size, dtype=item.properties.dtype)
        for key, item in metadata.state_dict_metadata.items()
        if key.startswith("model.") and isinstance(item, TensorStorageMetadata)
    }
    if not state:
        raise CheckpointError(f"checkpoint '{directory}' holds no model weights")
    with warnings.catch_warnings():  # one process reading every shard is the point here
        warnings.filterwarnings("ignore", message=".*assuming the intent is to")
        dcp.load({"model": state}, checkpoint_id=str(directory), no_dist=True)
    return state
