"""scikit-learn's bundled 8x8 handwritten digits (1797 images, 10 classes), seeded eval split."""

from __future__ import annotations

from typing import Any

from . import DataInfo, Datasets, eval_count

NUM_IMAGES = 1797
# pixel values are 0..16; statistics of the whole set after scaling to [0, 1]
_MEAN, _STD = 0.3053, 0.3760


def describe(spec: Any) -> DataInfo:
    n_eval = eval_count(NUM_IMAGES, spec.eval_split)
    return DataInfo.images(10, 1, 8, NUM_IMAGES - n_eval, n_eval)


def load(spec: Any, seed: int = 0, rank: int = 0, world_size: int = 1) -> Datasets:
    from .datasets import ImageArray, split

    images, labels = _read()
    full = ImageArray(
        images.astype("float32").reshape(-1, 1, 8, 8), labels, scale=1 / 16, mean=_MEAN, std=_STD
    )
    train, eval_ = split(full, spec.eval_split, seed)
    return Datasets(train, eval_, describe(spec))


def check(spec: Any) -> list[tuple[str, str]]:
    return []


def _read():
    """(images as float64 8x8 arrays, labels as int64): what `sklearn.datasets.load_digits`
    returns, read from the file it reads (sklearn/datasets/data/digits.csv.gz: each line the
    64 pixel values, then the label) without importing scikit-learn, which costs ~1 s of CPU
    on each worker before its first step."""
    import gzip
    import importlib.util
    from pathlib import Path

    import numpy as np

    found = importlib.util.find_spec("sklearn")
    path = Path(found.submodule_search_locations[0], "datasets", "data", "digits.csv.gz") if found else None
    if path is None or not path.is_file():  # not where this scikit-learn keeps it: ask it
        from sklearn.datasets import load_digits

        bunch = load_digits()
        return bunch.images, bunch.target
    with gzip.open(path) as rows:
        table = np.loadtxt(rows, delimiter=",")
    return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(np.int64)
