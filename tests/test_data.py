"""Data sources: shapes, dtypes, info, determinism, eval splits, sharding, error messages."""

import gzip
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from core.spec import DataSpec
from workers import data
from workers.data import fashion_mnist


def spec(**fields):
    return DataSpec(**fields)


def items(dataset, n=None):
    n = len(dataset) if n is None else min(n, len(dataset))
    return [dataset[i] for i in range(n)]


def stack(dataset, n=None):
    xs, ys = zip(*items(dataset, n))
    return torch.stack(xs), torch.stack(ys)


def assert_image_item(item, channels, size, classes):
    x, y = item
    assert x.dtype == torch.float32 and tuple(x.shape) == (channels, size, size)
    assert y.dtype == torch.int64 and y.dim() == 0 and 0 <= y < classes


def assert_token_item(item, seq_len, vocab):
    x, y = item
    assert x.dtype == y.dtype == torch.int64
    assert x.shape == y.shape == (seq_len,)
    assert torch.equal(x[1:], y[:-1])  # y is x shifted by one
    assert 0 <= x.min() and max(x.max(), y.max()) < vocab


# --- synthetic --------------------------------------------------------------------------


def test_synthetic_images_are_normalized_learnable_and_seeded():
    s = spec(source="synthetic", num_samples=600, image_size=8, in_channels=2, num_classes=5)
    d = data.load(s, seed=3)
    assert (len(d.train), len(d.eval)) == (540, 60) and not d.sharded
    assert d.info == data.describe(s)
    assert (d.info.kind, d.info.image_size, d.info.in_channels, d.info.num_classes) == ("image", 8, 2, 5)
    assert_image_item(d.train[0], 2, 8, 5)
    x, y = stack(d.train)
    assert abs(x.mean()) < 0.1 and abs(x.std() - 1) < 0.1
    # learnable: nearest class mean (fit on train) classifies held-out items well
    means = torch.stack([x[y == c].mean(0) for c in range(5)]).flatten(1)
    ex, ey = stack(d.eval)
    pred = torch.cdist(ex.flatten(1), means).argmin(1)
    assert (pred == ey).float().mean() > 0.9
    # same seed, same data; another seed, other data
    again = data.load(s, seed=3)
    assert torch.equal(stack(again.train, 20)[0], stack(d.train, 20)[0])
    assert not torch.equal(stack(data.load(s, seed=4).train, 20)[0], stack(d.train, 20)[0])


def test_synthetic_tokens_follow_a_predictable_pattern():
    s = spec(source="synthetic", kind="tokens", num_samples=100, seq_len=12, vocab_size=50)
    d = data.load(s, seed=0)
    assert (len(d.train), len(d.eval)) == (90, 10)
    assert (d.info.kind, d.info.vocab_size, d.info.seq_len) == ("tokens", 50, 12)
    for x, y in items(d.train, 20):
        assert_token_item((x, y), 12, 50)
        assert torch.equal(y[1:], (2 * x[1:] - x[:-1]) % 50)  # next = last + (last - previous)
    other = data.load(s, seed=1)
    assert not all(torch.equal(a[0], b[0]) for a, b in zip(items(d.train, 10), items(other.train, 10)))


def test_no_eval_split():
    d = data.load(spec(source="synthetic", num_samples=10, eval_split=0.0))
    assert d.eval is None and len(d.train) == 10 and d.info.eval_size == 0


# --- digits -----------------------------------------------------------------------------


def test_digits():
    s = spec(source="digits", eval_split=0.1)
    d = data.load(s, seed=0)
    assert (len(d.train), len(d.eval)) == (1617, 180)
    assert d.info == data.describe(s)
    assert_image_item(d.train[0], 1, 8, 10)
    x, y = stack(d.train)
    assert abs(x.mean()) < 0.05 and abs(x.std() - 1) < 0.05
    assert set(y.tolist()) == set(range(10))
    same, other = data.load(s, seed=0), data.load(s, seed=1)
    assert torch.equal(stack(same.eval)[1], stack(d.eval)[1])
    assert not torch.equal(stack(other.eval)[1], stack(d.eval)[1])


