"""Ray Train's own start-up floor: an empty `TorchTrainer` against the orchestrator's start path.

    python bench/ray_floor.py --repeats 3                 # a local Ray head started for it
    python bench/ray_floor.py --address HOST:6379         # a running cluster

Each run starts what `orchestrator.ray.launcher` starts, from a fresh process: a `num_cpus=0`
actor on this node that imports Ray Train and calls `TorchTrainer.fit()` (2 CPU workers, gloo),
but with a training function that does nothing except report once. Reported per run, from the
actor's own start: Ray Train imported (`ray.train.torch`, which imports torch), `fit()`
called, the training function entered on rank 0 (Ray Train's controller, its worker
processes and the process group are up) and the report received. Whatever the orchestrator's
job takes beyond these (docs/ray.md, "Overhead against torchrun") is its own.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def empty_train_fn(config: dict) -> None:
    import ray.train

    entered = time.time()
    if ray.train.get_context().get_world_rank() == 0:
        Path(config["mark"]).write_text(str(entered))
    ray.train.report({"entered": entered})


def fit_empty(workers: int, storage: str) -> dict:
    """In a fresh actor process: the stages' wall times (seconds since the epoch)."""
    at = {"actor_entered": time.time()}
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    at["ray_train_imported"] = time.time()
    mark = os.path.join(storage, f"entered-{time.time_ns()}")
    trainer = TorchTrainer(
        empty_train_fn,
        train_loop_config={"mark": mark},
        torch_config=TorchConfig(backend="gloo"),
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=False),
        run_config=RunConfig(name=f"floor-{time.time_ns()}", storage_path=storage),
    )
    at["fit_called"] = time.time()
    result = trainer.fit()
    at["fit_returned"] = time.time()
    at["train_fn_entered"] = float(Path(mark).read_text())
    del result
    return at


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--address", help="Ray cluster to run on (default: a local head for it)")
    parser.add_argument("--out", default="", help="JSON results file")
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT))
    import ray

    head = None
    if not args.address:
        from orchestrator.testing.local_cluster import start_ray_head, stop_ray_head

        head = start_ray_head(num_cpus=max(4, args.workers))
        args.address = head.address
        os.environ.update(head.env)
    runs = []
    try:
        ray.init(address=args.address, logging_level="ERROR")
        here = ray.get_runtime_context().get_node_id()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        remote_fit = ray.remote(num_cpus=0, max_calls=1)(fit_empty).options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False)
        )
        storage = tempfile.mkdtemp(prefix="bench-floor-")
        for i in range(args.repeats):
            started = time.time()
            at = ray.get(remote_fit.remote(args.workers, storage))
            run = {"actor_process_start": at["actor_entered"] - started}
            run.update(
                {
                    "import_ray_train_torch": at["ray_train_imported"] - at["actor_entered"],
                    "fit_to_train_fn": at["train_fn_entered"] - at["fit_called"],
                    "actor_entered_to_train_fn": at["train_fn_entered"] - at["actor_entered"],
                    "fit_total": at["fit_returned"] - at["fit_called"],
                }
            )
            runs.append(run)
            stages = "  ".join(f"{k} {v:.2f} s" for k, v in run.items())
            print(f"run {i + 1}/{args.repeats}  {stages}", flush=True)
    finally:
        ray.shutdown()
        if head is not None:
            stop_ray_head(head)
    summary = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    print("medians: " + ", ".join(f"{k} {v:.2f} s" for k, v in summary.items()))
    print(f"load average {os.getloadavg()}")
    if args.out:
        sys.path.insert(0, str(ROOT / "bench"))
        from provenance import provenance

        record = {
            "what": "Ray Train's start-up floor: an empty TorchTrainer.fit() from a fresh actor",
            **provenance(),
            "workers": args.workers,
            "load_avg_after": os.getloadavg(),
            "summary": summary,
            "runs": runs,
        }
        Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
        print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
