"""Synthetic data that a model can actually learn, generated lazily per item from the seed.

- image: each class has a smooth random prototype (a 4x4 grid of Gaussians
  upsampled to the image size); an item is 0.6 * prototype + 0.8 * white noise,
  so pixels have ~zero mean and unit variance yet classes are separable.
- tokens: each item is an arithmetic progression mod vocab_size with a random
  start and step (1..7); after two tokens the next one is fully predictable.
"""

from __future__ import annotations

from typing import Any

from . import DataInfo, Datasets, eval_count


def describe(spec: Any) -> DataInfo:
    n_eval = eval_count(spec.num_samples, spec.eval_split)
    return DataInfo.declared(spec, spec.num_samples - n_eval, n_eval)


def load(spec: Any, seed: int = 0, rank: int = 0, world_size: int = 1) -> Datasets:
    from .datasets import SyntheticImages, SyntheticTokens, split

    if spec.kind == "tokens":
        full = SyntheticTokens(spec.num_samples, spec.vocab_size, spec.seq_len, seed)
    else:
        full = SyntheticImages(spec.num_samples, spec.num_classes, spec.in_channels, spec.image_size, seed)
    # the split seed differs from the content seed so the two are not correlated
    train, eval_ = split(full, spec.eval_split, seed + 1)
    return Datasets(train, eval_, describe(spec))


def check(spec: Any) -> list[tuple[str, str]]:
    if spec.kind == "tokens" and spec.vocab_size < 2:
        return [("vocab_size", f"must be >= 2, got {spec.vocab_size}")]
    if spec.kind == "image" and spec.num_classes < 2:
        return [("num_classes", f"must be >= 2, got {spec.num_classes}")]
    return []