# --- fashion-mnist ----------------------------------------------------------------------


def write_idx(path: Path, array: np.ndarray, magic: int | None = None):
    magic = magic if magic is not None else 0x800 + array.ndim
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def write_fashion(directory: Path, n_train=6, n_test=4):
    rng = np.random.default_rng(0)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        write_idx(directory / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
        write_idx(directory / f"{prefix}-labels-idx1-ubyte.gz", rng.integers(0, 10, n))


@pytest.fixture
def no_system_fashion(monkeypatch, tmp_path):
    monkeypatch.setattr(fashion_mnist, "SYSTEM_DIR", tmp_path / "system")
    monkeypatch.setattr(fashion_mnist, "CACHE_DIR", tmp_path / "cache")


@pytest.mark.skipif(not fashion_mnist.SYSTEM_DIR.is_dir(), reason="dataset-fashion-mnist not installed")
def test_fashion_mnist_system_install_loads():  # in how long: bench/cpu_bounds.py
    d = data.load(spec(source="fashion-mnist"))
    assert (len(d.train), len(d.eval)) == (60_000, 10_000)  # the official test split is eval
    assert d.info == data.describe(spec(source="fashion-mnist"))
    assert_image_item(d.train[0], 1, 28, 10)
    assert_image_item(d.eval[-1], 1, 28, 10)
    x, y = stack(d.train, 3000)
    assert abs(x.mean()) < 0.05 and abs(x.std() - 1) < 0.05
    assert d.train[0][1] == 9  # the first training image is an ankle boot
    assert data.check(spec(source="fashion-mnist")) == []


def test_fashion_mnist_reads_path(no_system_fashion, tmp_path):
    write_fashion(tmp_path)
    d = data.load(spec(source="fashion-mnist", path=str(tmp_path)))
    assert (len(d.train), len(d.eval)) == (6, 4)
    assert_image_item(d.train[5], 1, 28, 10)


def test_fashion_mnist_missing_gives_install_hint(no_system_fashion, tmp_path):
    s = spec(source="fashion-mnist", path=str(tmp_path))  # exists, but holds no IDX files
    with pytest.raises(FileNotFoundError) as err:
        data.load(s)
    message = str(err.value)
    assert message.startswith(f"fashion-mnist: dataset not found in {tmp_path}, ")
    assert str(fashion_mnist.SYSTEM_DIR) in message
    assert "apt-get install dataset-fashion-mnist" in message and "data.download: true" in message
    [(path, msg)] = data.check(s)
    assert path == "path" and msg == message
    assert data.check(spec(source="fashion-mnist", path="/no/such/dir")) == [
        ("path", "no such directory '/no/such/dir'")
    ]


def test_idx_magic_and_size_are_validated(no_system_fashion, tmp_path):
    write_fashion(tmp_path)
    bad = tmp_path / "train-labels-idx1-ubyte.gz"
    write_idx(bad, np.zeros((6, 28, 28)))  # images where labels belong
    with pytest.raises(ValueError, match=r"magic number 0x00000801 expected, found 0x00000803"):
        data.load(spec(source="fashion-mnist", path=str(tmp_path)))
    bad.write_bytes(gzip.compress(b"\x00\x00\x08\x01" + (10).to_bytes(4, "big") + bytes(3)))
    with pytest.raises(ValueError, match="truncated or corrupt"):
        data.load(spec(source="fashion-mnist", path=str(tmp_path)))
    bad.write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match="not a valid gzip file"):
        data.load(spec(source="fashion-mnist", path=str(tmp_path)))


# --- text ---------------------------------------------------------------------------------


