"""The map-style datasets the sources share, and the seeded train/eval split."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, Subset

from . import eval_count


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


# --- synthetic data (synthetic.py) ---------------------------------------------------

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


# --- parquet token rows (parquet.py) --------------------------------------------------


class ShiftedRows(Dataset):
    """Token rows of seq_len + 1: x is a row without its last token, y without its first."""

    def __init__(self, tokens: torch.Tensor):
        self.tokens = tokens

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int):
        row = self.tokens[i]
        return row[:-1], row[1:]
