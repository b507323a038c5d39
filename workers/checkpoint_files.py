"""A checkpoint's files in storage: which checkpoints are complete, which are intact, which a
run resumes from and which pruning may delete. Any pyarrow filesystem.

Two definitions, each in one place, because they cost very differently:

- *complete* (`incomplete_reason`): every file a save writes is there, at full size. It reads
  only small files and a listing, so pruning asks it at every save.
- *intact* (`damage_reason`): every file still holds the bytes it was saved with, against the
  checksums in the manifest. It reads the whole checkpoint, so only resume asks it, once.

The manifest (`manifest.json`, written last, by rank 0) lists every other file of the
checkpoint with its size and an xxh3-128 checksum, taken by the rank that wrote the file right
after writing it, in place in the page cache (xxh3 hashes at memory speed;
bench/checkpoint_checksums.py measures the cost). The manifest carries a checksum of its own
content, so a damaged manifest is seen too. `trainer.pt` says that a manifest follows, so a save
cut short right before it is incomplete. Checkpoints saved before manifests existed have neither:
they are complete by the other checks and resumed from unverified.

Pruning (`prune`) keeps `checkpoint.keep` complete checkpoints at or below the step just saved
and deletes older complete ones. Anything else (a folder that is not a complete checkpoint, or
one ahead of the step just saved, which belongs to another history of the run) it cannot judge,
so it leaves it in place and says so: a stray folder never pushes a real checkpoint out.
"""

from __future__ import annotations

import enum
import io
import json
import mmap
import os
import pickle
import posixpath
from pathlib import Path
from typing import BinaryIO

import pyarrow.fs as pafs
import torch
import xxhash

from core import storage
from core.run_folder import checkpoint_step

TRAINER_FILE = "trainer.pt"
METRICS_FILE = "metrics.jsonl"
METADATA_FILE = ".metadata"
MANIFEST_FILE = "manifest.json"
HASH = "xxh3_128"  # ~25 GB/s on one core; not cryptographic: it guards against rot, not attack
_CHUNK = 1 << 20


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


# -- writing: checksums and the manifest ------------------------------------------------------


def _checksum(source: BinaryIO) -> str:
    """Of a stream from any storage."""
    digest = xxhash.xxh3_128()
    while chunk := source.read(_CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def _local_checksum(path: str | Path) -> tuple[int, str]:
    """(size, checksum) of a local file, hashed in place from the page cache (a mapping: no
    copy, twice as fast as reading it; xxhash lets go of the GIL meanwhile)."""
    with open(path, "rb") as source:
        size = os.fstat(source.fileno()).st_size
        if size == 0:  # an empty file cannot be mapped
            return 0, xxhash.xxh3_128().hexdigest()
        with mmap.mmap(source.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            return size, xxhash.xxh3_128(mapped).hexdigest()


def file_entries(directory: Path, names: list[str], checksums: bool = True) -> dict[str, dict]:
    """{name: {"size", "checksum"}} of files under a local checkpoint directory. Without
    `checksums`, sizes only (how bench/checkpoint_checksums.py times a save without them)."""
    entries = {}
    for name in names:
        if checksums:
            size, checksum = _local_checksum(directory / name)
            entries[name] = {"size": size, "checksum": checksum}
        else:
            entries[name] = {"size": (directory / name).stat().st_size}
    return entries


def _digest(body: dict) -> str:
    return xxhash.xxh3_128(json.dumps(body, sort_keys=True).encode()).hexdigest()


def write_manifest(directory: Path, step: int, files: dict[str, dict]) -> None:
    """The last file of a save: what every other file holds."""
    body = {"step": step, "hash": HASH, "files": dict(sorted(files.items()))}
    partial = directory / f".{MANIFEST_FILE}.partial"
    partial.write_text(json.dumps({**body, "digest": _digest(body)}, indent=1) + "\n")
    os.replace(partial, directory / MANIFEST_FILE)  # never half a manifest under its name


def _read_manifest(fs: pafs.FileSystem, path: str) -> tuple[dict | None, str | None]:
    """(manifest, None) or (None, why it cannot be used)."""
    try:
        with fs.open_input_stream(posixpath.join(path, MANIFEST_FILE)) as src:
            manifest = json.loads(src.read())
        body = {k: manifest[k] for k in ("step", "hash", "files")}
        if manifest["digest"] != _digest(body):
            return None, f"{MANIFEST_FILE} is damaged"
    except FileNotFoundError:
        return None, f"no {MANIFEST_FILE}"
    except Exception:  # not JSON, fields missing: damaged just the same
        return None, f"{MANIFEST_FILE} is damaged"
    if body["hash"] != HASH:
        return None, f"{MANIFEST_FILE} uses a checksum this version does not know ({body['hash']})"
    return body, None


# -- complete ---------------------------------------------------------------------------------


def _trainer_state(fs: pafs.FileSystem, path: str) -> dict:
    with fs.open_input_stream(posixpath.join(path, TRAINER_FILE)) as src:
        return torch.load(io.BytesIO(src.read()), weights_only=True)


def incomplete_reason(uri: str) -> str | None:
    """None when the checkpoint at `uri` (any storage) is complete, else why it is not.

    The one definition of a complete checkpoint: its trainer state is readable, every rank's
    RNG file is there, DCP's metadata is readable, every shard file it names holds all the
    bytes the metadata points into (a write killed half-way leaves a short file), and, where
    the trainer state says a manifest was written, the manifest is there and every file it
    lists has the size it lists."""
    fs, path = storage.resolve(uri)
    try:
        trainer_state = _trainer_state(fs, path)
        world_size, step = int(trainer_state["world_size"]), int(trainer_state["step"])
    except FileNotFoundError:
        return f"no {TRAINER_FILE}"
    except Exception as err:  # truncated or not ours
        return f"{TRAINER_FILE} is unreadable ({type(err).__name__})"
    if checkpoint_step(path) not in (None, step):
        return f"{TRAINER_FILE} is for step {step}"
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=True))
    sizes = {posixpath.relpath(i.path, path): i.size for i in infos if i.type == pafs.FileType.File}
    missing = [f"rng/rank_{r:05d}.pt" for r in range(world_size) if f"rng/rank_{r:05d}.pt" not in sizes]
    if missing:
        return f"missing {missing[0]}" + (f" and {len(missing) - 1} more" if len(missing) > 1 else "")
    reason = _shards_reason(fs, path, sizes)
    if reason is not None or not trainer_state.get("manifest"):
        return reason  # without a manifest: a checkpoint saved before there were any
    manifest, reason = _read_manifest(fs, path)
    if reason is not None:
        return reason
    for name, entry in manifest["files"].items():
        if name not in sizes:
            return f"missing {name}"
        if sizes[name] is not None and sizes[name] != entry["size"]:
            return f"{name} has {sizes[name]} bytes, not the {entry['size']} it was saved with"
    return None


