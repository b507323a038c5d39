"""Checkpoints to S3 against local disk, on the path a job takes on Ray.

    python bench/checkpoint_storage.py                  # vit_tiny, 2 workers, 2 pairs of runs; ~6 min
    python bench/checkpoint_storage.py --pairs 3 --set model.preset=vit_tiny

The same job (a ViT on synthetic 32x32 images, 2 Ray Train workers with DDP, a checkpoint
every few steps) runs on a local Ray head with its checkpoints on this machine's disk and on
a real S3 API server (`moto_server` on loopback), alternately, so that a machine that slows
down weighs on both sides alike. Per save, from the job's own metrics records:

    blocked    `checkpoint_save_s`: how long training waited (each rank writes its part to
               local disk; the upload goes on in Ray Train's upload thread)
    durable    `checkpoint_durable_s`: from the save's start until the checkpoint is complete
               in storage (every rank's part, the manifest, as a resume would accept it)
    MB/s       the checkpoint's bytes over `durable`

The goal: blocked on S3 within 1.2x of blocked on local disk. Then the upload alone, on one
checkpoint the local runs saved: one file at a time (how Ray Train's own uploader sends to S3:
`use_threads=False`) against UPLOAD_THREADS files at a time (`workers/checkpoint_upload.py`).

moto keeps objects in memory and serves them from Python on this machine: its MB/s are not
S3's. What carries over is the shape: what training waits for, and what goes on beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.provenance import provenance  # noqa: E402  (after the path fix above)

RESULTS = ROOT / "bench" / "results" / "checkpoint_storage.json"
JOB = """\
name: checkpoint-bench
model: {family: vit, preset: vit_tiny, overrides: {patch_size: 4}}
data: {source: synthetic, image_size: 32, num_classes: 10, batch_size: 8, num_samples: 512}
train: {steps: 60}
optimizer: {name: adamw, lr: 0.001}
parallel: {strategy: ddp}
resources: {num_workers: 2, cpus_per_worker: 1}
checkpoint: {storage: ./runs, every_steps: 12, keep: 2}
metrics: {log_every: 1}
"""


def run_job(head, spec: Path, storage: str, name: str, overrides: list[str]) -> dict[str, list[float]]:
    """Run the job once; the save figures its records carry."""
    from core.metrics_log import read_metrics
    from core.records import CHECKPOINT_BYTES, CHECKPOINT_DURABLE_S, CHECKPOINT_SAVE_S

    command = [sys.executable, "-m", "orchestrator", "run", str(spec), "--address", head.address]
    for override in [f"checkpoint.storage={storage}", f"name={name}", *overrides]:
        command += ["--set", override]
    env = {**os.environ, **head.env, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        sys.exit(f"the job failed on {storage}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    records = read_metrics(f"{storage.rstrip('/')}/{name}")
    fields = {"blocked_s": CHECKPOINT_SAVE_S, "durable_s": CHECKPOINT_DURABLE_S, "bytes": CHECKPOINT_BYTES}
    return {key: [float(r[f]) for r in records if r.get(f) is not None] for key, f in fields.items()}


def newest_local_checkpoint(run: Path) -> Path:
    folders = [p for p in sorted(run.glob("checkpoint_*")) if any(f.is_file() for f in p.rglob("*"))]
    if not folders:
        sys.exit(f"no checkpoint with files under {run}: {sorted(p.name for p in run.iterdir())}")
    return folders[-1]


def upload_rates(s3, checkpoint: Path, pairs: int) -> dict[str, list[float]]:
    """MB/s of uploading one checkpoint directory with 1 file at a time and with UPLOAD_THREADS."""
    from workers import checkpoint_upload

    threads = checkpoint_upload.UPLOAD_THREADS
    sides = {"1 file at a time": 1, f"{threads} files at a time": threads}
    rates: dict[str, list[float]] = {label: [] for label in sides}
    try:
        for i in range(pairs):
            for label in sorted(sides, reverse=i % 2 == 1):
                checkpoint_upload.UPLOAD_THREADS = sides[label]
                started = time.perf_counter()
                where = f"orchestrator-tests/upload/{i}-{sides[label]}"
                sent = checkpoint_upload.upload(checkpoint, s3.fs(), where)
                rates[label].append(sent / 2**20 / (time.perf_counter() - started))
    finally:
        checkpoint_upload.UPLOAD_THREADS = threads
    return rates


def summarize(runs: dict[str, list[dict]]) -> dict:
    out = {}
    for side, results in runs.items():
        blocked = [x for r in results for x in r["blocked_s"]]
        durable = [x for r in results for x in r["durable_s"]]
        size = statistics.median([x for r in results for x in r["bytes"]])
        out[side] = {
            "saves": len(blocked),
            "blocked_s_median": statistics.median(blocked),
            "durable_s_median": statistics.median(durable),
            "checkpoint_mb": size / 2**20,
            "mb_per_s": size / 2**20 / statistics.median(durable),
        }
    out["blocked_ratio_s3_over_local"] = out["s3"]["blocked_s_median"] / out["local"]["blocked_s_median"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2, help="runs on each side, alternating (default 2)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", default=str(RESULTS), help="JSON results file ('' to skip)")
    args = parser.parse_args()

    from orchestrator.testing.local_cluster import start_ray_head, stop_ray_head
    from orchestrator.testing.s3_server import restore, start_s3_server

    work = Path(tempfile.mkdtemp(prefix="checkpoint-bench-"))
    spec = work / "job.yaml"
    spec.write_text(JOB)
    s3 = start_s3_server(niceness=19)  # S3 is another machine: its server yields the CPU to training
    previous = s3.use()  # before the head starts: its workers inherit the endpoint
    head = start_ray_head(num_cpus=4)
    runs: dict[str, list[dict]] = {"local": [], "s3": []}
    try:
        for i in range(args.pairs):
            for side in ("local", "s3") if i % 2 == 0 else ("s3", "local"):
                storage = str(work / "runs") if side == "local" else s3.uri("runs")
                result = run_job(head, spec, storage, f"bench-{side}-{i}", args.overrides)
                runs[side].append(result)
                median = {key: statistics.median(values) for key, values in result.items()}
                print(
                    f"run {i + 1}/{args.pairs} {side:5s}  blocked {median['blocked_s']:.3f} s"
                    f"  durable {median['durable_s']:.3f} s  {median['bytes'] / 2**20:.0f} MB",
                    flush=True,
                )
        local_checkpoint = newest_local_checkpoint(work / "runs" / "bench-local-0")
        rates = upload_rates(s3, local_checkpoint, pairs=3)
    finally:
        stop_ray_head(head)
        s3.stop()
        restore(previous)
        shutil.rmtree(work, ignore_errors=True)
    summary = summarize(runs)
    summary["upload_mb_per_s"] = {label: statistics.median(v) for label, v in rates.items()}
    for side in ("local", "s3"):
        s = summary[side]
        print(
            f"{side:5s}: {s['saves']} saves of {s['checkpoint_mb']:.0f} MB; training blocked "
            f"{s['blocked_s_median']:.3f} s, durable after {s['durable_s_median']:.3f} s "
            f"({s['mb_per_s']:.0f} MB/s)"
        )
    print(f"blocked, S3 / local: {summary['blocked_ratio_s3_over_local']:.2f}x (goal <= 1.2x)")
    for label, rate in summary["upload_mb_per_s"].items():
        print(f"upload of one checkpoint to S3, {label}: {rate:.0f} MB/s")
    if args.out:
        results = {"provenance": provenance(), "summary": summary, "runs": runs, "uploads": rates}
        Path(args.out).write_text(json.dumps(results, indent=1))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