def test_text_corpus_from_directory(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_bytes(b"a" * 500)
    (tmp_path / "sub" / "b.md").write_bytes(b"b" * 300)
    (tmp_path / "sub" / "c.py").write_bytes(bytes(range(200)))
    (tmp_path / "skip.bin").write_bytes(b"z" * 1000)  # not a text suffix
    s = spec(source="text", path=str(tmp_path), seq_len=9, eval_split=0.2)
    d = data.load(s)
    # 1000 bytes: 800 train -> 80 windows of 10, last 200 eval -> 20 windows, contiguous
    assert (len(d.train), len(d.eval)) == (80, 20)
    assert d.info == data.describe(s) and d.info.vocab_size == 256
    assert_token_item(d.train[0], 9, 256)
    assert d.train[0][0].tolist() == [ord("a")] * 9
    assert torch.cat([torch.cat([x, y[-1:]]) for x, y in items(d.eval)]).tolist() == list(range(200))
    assert torch.equal(data.load(s, seed=5).train[7][0], d.train[7][0])  # deterministic


def test_text_default_corpus_is_stdlib():
    s = spec(source="text", seq_len=64)
    info = data.describe(s)
    d = data.load(s)
    assert (len(d.train), len(d.eval)) == (info.train_size, info.eval_size)
    assert 1_000_000 <= (info.train_size + info.eval_size) * 65 <= 5_000_000
    assert_token_item(d.train[100], 64, 256)
    assert b"def " in bytes(torch.cat([d.train[i][0] for i in range(50)]).tolist())


def test_text_check(tmp_path):
    assert data.check(spec(source="text", path="/no/such")) == [
        ("path", "no such file or directory '/no/such'")
    ]
    assert data.check(spec(source="text", path=str(tmp_path)))[0][0] == "path"  # empty dir
    (tmp_path / "x.txt").write_text("hi")
    assert data.check(spec(source="text", path=str(tmp_path)))[0][0] == "seq_len"
    assert data.check(spec(source="text")) == []


# --- parquet ------------------------------------------------------------------------------


def write_image_parquet(directory: Path, files=4, rows=25, binary=False):
    directory.mkdir(exist_ok=True)
    for f in range(files):
        ids = np.arange(f * rows, (f + 1) * rows)
        images = np.repeat(ids[:, None], 2 * 4 * 4, axis=1).astype(np.float32)  # value = row id
        column = (
            pa.array([row.tobytes() for row in images], pa.binary())
            if binary
            else pa.array(list(images), pa.list_(pa.float32()))
        )
        pq.write_table(pa.table({"pixels": column, "label": ids % 3}), directory / f"part-{f}.parquet")
    return spec(
        source="parquet",
        path=str(directory),
        kind="image",
        image_size=4,
        in_channels=2,
        num_classes=3,
        columns={"image": "pixels", "label": "label"},
        eval_split=0.2,
    )


@pytest.mark.parametrize("binary", [False, True])
def test_parquet_images_two_ranks_disjoint_and_complete(tmp_path, binary):
    s = write_image_parquet(tmp_path / "ds", binary=binary)
    assert data.check(s) == []
    seen = []
    for rank in range(2):
        d = data.load(s, seed=0, rank=rank, world_size=2)
        assert d.sharded and (len(d.train), len(d.eval)) == (40, 10)
        assert (d.info.train_size, d.info.eval_size) == (40, 10)
        assert_image_item(d.train[0], 2, 4, 3)
        ids = [int(x[0, 0, 0]) for x, _ in items(d.train) + items(d.eval)]
        assert all(int(y) == i % 3 for (_, y), i in zip(items(d.train) + items(d.eval), ids))
        # rank r reads files r and r + 2
        assert {i // 25 for i in ids} == {rank, rank + 2}
        seen += ids
    assert sorted(seen) == list(range(100))  # disjoint and covering every row
    described = data.describe(s)
    assert described.train_size + described.eval_size == 100


def test_parquet_split_is_seeded(tmp_path):
    s = write_image_parquet(tmp_path / "ds")
    eval_ids = lambda seed: [int(x[0, 0, 0]) for x, _ in items(data.load(s, seed=seed).eval)]
    assert eval_ids(0) == eval_ids(0) != eval_ids(1)


def test_parquet_needs_a_file_per_rank(tmp_path):
    s = write_image_parquet(tmp_path / "ds", files=2)
    with pytest.raises(ValueError, match="has 2 file\\(s\\) but there are 3 ranks"):
        data.load(s, rank=0, world_size=3)


def test_parquet_tokens(tmp_path):
    rows = [list(range(i, i + 12)) for i in range(10)]
    for f in range(2):
        pq.write_table(pa.table({"tokens": rows[f * 5 : (f + 1) * 5]}), tmp_path / f"{f}.parquet")
    s = spec(
        source="parquet", path=f"file://{tmp_path}", kind="tokens", seq_len=8, vocab_size=32, eval_split=0.2
    )
    d = data.load(s, seed=0)
    assert (len(d.train), len(d.eval)) == (8, 2) and d.info.kind == "tokens"
    x, y = d.train[0]
    assert_token_item((x, y), 8, 32)
    assert x.tolist() == list(range(x[0], x[0] + 8))  # the row's first seq_len + 1 tokens
    with pytest.raises(ValueError, match="shorter than seq_len \\+ 1 = 13"):
        data.load(spec(source="parquet", path=str(tmp_path), kind="tokens", seq_len=12))
    with pytest.raises(ValueError, match="token ids must be in \\[0, 16\\)"):
        data.load(spec(source="parquet", path=str(tmp_path), kind="tokens", seq_len=8, vocab_size=16))


def test_parquet_check(tmp_path):
    assert data.check(spec(source="parquet"))[0][0] == "path"
    assert data.check(spec(source="parquet", path=str(tmp_path / "nope"))) == [
        ("path", f"no such file or directory '{tmp_path / 'nope'}'")
    ]
    s = write_image_parquet(tmp_path / "ds")
    problems = data.check(spec(source="parquet", path=s.path, columns={"image": "img"}))
    assert problems == [("columns", f"column 'img' not in '{s.path}'; it has: pixels, label")]


# -- augmentation ---------------------------------------------------------------------------


def _batches_of(layout, dataset, augment, start_step, steps):
    from workers.loader import TrainBatches

    batches = TrainBatches(dataset, layout, seed=3, loader_workers=0, augment=augment).iterate(start_step)
    return [next(batches) for _ in range(steps)]


def test_augmentation_is_the_same_for_any_world_size_and_any_resume_step():
    from core.spec import AugmentSpec
    from workers.loader import Layout

    dataset = data.load(spec(source="digits"), seed=0).train
    augment = AugmentSpec(shift=2, horizontal_flip=True)
    one = _batches_of(Layout(32, 1, 0, 1), dataset, augment, 0, 60)  # crosses an epoch boundary
    two = [_batches_of(Layout(32, 2, r, 1), dataset, augment, 0, 60) for r in (0, 1)]
    for step in range(60):
        joined = torch.cat([two[0][step][0][0], two[1][step][0][0]])
        assert torch.equal(joined, one[step][0][0])
    resumed = _batches_of(Layout(32, 1, 0, 1), dataset, augment, 37, 23)
    for a, b in zip(resumed, one[37:]):
        assert torch.equal(a[0][0], b[0][0])
    plain = _batches_of(Layout(32, 1, 0, 1), dataset, None, 0, 60)
    changed = sum(not torch.equal(a[0][0], b[0][0]) for a, b in zip(one, plain))
    assert changed == 60  # every batch has augmented images...
    assert all(torch.equal(a[0][1], b[0][1]) for a, b in zip(one, plain))  # ...and the same labels


def test_a_shift_moves_the_image_within_bounds_and_a_flip_mirrors_it():
    from core.spec import AugmentSpec
    from workers.data.augment import augment_image

    x = torch.arange(36, dtype=torch.float32).reshape(1, 6, 6)
    flip = AugmentSpec(horizontal_flip=True)
    assert torch.equal(augment_image(x, flip, 1 << 32), x.flip(-1))
    assert torch.equal(augment_image(x, flip, 0), x)
    shift = AugmentSpec(shift=1)
    seen = set()
    for draw in range(9):  # every (dy, dx) in {0, 1, 2}^2
        y = augment_image(x, shift, draw)
        assert y.shape == x.shape
        dy, dx = draw % 3 - 1, (draw // 3) % 3 - 1
        # the centre 4x4 is the source moved by (dy, dx); borders repeat edge pixels
        assert torch.equal(y[0, 1:5, 1:5], x[0, 1 + dy : 5 + dy, 1 + dx : 5 + dx])
        seen.add((dy, dx))
    assert len(seen) == 9
