"""What checkpoint checksums cost: the same save with and without them, and how long a resume
takes to check a checkpoint's bytes.

    python bench/checkpoint_checksums.py                       # vit_micro, resnet50, vit_b16; ~2 min
    python bench/checkpoint_checksums.py --models gpt2_small --pairs 3 --dir /mnt/nfs/tmp

A save is `workers.checkpoint.save` as the training loop calls it (one process): DCP writes
model and AdamW state (with fsync), then the RNG file, the metrics log, the trainer state and
the manifest. With checksums, each file is hashed (xxh3-128) right after it is written, reading
it back from the page cache; without, the manifest lists sizes only. Saves alternate in pairs
(with/without, then without/with, ...) into fresh folders, so that a disk that slows down or
speeds up weighs on both sides alike; the figure is the median of the pair ratios. Since fsync
makes single saves vary by tens of percent, the checksum step is also timed alone, on the files
of each save just made ("checksum step", and its share of the save without). A resume
checks every byte of the checkpoint it picks (`damage_reason`): "check" times that on the
checkpoint just saved (from the page cache, as on a machine that wrote it; from cold storage
it is bounded by the read).

Asynchronous saves (`checkpoint.async: true`) hash in the background thread that writes the
shards, so training waits for none of it; this measures the synchronous save, the worst case.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "checkpoint_checksums.json"
sys.path.insert(0, str(ROOT))


def model_and_optimizer(preset: str):
    """A model of the registry's preset and AdamW with its state (one step on zero gradients)."""
    import torch

    from workers.models import registry

    family = next(f for f in ("vit", "gpt", "resnet", "convnet") if preset in registry.presets(f))
    model = registry.build(SimpleNamespace(family=family, preset=preset, overrides={}))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    return model, optimizer


def timed_save(base: Path, name: str, model, optimizer, checksums: bool) -> tuple[float, Path]:
    from workers import checkpoint

    directory = base / name
    state = {"step": 1, "seed": 0, "world_size": 1}
    history = [{"step": 1, "loss": 1.0}]
    started = time.perf_counter()
    checkpoint.save(directory, model, optimizer, state, history, rank=0, checksums=checksums)
    return time.perf_counter() - started, directory


def measure(preset: str, pairs: int, base: Path) -> dict:
    from workers.checkpoint_files import MANIFEST_FILE, damage_reason, file_entries

    model, optimizer = model_and_optimizer(preset)
    timed_save(base, "warm-up", model, optimizer, True)  # first-call costs (imports, planner)
    shutil.rmtree(base / "warm-up")
    times: dict[str, list[float]] = {"with": [], "without": []}
    ratios, hashing, checks, size = [], [], [], 0
    for i in range(pairs):
        order = ("with", "without") if i % 2 == 0 else ("without", "with")
        for side in order:
            seconds, directory = timed_save(base, f"{side}-{i}", model, optimizer, side == "with")
            times[side].append(seconds)
            if side == "with":
                files = [str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file()]
                size = sum((directory / name).stat().st_size for name in files)
                started = time.perf_counter()  # the checksum step of the save, alone
                file_entries(directory, [name for name in files if name != MANIFEST_FILE])
                hashing.append(time.perf_counter() - started)
                started = time.perf_counter()
                assert damage_reason(str(directory)) is None
                checks.append(time.perf_counter() - started)
            shutil.rmtree(directory)
        ratios.append(times["with"][-1] / times["without"][-1])
    result = {
        "model": preset,
        "parameters": sum(p.numel() for p in model.parameters()),
        "checkpoint_bytes": size,
        "save_s_with": statistics.median(times["with"]),
        "save_s_without": statistics.median(times["without"]),
        "ratio": statistics.median(ratios),
        "ratio_range": [min(ratios), max(ratios)],
        "checksum_s": statistics.median(hashing),
        "checksum_share": statistics.median(hashing) / statistics.median(times["without"]),
        "check_s": statistics.median(checks),
        "saves_s": times,
    }
    print(
        f"{preset:10s} {size / 1e6:7.1f} MB  save {result['save_s_without'] * 1e3:7.1f} ms without,"
        f" {result['save_s_with'] * 1e3:7.1f} ms with checksums: ratio {result['ratio']:.3f}"
        f" (pairs {min(ratios):.2f}-{max(ratios):.2f});  the checksum step alone"
        f" {result['checksum_s'] * 1e3:5.1f} ms = {result['checksum_share']:.1%} of a save;"
        f"  check at resume {result['check_s'] * 1e3:5.1f} ms ({size / result['check_s'] / 1e9:.1f} GB/s)",
        flush=True,
    )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="vit_micro,resnet50,vit_b16", help="registry presets")
    parser.add_argument("--pairs", type=int, default=15, help="with/without pairs per model")
    parser.add_argument("--dir", default=None, help="where to write the checkpoints (default: a temp dir)")
    parser.add_argument("--out", default=str(RESULTS), help="JSON results file ('' to skip)")
    args = parser.parse_args()

    base = Path(tempfile.mkdtemp(prefix="bench-checksums-", dir=args.dir))
    try:
        results = [measure(preset, args.pairs, base) for preset in args.models.split(",")]
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if args.out:
        from provenance import provenance  # bench/provenance.py (this script's folder is on sys.path)

        record = {
            "what": "synchronous checkpoint save with and without per-file checksums (xxh3-128)",
            **provenance(),
            "pairs": args.pairs,
            "storage": args.dir or tempfile.gettempdir(),
            "results": results,
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
        print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
