"""Fashion-MNIST (Xiao et al. 2017): 28x28 grayscale, 10 classes, 60k train + the official 10k test.

Files are looked up in data.path, then Debian's `dataset-fashion-mnist`
install, then the download cache; `download: true` fetches them from the
official mirror into the cache, checking the published MD5 sums.
"""

from __future__ import annotations

import hashlib
import os
import urllib.request
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import DataInfo, Datasets

if TYPE_CHECKING:  # numpy loads with the data, not with `describe` (validate, submit)
    import numpy as np

SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")
CACHE_DIR = Path(os.path.expanduser("~/.cache/orchestrator/fashion-mnist"))
URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
FILES = {  # name -> MD5 of the official .gz
    "train-images-idx3-ubyte": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "train-labels-idx1-ubyte": "25c81989df183df01b3e8a0aad5dffbe",
    "t10k-images-idx3-ubyte": "bef4ecab320f06d8554ea6380940ec79",
    "t10k-labels-idx1-ubyte": "bb300cfdad3c16e7a12a480ee83cd310",
}
MEAN, STD = 0.2860, 0.3530
TRAIN_SIZE, TEST_SIZE = 60_000, 10_000
_MAGIC = {3: 0x00000803, 1: 0x00000801}  # unsigned bytes, 3-d images / 1-d labels


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """Parse an IDX file of unsigned bytes (gzipped if the name ends in .gz)."""
    import numpy as np

    data = path.read_bytes()
    if path.suffix == ".gz":
        try:
            data = zlib.decompress(data, wbits=31)  # 31: gzip container; faster than gzip.open
        except zlib.error as err:
            raise ValueError(f"{path}: not a valid gzip file ({err})") from None
    magic = int.from_bytes(data[:4], "big") if len(data) >= 4 else None
    if magic != _MAGIC[ndim]:
        found = f"0x{magic:08x}" if magic is not None else "a truncated header"
        raise ValueError(
            f"{path}: not an IDX file of {ndim}-d unsigned bytes "
            f"(magic number 0x{_MAGIC[ndim]:08x} expected, found {found})"
        )
    header = 4 + 4 * ndim
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    if len(data) != header + int(np.prod(dims)):
        raise ValueError(
            f"{path}: truncated or corrupt IDX file: header says {dims}, "
            f"but it holds {len(data) - header} bytes of data"
        )
    # copy: arrays over immutable bytes are read-only, which torch warns about
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims).copy()


def _file(directory: Path, name: str) -> Path | None:
    for candidate in (directory / f"{name}.gz", directory / name):
        if candidate.is_file():
            return candidate
    return None


def _search_dirs(spec: Any) -> list[Path]:
    return ([Path(spec.path)] if spec.path else []) + [SYSTEM_DIR, CACHE_DIR]


def find(spec: Any) -> Path | None:
    """The first directory that holds all four files."""
    for directory in _search_dirs(spec):
        if all(_file(directory, name) for name in FILES):
            return directory
    return None


def _not_found(spec: Any) -> str:
    dirs = ", ".join(str(d) for d in _search_dirs(spec))
    return (
        f"fashion-mnist: dataset not found in {dirs}; install Debian's package "
        "'dataset-fashion-mnist' (apt-get install dataset-fashion-mnist), put the IDX files "
        "in data.path, or set data.download: true"
    )


def download(directory: Path = CACHE_DIR) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, md5 in FILES.items():
        target = directory / f"{name}.gz"
        if target.is_file() and hashlib.md5(target.read_bytes()).hexdigest() == md5:
            continue
        with urllib.request.urlopen(URL + target.name, timeout=60) as response:
            payload = response.read()
        if hashlib.md5(payload).hexdigest() != md5:
            raise RuntimeError(f"fashion-mnist: {URL + target.name} failed its MD5 check")
        tmp = target.with_suffix(".part")
        tmp.write_bytes(payload)
        tmp.replace(target)  # never leave a half-written file under the final name
    return directory


def _locate(spec: Any) -> Path:
    directory = find(spec)
    if directory is None:
        if not spec.download:
            raise FileNotFoundError(_not_found(spec))
        directory = download()
    return directory


def describe(spec: Any) -> DataInfo:
    return DataInfo.images(10, 1, 28, TRAIN_SIZE, TEST_SIZE)


def load(spec: Any, seed: int = 0, rank: int = 0, world_size: int = 1) -> Datasets:
    from .datasets import ImageArray

    directory = _locate(spec)

    def part(prefix: str) -> ImageArray:
        images = read_idx(_file(directory, f"{prefix}-images-idx3-ubyte"), 3)
        labels = read_idx(_file(directory, f"{prefix}-labels-idx1-ubyte"), 1)
        if len(images) != len(labels):
            raise ValueError(f"fashion-mnist: {len(images)} {prefix} images but {len(labels)} labels")
        # uint8 stays in memory; each item is scaled and normalized when fetched
        return ImageArray(images[:, None], labels.astype("int64"), 1 / 255, MEAN, STD)

    # the official test split is the eval set, so eval_split and the seed do not apply
    return Datasets(part("train"), part("t10k"), describe(spec))


def check(spec: Any) -> list[tuple[str, str]]:
    if spec.path and not Path(spec.path).is_dir():
        return [("path", f"no such directory {spec.path!r}")]
    if find(spec) is None and not spec.download:
        return [("path" if spec.path else "download", _not_found(spec))]
    return []
