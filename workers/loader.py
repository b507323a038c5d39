"""Resumable, rank-aware batching.

Each optimizer step consumes one *global* batch: a contiguous slice of a seeded
per-epoch permutation. Rank r takes its share of that slice, and splits it into
`grad_accum` micro-batches. The union of samples per step is therefore the same for
any world size and accumulation, which is what makes 2x DDP + accumulation
reproduce a single process with the combined batch, and the position in the data
is a pure function of the step, which is what makes resume exact.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from workers.data.augment import Augmented


@dataclass(frozen=True)
class Layout:
    global_batch: int
    world_size: int
    rank: int
    grad_accum: int
    sharded: bool = False  # the dataset already holds only this rank's samples

    @property
    def rank_batch(self) -> int:
        return self.global_batch // self.world_size

    @property
    def micro_batch(self) -> int:
        return self.rank_batch // self.grad_accum

    def steps_per_epoch(self, dataset_len: int) -> int:
        per_step = self.rank_batch if self.sharded else self.global_batch
        return dataset_len // per_step


class StepSampler(Sampler[int]):
    """Yields this rank's sample indices for the steps [first_step, steps_per_epoch) of one epoch."""

    def __init__(self, dataset_len: int, layout: Layout, seed: int, epoch: int, first_step: int = 0):
        self.dataset_len, self.layout = dataset_len, layout
        self.seed, self.epoch, self.first_step = seed, epoch, first_step

    def _permutation(self) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(self.dataset_len, generator=generator)

    def __iter__(self) -> Iterator[int]:
        order, lay = self._permutation(), self.layout
        steps = lay.steps_per_epoch(self.dataset_len)
        for step in range(self.first_step, steps):
            if lay.sharded:
                start = step * lay.rank_batch
            else:
                start = step * lay.global_batch + lay.rank * lay.rank_batch
            yield from order[start : start + lay.rank_batch].tolist()

    def __len__(self) -> int:
        steps = self.layout.steps_per_epoch(self.dataset_len) - self.first_step
        return max(steps, 0) * self.layout.rank_batch


class TrainBatches:
    """Iterates micro-batches step after step, across epochs, from any starting step."""

    def __init__(
        self,
        dataset: Dataset,
        layout: Layout,
        seed: int,
        loader_workers: int,
        pin_memory: bool = False,
        augment: Any = None,  # an AugmentSpec: image augmentation, drawn per (seed, epoch, sample)
    ):
        self.dataset, self.layout, self.seed, self.augment = dataset, layout, seed, augment
        self.loader_workers, self.pin_memory = loader_workers, pin_memory
        self.steps_per_epoch = layout.steps_per_epoch(len(dataset))
        if self.steps_per_epoch < 1:
            raise ValueError(
                f"the training set has {len(dataset)} samples, fewer than one global batch of "
                f"{layout.global_batch}; lower data.batch_size"
            )

    def position(self, step: int) -> tuple[int, int]:
        """(epoch, step within epoch) of a global step."""
        return divmod(step, self.steps_per_epoch)

    def iterate(self, start_step: int) -> Iterator[list]:
        """Yields, for each step from start_step on, the list of its micro-batches."""
        epoch, offset = self.position(start_step)
        while True:
            sampler = StepSampler(len(self.dataset), self.layout, self.seed, epoch, offset)
            dataset = self.dataset
            if self.augment is not None:
                dataset = Augmented(dataset, self.augment, self.seed, epoch)
            loader = DataLoader(
                dataset,
                batch_size=self.layout.micro_batch,
                sampler=sampler,
                num_workers=self.loader_workers,
                pin_memory=self.pin_memory,
                drop_last=False,
                # seeds workers' RNGs (augmentation) from the epoch, so resume repeats them
                generator=torch.Generator().manual_seed(self.seed + epoch),
                persistent_workers=False,
            )
            micro = []
            for batch in loader:
                micro.append(batch)
                if len(micro) == self.layout.grad_accum:
                    yield micro
                    micro = []
            epoch, offset = epoch + 1, 0


def eval_batches(
    dataset: Dataset,
    rank: int,
    world_size: int,
    batch_size: int,
    loader_workers: int = 0,
    sharded: bool = False,
) -> DataLoader:
    """Each rank evaluates a strided share of the eval set; results are summed across ranks."""
    indices = range(len(dataset)) if sharded else range(rank, len(dataset), world_size)
    subset = torch.utils.data.Subset(dataset, list(indices))
    return DataLoader(subset, batch_size=batch_size, shuffle=False, num_workers=loader_workers)
