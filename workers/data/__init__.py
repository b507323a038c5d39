"""Data sources: each turns a `DataSpec` into map-style train/eval datasets.

Image items are `(float32 (C, H, W) normalized, int64 label)`; token items are
`(x int64 (seq_len,), y int64 (seq_len,))` with y = x shifted left by one.
Only the parquet source shards by rank itself (`Datasets.sharded`); the others
return the full dataset and leave splitting across ranks to the sampler.

This package imports no torch: `describe` and `check` serve the CLI's spec checks; the
datasets themselves (torch) are in `datasets.py` and in each source's `load`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from torch.utils.data import Dataset

_SOURCES = {
    "synthetic": "synthetic",
    "digits": "digits",
    "fashion-mnist": "fashion_mnist",
    "text": "text",
    "parquet": "parquet",
}


@dataclass
class DataInfo:
    kind: Literal["image", "tokens"]
    num_classes: int | None
    in_channels: int | None
    image_size: int | None
    vocab_size: int | None
    seq_len: int | None
    train_size: int
    eval_size: int

    @classmethod
    def images(
        cls, num_classes: int, in_channels: int, image_size: int, train_size: int, eval_size: int
    ) -> DataInfo:
        """Square images of `in_channels` channels, each labelled one of `num_classes`."""
        return cls("image", num_classes, in_channels, image_size, None, None, train_size, eval_size)

    @classmethod
    def tokens(cls, vocab_size: int, seq_len: int, train_size: int, eval_size: int) -> DataInfo:
        """Windows of `seq_len` tokens from a vocabulary of `vocab_size`."""
        return cls("tokens", None, None, None, vocab_size, seq_len, train_size, eval_size)

    @classmethod
    def declared(cls, spec: Any, train_size: int, eval_size: int) -> DataInfo:
        """The shape a data spec declares itself (`kind` and its fields: synthetic, parquet)."""
        if spec.kind == "tokens":
            return cls.tokens(spec.vocab_size, spec.seq_len, train_size, eval_size)
        return cls.images(spec.num_classes, spec.in_channels, spec.image_size, train_size, eval_size)


@dataclass
class Datasets:
    train: Dataset
    eval: Dataset | None
    info: DataInfo
    sharded: bool = False  # True: each rank already holds only its own shard


def _source(data_spec: Any):
    # imported lazily: a source's dependencies (sklearn, pyarrow) load only when used
    return importlib.import_module(f"{__name__}.{_SOURCES[data_spec.source]}")


def load(data_spec: Any, seed: int = 0, rank: int = 0, world_size: int = 1) -> Datasets:
    return _source(data_spec).load(data_spec, seed=seed, rank=rank, world_size=world_size)


def describe(data_spec: Any) -> DataInfo:
    """Shapes and sizes without loading the data (where the source allows)."""
    return _source(data_spec).describe(data_spec)


def check(data_spec: Any) -> list[tuple[str, str]]:
    """Problems as (path relative to the `data` section, message); [] means valid. Never raises."""
    if data_spec.source not in _SOURCES:
        return [("source", f"unknown source {data_spec.source!r}; choose from: {', '.join(_SOURCES)}")]
    try:
        return _source(data_spec).check(data_spec)
    except Exception as err:  # a check must report, not crash the spec validation
        return [("source", f"cannot check {data_spec.source!r} data: {err}")]


# --- helpers shared by the sources ---------------------------------------------------


def eval_count(n: int, eval_split: float) -> int:
    """Held-out items: a fraction of n, at least one when a split is asked for."""
    if eval_split <= 0 or n < 2:
        return 0
    return min(n - 1, max(1, round(n * eval_split)))
