"""Image augmentation of the training set: random shifts (pad, then crop) and horizontal flips.

Each sample's draw is a pure function of (seed, epoch, sample index), so it does not depend
on the number of workers, the loader processes, or where a resumed run picks up: a run
resumed at any step, or on another world size, sees exactly the images it would have seen.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

MASK64 = (1 << 64) - 1


def _mix(*values: int) -> int:
    """splitmix64 over the values: a well-spread 64-bit integer per (seed, epoch, index)."""
    z = 0
    for v in values:
        z = (z + (v & MASK64) + 0x9E3779B97F4A7C15) & MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        z ^= z >> 31
    return z


def augment_image(x: torch.Tensor, spec: Any, draw: int) -> torch.Tensor:
    """`x` (C, H, W) shifted by up to `spec.shift` pixels each way and maybe flipped, as `draw`
    (a random 64-bit integer) says. Borders repeat the edge pixels."""
    if spec.shift:
        s, (_, h, w) = spec.shift, x.shape
        span = 2 * s + 1
        dy, dx = draw % span, (draw // span) % span
        x = F.pad(x[None], (s, s, s, s), mode="replicate")[0, :, dy : dy + h, dx : dx + w]
    if spec.horizontal_flip and (draw >> 32) & 1:
        x = x.flip(-1)
    return x


class Augmented(Dataset):
    """An image dataset's items, augmented for one epoch."""

    def __init__(self, dataset: Dataset, spec: Any, seed: int, epoch: int):
        self.dataset, self.spec, self.seed, self.epoch = dataset, spec, seed, epoch

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int):
        x, y = self.dataset[i]
        return augment_image(x, self.spec, _mix(self.seed, self.epoch, i)), y
