"""Sharded checkpoints (torch.distributed.checkpoint): exact round trips, across world sizes.

The 2-process runs come from tests/dist_suite.py. A resumed run must continue with the
very losses of the uninterrupted one: bit for bit on the same world size; within 1e-5
relative on another (the gradient reduction order changes, nothing else does).
"""

import shutil

import pytest

from core.spec import load_spec
from tests.dist_suite import VIT, VIT_JOB, losses, suite
from workers.checkpoint import CheckpointError
from workers.checkpoint_files import incomplete_reason, newest_valid
from workers.context import LocalContext
from workers.run import train

CROSS_WORLD_TOL = 1e-5


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return suite(tmp_path_factory.getbasetemp() / "dist_suite")


def local_resume(tmp_path, checkpoint, *overrides):
    """Train one process from a copy of `checkpoint`, as if the run had stopped right after it."""
    run_dir = tmp_path / "convnet-digits"
    run_dir.mkdir(parents=True)
    shutil.copytree(checkpoint, run_dir / checkpoint.name)
    spec = load_spec(
        VIT_JOB,
        [
            *VIT,
            "parallel.strategy=none",
            "resources.num_workers=1",
            f"checkpoint.storage={tmp_path}",
            *overrides,
        ],
    )
    return train(spec, LocalContext(spec)), run_dir


def test_each_rank_writes_its_shard_and_resume_reproduces_the_run_exactly(runs):
    checkpoint = runs["fsdp2"].directory / "checkpoint_00000010"
    files = sorted(p.name for p in checkpoint.iterdir())
    assert {".metadata", "__0_0.distcp", "__1_0.distcp", "trainer.pt", "metrics.jsonl"} <= set(files)
    assert sorted(p.name for p in (checkpoint / "rng").iterdir()) == ["rank_00000.pt", "rank_00001.pt"]
    first, resumed = runs["fsdp2"].losses, runs["fsdp2_resumed"].losses
    assert sorted(resumed) == list(range(1, 21))  # steps 1-10 come from the checkpoint's log
    for step in range(11, 21):
        assert resumed[step] == first[step], f"step {step}: {resumed[step]} != {first[step]}"


def test_a_two_worker_checkpoint_resumes_on_one_worker(runs, tmp_path):
    summary, run_dir = local_resume(
        tmp_path, runs["fsdp2"].directory / "checkpoint_00000010", "train.grad_accum=2"
    )
    assert summary["status"] == "succeeded" and summary["world_size"] == 1
    two, one = runs["fsdp2"].losses, losses(run_dir)
    for step in range(11, 21):
        assert abs(one[step] - two[step]) <= CROSS_WORLD_TOL * abs(two[step]), step


def test_a_one_worker_checkpoint_resumes_on_two_workers(runs):
    one, two = runs["one"].losses, runs["from_one"].losses
    assert runs["from_one"].summary["world_size"] == 2
    for step in range(11, 21):
        assert abs(one[step] - two[step]) <= CROSS_WORLD_TOL * abs(one[step]), step


def test_async_checkpoints_measure_the_time_training_was_blocked(runs):
    summary = runs["fsdp2"].summary  # checkpoint.async: true, every 10 steps
    assert summary["checkpoint_saves"] == 2 and summary["checkpoint_blocked_s"] > 0
    assert summary["checkpoint"].endswith("checkpoint_00000020")
    assert sorted(p.name for p in runs["fsdp2"].directory.glob("checkpoint_*")) == [
        "checkpoint_00000010",
        "checkpoint_00000020",
    ]
    # the background writes went to a staging directory that publishing moved and removed
    assert not (runs["fsdp2"].directory.parent / ".staging").exists()
    sync = runs["from_one"].summary  # synchronous saves report the same measure
    assert sync["checkpoint_blocked_s"] > 0


