"""Training checkpoints: everything needed to continue a run exactly where it stopped.

Layout of one checkpoint directory:
    .metadata, *.distcp   model and optimizer, via torch.distributed.checkpoint (each rank
                          writes its own shard; loads reshard across world sizes)
    trainer.pt            step, scheduler, grad scaler, early stopping, world size (rank 0)
    rng/rank_<r>.pt       each rank's RNG states (dropout and friends)
    metrics.jsonl         the metrics log up to this step (rank 0), so a resumed run
                          neither loses nor repeats a logged step

Model and optimizer state go through `get_state_dict`/`set_state_dict`, which give the same
fully-qualified names for a plain model, DDP, FSDP2 (sharded DTensors), compiled blocks and
activation-checkpointed blocks. A checkpoint therefore loads into any strategy and any
world size: DCP reads each tensor's pieces from whichever shard files hold them.

`save_async` (checkpoint.async) stages model and optimizer state into CPU memory, the only
part that blocks training, and writes the shard files in a background thread into a staging
directory. `PendingSave.publish` later moves them into the checkpoint directory next to the
files written synchronously (trainer.pt, RNG, metrics): a checkpoint is never visible
before it is complete.
"""

from __future__ import annotations

import enum
import io
import json
import logging
import pickle
import posixpath
import random
import shutil
import warnings
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.fs as pafs
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from core import storage
from core.run_folder import checkpoint_step

log = logging.getLogger("workers.checkpoint")

TRAINER_FILE = "trainer.pt"
METRICS_FILE = "metrics.jsonl"
METADATA_FILE = ".metadata"


class _MetadataUnpickler(pickle.Unpickler):
    """DCP pickles its .metadata; reading a checkpoint must never run code from it, so only
    DCP's own metadata classes and a few plain types may be rebuilt."""

    def find_class(self, module: str, name: str):
        if module.startswith("torch.distributed.checkpoint.") or (module, name) in (
            ("torch", "Size"),
            ("torch.serialization", "_get_layout"),  # a layout by name
            ("pathlib", "PosixPath"),  # where it was written
            ("pathlib", "PurePosixPath"),
            ("collections", "OrderedDict"),
            ("builtins", "set"),
            ("builtins", "frozenset"),
        ):
            return super().find_class(module, name)
        if module == "torch":
            value = getattr(torch, name, None)
            if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
                return value
        if (module, name) == ("builtins", "getattr"):
            # some Python versions (Debian's 3.11.2) pickle an enum member as getattr(cls, name)
            return _enum_member
        raise pickle.UnpicklingError(f"{module}.{name} is not part of checkpoint metadata")


def _enum_member(cls, name: str):
    """getattr for enum members only: any other attribute could reach code."""
    if isinstance(cls, type) and issubclass(cls, enum.Enum) and name in cls.__members__:
        return cls.__members__[name]
    raise pickle.UnpicklingError(f"{getattr(cls, '__name__', cls)}.{name} is not part of checkpoint metadata")


def incomplete_reason(uri: str) -> str | None:
    """None when the checkpoint at `uri` (any storage) is complete, else why it is not.

    The one definition of a complete checkpoint: its trainer state is readable, every rank's
    RNG file is there, DCP's metadata is readable, and every shard file it names holds all
    the bytes the metadata points into (a write killed half-way leaves a short file)."""
    fs, path = storage.resolve(uri)
    try:
        with fs.open_input_stream(posixpath.join(path, TRAINER_FILE)) as src:
            trainer_state = torch.load(io.BytesIO(src.read()), weights_only=True)
        world_size, step = int(trainer_state["world_size"]), int(trainer_state["step"])
    except FileNotFoundError:
        return f"no {TRAINER_FILE}"
    except Exception as err:  # truncated or not ours
        return f"{TRAINER_FILE} is unreadable ({type(err).__name__})"
    if checkpoint_step(path) not in (None, step):
        return f"{TRAINER_FILE} is for step {step}"
    names = {posixpath.basename(i.path): i for i in fs.get_file_info(pafs.FileSelector(path, recursive=True))}
    missing = [f"rng/rank_{r:05d}.pt" for r in range(world_size) if f"rank_{r:05d}.pt" not in names]
    if missing:
        return f"missing {missing[0]}" + (f" and {len(missing) - 1} more" if len(missing) > 1 else "")
    try:
        with fs.open_input_stream(posixpath.join(path, METADATA_FILE)) as src:
            metadata = _MetadataUnpickler(io.BytesIO(src.read())).load()
    except FileNotFoundError:
        return f"no {METADATA_FILE}"
    except Exception as err:
        return f"{METADATA_FILE} is unreadable ({type(err).__name__})"
    needed: dict[str, int] = {}
    for info in (getattr(metadata, "storage_data", None) or {}).values():
        relative = str(info.relative_path)
        needed[relative] = max(needed.get(relative, 0), int(info.offset) + int(info.length))
    for relative, size in sorted(needed.items()):
        found = names.get(posixpath.basename(relative))
        if found is None:
            return f"missing shard {relative}"
        if found.size is not None and found.size < size:
            return f"shard {relative} is truncated ({found.size} of {size} bytes)"
    return None


