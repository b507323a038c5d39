"""Synthetic data that a model can actually learn, generated lazily per item from the seed.

- image: each class has a smooth random prototype (a 4x4 grid of Gaussians
  upsampled to the image size); an item is 0.6 * prototype + 0.8 * white noise,
  so pixels have ~zero mean and unit variance yet classes are separable.
- tokens: each item is an arithmetic progression mod vocab_size with a random
  start and step (1..7); after two tokens the next one is fully predictable.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from . import DataInfo, Datasets, eval_count, split

_SIGNAL, _NOISE = 0.6, 0.8  # 0.6^2 + 0.8^2 = 1: unit variance per pixel
_MAX_STEP = 7


def _item_generator(seed: int, i: int) -> torch.Generator:
    # modulo: torch seeds are 64-bit, and the spec allows seeds up to 2**63 - 1
    return torch.Generator().manual_seed((seed * 1_000_003 + i) % 2**63)


class SyntheticImages(Dataset):
    def __init__(self, n: int, num_classes: int, channels: int, size: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        grid = torch.randn(num_classes, channels, 4, 4, generator=g)
        protos = F.interpolate(grid, size=(size, size), mode="bilinear", align_corners=False)
        # unit std per prototype so the signal strength does not depend on the image size
        self.prototypes = protos / protos.flatten(1).std(dim=1).clamp_min(1e-6)[:, None, None, None]
        self.labels = torch.randint(num_classes, (n,), generator=g)
        self.seed = seed

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        label = self.labels[i]
        noise = torch.randn(self.prototypes.shape[1:], generator=_item_generator(self.seed, i))
        return _SIGNAL * self.prototypes[label] + _NOISE * noise, label


class SyntheticTokens(Dataset):
    def __init__(self, n: int, vocab_size: int, seq_len: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.starts = torch.randint(vocab_size, (n,), generator=g)
        self.steps = torch.randint(1, min(_MAX_STEP, vocab_size - 1) + 1, (n,), generator=g)
        self.positions = torch.arange(seq_len + 1)
        self.vocab_size = vocab_size

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int):
        seq = (self.starts[i] + self.steps[i] * self.positions) % self.vocab_size
        return seq[:-1], seq[1:]


def describe(spec: Any) -> DataInfo:
    n_eval = eval_count(spec.num_samples, spec.eval_split)
    sizes = dict(train_size=spec.num_samples - n_eval, eval_size=n_eval)
    if spec.kind == "tokens":
        return DataInfo(
            kind="tokens",
            num_classes=None,
            in_channels=None,
            image_size=None,
            vocab_size=spec.vocab_size,
            seq_len=spec.seq_len,
            **sizes,
        )
    return DataInfo(
        kind="image",
        num_classes=spec.num_classes,
        in_channels=spec.in_channels,
        image_size=spec.image_size,
        vocab_size=None,
        seq_len=None,
        **sizes,
    )


def load(spec: Any, seed: int = 0, rank: int = 0, world_size: int = 1) -> Datasets:
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