def test_a_checkpoint_of_another_model_fails_with_a_clear_message(runs, tmp_path):
    with pytest.raises(CheckpointError, match="does not fit this model"):
        local_resume(tmp_path, runs["one"].directory / "checkpoint_00000010", "model.overrides={dim: 64}")


def _truncate_a_shard(checkpoint) -> str:
    shard = sorted(checkpoint.glob("*.distcp"))[0]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    return shard.name


def test_one_definition_of_a_complete_checkpoint(runs, tmp_path):
    source = runs["fsdp2"].directory
    run_dir = tmp_path / "run"
    shutil.copytree(source, run_dir)
    assert incomplete_reason(str(run_dir / "checkpoint_00000020")) is None
    assert newest_valid(str(run_dir)) == (str(run_dir / "checkpoint_00000020"), [])
    shard = _truncate_a_shard(run_dir / "checkpoint_00000020")
    assert incomplete_reason(str(run_dir / "checkpoint_00000020")) == (
        f"shard {shard} is truncated ({(run_dir / 'checkpoint_00000020' / shard).stat().st_size} of "
        f"{(source / 'checkpoint_00000020' / shard).stat().st_size} bytes)"
    )
    uri, skipped = newest_valid(str(run_dir))
    assert uri == str(run_dir / "checkpoint_00000010")
    assert skipped == [
        {
            "checkpoint": "checkpoint_00000020",
            "reason": incomplete_reason(str(run_dir / "checkpoint_00000020")),
        }
    ]
    (run_dir / "checkpoint_00000010" / "rng" / "rank_00001.pt").unlink()  # a rank never finished
    assert incomplete_reason(str(run_dir / "checkpoint_00000010")) == "missing rng/rank_00001.pt"
    (run_dir / "checkpoint_00000010" / "trainer.pt").write_bytes(b"partial")
    assert incomplete_reason(str(run_dir / "checkpoint_00000010")).startswith("trainer.pt is unreadable")
    assert newest_valid(str(run_dir))[0] is None


def test_resume_skips_a_truncated_newest_checkpoint_and_says_so(runs, tmp_path):
    run_dir = tmp_path / "convnet-digits"
    run_dir.mkdir()
    for name in ("checkpoint_00000010", "checkpoint_00000020"):
        shutil.copytree(runs["one"].directory / name, run_dir / name)
    _truncate_a_shard(run_dir / "checkpoint_00000020")
    spec = load_spec(
        VIT_JOB,
        [
            *VIT,
            "parallel.strategy=none",
            "resources.num_workers=1",
            f"checkpoint.storage={tmp_path}",
            "train.steps=25",
        ],
    )
    summary = train(spec, LocalContext(spec))
    assert summary["status"] == "succeeded" and summary["steps"] == 25
    resumed = summary["resumed_from"]
    assert resumed["checkpoint"] == str(run_dir / "checkpoint_00000010") and resumed["step"] == 10
    assert resumed["skipped"][0]["checkpoint"] == "checkpoint_00000020"
    assert "truncated" in resumed["skipped"][0]["reason"]


class _ByName:
    """Pickles as getattr(owner, name), as some Python versions pickle enum members."""

    def __init__(self, owner, name):
        self.owner, self.name = owner, name

    def __reduce__(self):
        return getattr, (self.owner, self.name)


def test_metadata_enums_pickled_by_name_load_and_nothing_else_does():
    import io
    import pickle

    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING, Metadata

    from workers.checkpoint_files import _MetadataUnpickler

    member = pickle.dumps(_ByName(_MEM_FORMAT_ENCODING, "TORCH_CONTIGUOUS_FORMAT"))
    assert b"getattr" in member
    loaded = _MetadataUnpickler(io.BytesIO(member)).load()
    assert loaded is _MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT
    escape = pickle.dumps(_ByName(Metadata, "__init__"))  # an attribute that is code
    with pytest.raises(pickle.UnpicklingError):
        _MetadataUnpickler(io.BytesIO(escape)).load()
