"""Parquet datasets from any pyarrow filesystem (local path, file://, s3://, gs://, hdfs://).

Each rank reads only its own shard: fragments (files) i with i % world_size ==
rank, in sorted path order, so `Datasets.sharded` is True. Write at least as
many files as there will be ranks, of similar size.

Layouts (column names from data.columns):
- image: `image` holds C*H*W float32 values per row (data.in_channels,
  data.image_size), as a (fixed-size) list of floats or as raw float32 bytes,
  already normalized; `label` holds int class ids < data.num_classes.
- tokens: `tokens` holds one int sequence per row, at least seq_len + 1 long;
  each row is one sample (its first seq_len + 1 tokens; the rest is ignored).

Each rank holds out `eval_split` of its own rows (seeded), so eval sets are
disjoint across ranks too.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs

from . import DataInfo, Datasets, eval_count

if TYPE_CHECKING:
    import torch


def _open(uri: str) -> ds.FileSystemDataset:
    if "://" not in uri:
        uri = os.path.abspath(uri)  # from_uri needs absolute local paths
    filesystem, root = pyarrow.fs.FileSystem.from_uri(uri)
    return ds.dataset(root, format="parquet", filesystem=filesystem)


def _fragments(dataset: ds.FileSystemDataset) -> list:
    return sorted(dataset.get_fragments(), key=lambda f: f.path)


def _column(spec: Any, key: str) -> str:
    return (spec.columns or {}).get(key, key)


def _needed_columns(spec: Any) -> list[str]:
    if spec.kind == "tokens":
        return [_column(spec, "tokens")]
    return [_column(spec, "image"), _column(spec, "label")]


def describe(spec: Any) -> DataInfo:
    """Sizes summed over ranks as one rank (world_size 1) would split them; reads only metadata."""
    rows = sum(f.count_rows() for f in _fragments(_open(spec.path)))
    n_eval = eval_count(rows, spec.eval_split)
    return DataInfo.declared(spec, rows - n_eval, n_eval)


def _images(column: pa.ChunkedArray, name: str, spec: Any) -> torch.Tensor:
    import torch

    shape = (spec.in_channels, spec.image_size, spec.image_size)
    array = column.combine_chunks()
    if (
        pa.types.is_binary(array.type)
        or pa.types.is_large_binary(array.type)
        or pa.types.is_fixed_size_binary(array.type)
    ):
        values = np.frombuffer(b"".join(array.to_pylist()), dtype=np.float32).copy()
    else:  # list<float> / fixed_size_list<float>; astype copies, so torch gets a writable array
        values = array.flatten().to_numpy(zero_copy_only=False).astype(np.float32)
    if values.size != len(array) * int(np.prod(shape)):
        raise ValueError(
            f"parquet: column {name!r} does not hold {'x'.join(map(str, shape))}"
            " float32 values per row (data.in_channels x data.image_size^2)"
        )
    return torch.from_numpy(values).view(len(array), *shape)


def _tokens(column: pa.ChunkedArray, spec: Any) -> torch.Tensor:
    import torch

    rows = column.to_pylist()
    need = spec.seq_len + 1
    short = [len(r) for r in rows if len(r) < need]
    if short:
        raise ValueError(
            f"parquet: {len(short)} token rows are shorter than seq_len + 1 = {need} (shortest: {min(short)})"
        )
    tokens = torch.tensor([r[:need] for r in rows], dtype=torch.int64).view(len(rows), need)
    if len(rows) and (tokens.min() < 0 or tokens.max() >= spec.vocab_size):
        raise ValueError(
            f"parquet: token ids must be in [0, {spec.vocab_size}), found "
            f"{tokens.min().item()}..{tokens.max().item()}"
        )
    return tokens


def _labels(column: pa.ChunkedArray, spec: Any) -> torch.Tensor:
    import torch

    labels = torch.from_numpy(column.to_numpy().astype(np.int64))  # astype: a writable copy
    if len(labels) and (labels.min() < 0 or labels.max() >= spec.num_classes):
        raise ValueError(
            f"parquet: labels must be in [0, {spec.num_classes}), found "
            f"{labels.min().item()}..{labels.max().item()}"
        )
    return labels


def load(spec: Any, seed: int = 0, rank: int = 0, world_size: int = 1) -> Datasets:
    import torch
    from torch.utils.data import TensorDataset

    from .datasets import ShiftedRows

    dataset = _open(spec.path)
    fragments = _fragments(dataset)
    if len(fragments) < world_size:
        raise ValueError(
            f"parquet: {spec.path!r} has {len(fragments)} file(s) but there are"
            f" {world_size} ranks; each rank needs at least one file"
        )
    columns = _needed_columns(spec)
    table = pa.concat_tables(
        [f.to_table(columns=columns, schema=dataset.schema) for f in fragments[rank::world_size]]
    )
    if spec.kind == "tokens":
        tensors = [_tokens(table.column(columns[0]), spec)]
        make = ShiftedRows
    else:
        tensors = [
            _images(table.column(columns[0]), columns[0], spec),
            _labels(table.column(columns[1]), spec),
        ]
        make = TensorDataset
    # per-rank seeded row split; the rank is mixed in so shards do not share a permutation
    rows = len(tensors[0])
    order = torch.randperm(rows, generator=torch.Generator().manual_seed(seed * 7919 + rank))
    n_eval = eval_count(rows, spec.eval_split)
    train = make(*[t[order[n_eval:]] for t in tensors])
    eval_ = make(*[t[order[:n_eval]] for t in tensors]) if n_eval else None
    info = describe(spec)
    info.train_size, info.eval_size = len(train), n_eval  # this rank's shard
    return Datasets(train, eval_, info, sharded=True)


def check(spec: Any) -> list[tuple[str, str]]:
    if not spec.path:
        return [("path", "required for source 'parquet' (a directory, file or URI)")]
    if "://" in spec.path and not spec.path.startswith("file://"):
        # remote: only parse the URI here; listing a bucket during validation could hang
        try:
            pyarrow.fs.FileSystem.from_uri(spec.path)
        except Exception as err:
            return [("path", f"cannot use {spec.path!r}: {err}")]
        return []
    if not os.path.exists(spec.path.removeprefix("file://")):
        return [("path", f"no such file or directory {spec.path!r}")]
    try:
        dataset = _open(spec.path)
    except Exception as err:  # unreadable or non-parquet files
        return [("path", f"cannot open parquet dataset {spec.path!r}: {err}")]
    if not dataset.files:
        return [("path", f"no parquet files under {spec.path!r}")]
    missing = [c for c in _needed_columns(spec) if c not in dataset.schema.names]
    if missing:
        return [
            ("columns", f"column {c!r} not in {spec.path!r}; it has: {', '.join(dataset.schema.names)}")
            for c in missing
        ]
    return []