def newest_complete(run_uri: str) -> tuple[str | None, list[dict]]:
    """(the newest complete checkpoint of a run, [{"checkpoint", "reason"}] of the newer
    ones skipped because they are incomplete); (None, ...) when there is none."""
    skipped = []
    for name in sorted(storage.list_dirs(run_uri), reverse=True):
        if checkpoint_step(name) is None:
            continue
        uri = storage.join(run_uri, name)
        reason = incomplete_reason(uri)
        if reason is None:
            return uri, skipped
        skipped.append({"checkpoint": name, "reason": reason})
    return None, skipped


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


def save(
    directory: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    trainer_state: dict,
    history: list[dict],
    rank: int,
) -> None:
    """Collective: every rank calls it with the same directory (local to the rank)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model_state, optim_state = get_state_dict(model, optimizer)
    with warnings.catch_warnings():  # a single process is a fine way to save, not a warning
        warnings.filterwarnings("ignore", message=".*assuming the intent is to")
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(directory))
    _write_side_files(directory, trainer_state, history, rng_state(), rank)
    _barrier()


def _write_side_files(
    directory: Path, trainer_state: dict, history: list[dict], rng: dict, rank: int
) -> None:
    (directory / "rng").mkdir(parents=True, exist_ok=True)
    torch.save(rng, directory / "rng" / f"rank_{rank:05d}.pt")
    if rank == 0:
        with open(directory / METRICS_FILE, "w") as out:
            out.writelines(json.dumps(record) + "\n" for record in history)
        torch.save(trainer_state, directory / TRAINER_FILE)  # last: marks the checkpoint complete


_async_group = None


def _checkpoint_group():
    """A gloo group for the background writer: its collectives must not interleave with the
    training's on the default group (and async save needs a CPU backend under NCCL)."""
    global _async_group
    if not dist.is_initialized():
        return None
    if _async_group is None:
        _async_group = dist.new_group(backend="gloo")
    return _async_group


@dataclass
class PendingSave:
    """A checkpoint whose shard files are being written in the background."""

    step: int
    staging: Path
    future: Future
    trainer_state: dict
    history: list[dict]
    rng: dict
    rank: int
    metrics: dict

    def wait(self) -> None:
        self.future.result()

    def publish(self, directory: str | Path) -> None:
        """Move this rank's shard files into `directory` and write the rest (after `wait`)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        # DCP's file system writer names shard files __<rank>_<n>.distcp; rank 0 writes .metadata
        mine = list(self.staging.glob(f"__{self.rank}_*.distcp"))
        if self.rank == 0:
            mine.append(self.staging / ".metadata")
        for path in mine:
            shutil.move(str(path), str(directory / path.name))  # a rename on the same file system
        _write_side_files(directory, self.trainer_state, self.history, self.rng, self.rank)


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
    """Collective: stage state into CPU memory (blocking), write it in the background."""
    staging = Path(staging)
    staging.mkdir(parents=True, exist_ok=True)  # ranks may share it: no one clears it here
    model_state, optim_state = get_state_dict(model, optimizer)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to")
        future = dcp.async_save(
            {"model": model_state, "optim": optim_state},
            checkpoint_id=str(staging),
            process_group=_checkpoint_group(),
        )
    # RNG and metrics as of this step: they are written when the checkpoint is published
    return PendingSave(
        step, staging, future, dict(trainer_state), list(history), rng_state(), rank, dict(metrics)
    )


def load(
    directory: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    rank: int,
    world_size: int,
) -> tuple[dict, list[dict]]:
    """Restore model, optimizer and RNG in place; return (trainer_state, metrics history)."""
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
        raise CheckpointError(
            f"checkpoint '{directory}' does not fit this model: {_first_failure(err)}"
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
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    directory = Path(directory)
    if not (directory / ".metadata").exists():
        raise CheckpointError(f"'{directory}' is not a checkpoint directory (no .metadata)")
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
