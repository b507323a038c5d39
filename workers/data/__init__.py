"""Data sources: each turns a `DataSpec` into map-style train/eval datasets.

Image items are `(float32 (C, H, W) normalized, int64 label)`; token items are
`(x int64 (seq_len,), y int64 (seq_len,))` with y = x shifted left by one.
Only the parquet source shards by rank itself (`Datasets.sharded`); the others
return the full dataset and leave splitting across ranks to the sampler.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.utils.data import Dataset, Subset

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


def split(dataset: Dataset, eval_split: float, seed: int) -> tuple[Dataset, Dataset | None]:
    """Seeded random train/eval split of a map-style dataset."""
    n = len(dataset)
    n_eval = eval_count(n, eval_split)
    if n_eval == 0:
        return dataset, None
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    return Subset(dataset, order[n_eval:]), Subset(dataset, order[:n_eval])


class ImageArray(Dataset):
    """Images kept as stored (e.g. uint8) and normalized per item: small memory, cheap to fork."""

    def __init__(self, images, labels, scale: float, mean: float, std: float):
        self.images = torch.as_tensor(images)  # (N, C, H, W)
        self.labels = torch.as_tensor(labels, dtype=torch.int64)
        self.scale, self.mean, self.std = scale, mean, std

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        x = self.images[i].to(torch.float32) * self.scale
        return (x - self.mean) / self.std, self.labels[i]


class TokenWindows(Dataset):
    """Non-overlapping windows of seq_len + 1 tokens over one token stream."""

    def __init__(self, tokens: torch.Tensor, seq_len: int):
        self.tokens, self.seq_len = tokens, seq_len

    def __len__(self) -> int:
        return len(self.tokens) // (self.seq_len + 1)

    def __getitem__(self, i: int):
        if not 0 <= i < len(self):
            raise IndexError(i)
        start = i * (self.seq_len + 1)
        window = self.tokens[start : start + self.seq_len + 1].to(torch.int64)
        return window[:-1], window[1:]