def _shards_reason(fs: pafs.FileSystem, path: str, sizes: dict[str, int | None]) -> str | None:
    """DCP's metadata is readable and every shard holds the bytes it points into."""
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
        if relative not in sizes:
            return f"missing shard {relative}"
        found = sizes[relative]
        if found is not None and found < size:
            return f"shard {relative} is truncated ({found} of {size} bytes)"
    return None


# -- intact -----------------------------------------------------------------------------------


def has_checksums(uri: str) -> bool:
    """Whether the checkpoint at `uri` has a manifest to check its bytes against."""
    fs, path = storage.resolve(uri)
    return fs.get_file_info(posixpath.join(path, MANIFEST_FILE)).type == pafs.FileType.File


def damage_reason(uri: str) -> str | None:
    """None when every file of a complete checkpoint holds the bytes it was saved with (or
    when it has no manifest, and so nothing to check against); else which file does not.
    Reads the whole checkpoint."""
    fs, path = storage.resolve(uri)
    if not has_checksums(uri):
        return None
    manifest, reason = _read_manifest(fs, path)
    if reason is not None:
        return reason
    for name, entry in manifest["files"].items():
        if "checksum" not in entry:
            continue
        try:
            if isinstance(fs, pafs.LocalFileSystem):
                actual = _local_checksum(posixpath.join(path, name))[1]
            else:
                with fs.open_input_stream(posixpath.join(path, name)) as src:
                    actual = _checksum(src)
        except FileNotFoundError:
            return f"missing {name}"
        if actual != entry["checksum"]:
            return f"{name} does not match the checksum recorded at save time"
    return None


def newest_valid(run_uri: str) -> tuple[str | None, list[dict]]:
    """(the newest checkpoint of a run that is complete and intact, [{"checkpoint", "reason"}]
    of the newer ones skipped, and why); (None, ...) when there is none."""
    skipped = []
    for name in sorted(storage.list_dirs(run_uri), reverse=True):
        if checkpoint_step(name) is None:
            continue
        uri = storage.join(run_uri, name)
        reason = incomplete_reason(uri) or damage_reason(uri)
        if reason is None:
            return uri, skipped
        skipped.append({"checkpoint": name, "reason": reason})
    return None, skipped


# -- pruning ----------------------------------------------------------------------------------


def prune(run_uri: str, keep: int, step: int) -> tuple[list[str], list[dict]]:
    """After the save of `step`: delete complete checkpoints older than the `keep` newest at
    or below `step`. Returns (names deleted, [{"checkpoint", "reason"}] of folders left in
    place because they are not complete checkpoints, or lie ahead of `step`)."""
    deleted, left, kept = [], [], 0
    for name in sorted(storage.list_dirs(run_uri), reverse=True):
        found = checkpoint_step(name)
        if found is None:
            continue
        uri = storage.join(run_uri, name)
        try:
            reason = incomplete_reason(uri)
        except Exception as err:  # a listing that failed: cannot judge it either
            reason = f"cannot be read ({type(err).__name__})"
        if reason is None and found > step:
            reason = f"ahead of step {step}, the step just saved"
        if reason is not None:
            left.append({"checkpoint": name, "reason": reason})
            continue
        kept += 1
        if kept > keep:
            storage.delete_dir(uri)
            deleted.append(name)
    return deleted, left
