"""The 2-process runs the parallel and checkpoint tests share, in one torchrun launch.

Starting torchrun costs ~10 s on a small CPU machine, so one launch runs a plan of several
jobs one after another in the same process group (`python -m torch.distributed.run ...
tests/dist_suite.py PLAN`). `suite(tmp)` writes the plan, first trains the single-process
references the plan needs, launches, and returns every run's metrics and summary; it runs
once per test session however many test modules ask for it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from core.metrics_log import read_metrics

ROOT = Path(__file__).resolve().parents[1]
VIT_JOB, GPT_JOB = ROOT / "jobs/convnet.yaml", ROOT / "jobs/gpt.yaml"
STEPS = 20

# vit_micro on 8x8 digits, no dropout: every process sees the same samples per step
VIT = [
    "model.family=vit",
    "model.preset=vit_micro",
    "data.batch_size=32",
    f"train.steps={STEPS}",
    "train.eval_every=null",
    "metrics.log_every=1",
    "checkpoint.keep=5",
]
GPT = [
    "model.preset=gpt_nano",
    "data.source=synthetic",
    "data.kind=tokens",
    "data.seq_len=32",
    "data.num_samples=512",
    "data.batch_size=16",
    "train.steps=12",
    "train.eval_every=null",
    "train.eval_batches=4",
    "metrics.log_every=1",
    "optimizer.lr=0.01",
    "scheduler.warmup_steps=2",
]

FSDP2, DDP = "parallel.strategy=fsdp2", "parallel.strategy=ddp"
ONE = "parallel.strategy=none", "resources.num_workers=1"
CKPT10 = "checkpoint.every_steps=10"
COMPILE_ENV = {"ORCHESTRATOR_COMPILE_BACKEND": "aot_eager"}  # the code path, not inductor's C++ build

# single-process references, trained in this process before the launch
LOCAL_RUNS = {
    "one": (VIT_JOB, VIT + [*ONE, CKPT10]),
    "one_bf16": (VIT_JOB, VIT + [*ONE, "precision.dtype=bf16"]),
    "gpt_bf16": (GPT_JOB, GPT + [*ONE, "precision.dtype=bf16"]),
}
# 2-process runs, in order; a third field names the run whose step-10 checkpoint is copied
# into this run's directory first, so that it resumes from there
DIST_RUNS = {
    # parity with "one"; gradient accumulation; async checkpoints (every 10 steps)
    "fsdp2": (VIT_JOB, VIT + [FSDP2, CKPT10, "checkpoint.async=true", "train.grad_accum=2"], None),
    "ddp": (VIT_JOB, VIT + [DDP], None),
    "fsdp2_bf16": (VIT_JOB, VIT + [FSDP2, "precision.dtype=bf16"], None),
    "ddp_bf16": (VIT_JOB, VIT + [DDP, "precision.dtype=bf16"], None),
    "fsdp2_fp16": (VIT_JOB, VIT + [FSDP2, "precision.dtype=fp16", "train.steps=12"], None),
    # the 2-worker (async-written) checkpoint resumed on 2 workers; a 1-worker one on 2 workers
    "fsdp2_resumed": (VIT_JOB, VIT + [FSDP2, CKPT10, "train.grad_accum=2"], "fsdp2"),
    "from_one": (VIT_JOB, VIT + [FSDP2, CKPT10], "one"),
    # the features together: float8 + compile + activation checkpointing under each strategy
    "gpt_fsdp2_fp8": (
        GPT_JOB,
        GPT
        + [
            FSDP2,
            "precision.dtype=fp8",
            "precision.compile=true",
            "parallel.activation_checkpointing=selective",
            "parallel.selective_policy=ops",
            "parallel.cpu_offload=true",
        ],
        None,
    ),
    "vit_ddp_fp8": (
        VIT_JOB,
        VIT
        + [
            DDP,
            "precision.dtype=fp8",
            "precision.compile=true",
            "parallel.activation_checkpointing=full",
            "train.steps=12",
        ],
        None,
    ),
}
JOB_NAMES = {VIT_JOB: "convnet-digits", GPT_JOB: "gpt-charlm"}


def run_dir(base: Path, name: str, job: Path) -> Path:
    return base / name / JOB_NAMES[job]


def overrides(base: Path, name: str, extra: list[str]) -> list[str]:
    return [*extra, f"checkpoint.storage={base / name}"]


def copy_checkpoint(base: Path, source: str, target: str, job: Path, step: int = 10) -> None:
    src = run_dir(base, source, job) / f"checkpoint_{step:08d}"
    dst = run_dir(base, target, job) / src.name
    shutil.rmtree(dst.parent, ignore_errors=True)
    dst.parent.mkdir(parents=True)
    shutil.copytree(src, dst)


def losses(run_dir: Path) -> dict[int, float]:
    """{step: loss} of a run's metrics log."""
    return {r["step"]: r["loss"] for r in read_metrics(str(run_dir)) if "loss" in r}


def grad_norms(run_dir: Path) -> dict[int, float]:
    """{step: gradient norm before clipping} of a run's metrics log."""
    return {r["step"]: r["grad_norm"] for r in read_metrics(str(run_dir)) if "grad_norm" in r}


@dataclass
class Run:
    directory: Path
    summary: dict

    @property
    def losses(self) -> dict[int, float]:
        return losses(self.directory)

    @property
    def grad_norms(self) -> dict[int, float]:
        return grad_norms(self.directory)


def _train(job: Path, overrides_: list[str]) -> dict:
    from core.spec import load_spec
    from workers.context import LocalContext
    from workers.run import train

    spec = load_spec(job, overrides_)
    return train(spec, LocalContext(spec))


def worker_main(plan_file: str) -> None:
    """One torchrun process: every run of the plan, in order, in one process group."""
    import torch.distributed as dist

    os.environ.update(COMPILE_ENV)
    plan = json.loads(Path(plan_file).read_text())
    base = Path(plan["base"])
    for name in plan["runs"]:
        job, extra, source = DIST_RUNS[name]
        if source and int(os.environ["RANK"]) == 0:
            copy_checkpoint(base, source, name, job)
        if dist.is_initialized():
            dist.barrier()
        summary = _train(job, overrides(base, name, extra + ["resources.num_workers=2"]))
        if summary["status"] != "succeeded":
            raise RuntimeError(f"run {name} {summary['status']}: {summary.get('reason')}")
        if int(os.environ["RANK"]) == 0:
            (base / f"{name}.summary.json").write_text(json.dumps(summary, default=str))
    dist.destroy_process_group()


_CACHE: dict[str, dict[str, Run]] = {}


def suite(base: Path) -> dict[str, Run]:
    """All runs of LOCAL_RUNS and DIST_RUNS (trained once per session)."""
    if "runs" in _CACHE:
        return _CACHE["runs"]
    from tests.conftest import run_cli

    runs = {}
    for name, (job, extra) in LOCAL_RUNS.items():
        runs[name] = Run(run_dir(base, name, job), _train(job, overrides(base, name, extra)))
    plan = base / "plan.json"
    plan.write_text(json.dumps({"base": str(base), "runs": list(DIST_RUNS)}))
    result = run_cli(
        "--standalone",
        "--nproc_per_node=2",
        str(Path(__file__)),
        str(plan),
        module="torch.distributed.run",
        env=COMPILE_ENV,
        timeout=900,
    )
    if result.returncode != 0:
        # each rank's own last lines: the one that failed first is not the one that printed last
        ranks = {r: [ln for ln in result.stderr.splitlines() if ln.startswith(f"[rank{r}]:")] for r in (0, 1)}
        tails = "\n".join(line for r in (0, 1) for line in ranks[r][-25:])
        printed = f"{result.stdout[-3000:]}\n{tails}\n{result.stderr[-3000:]}"
        raise RuntimeError(f"the 2-process runs failed:\n{printed}")
    for name, (job, _, _) in DIST_RUNS.items():
        summary = json.loads((base / f"{name}.summary.json").read_text())
        runs[name] = Run(run_dir(base, name, job), summary)
    _CACHE["runs"] = runs
    return runs


if __name__ == "__main__":
    if str(ROOT) not in sys.path:  # run as a script: the repository is on PYTHONPATH, normally
        sys.path.append(str(ROOT))
    worker_main(sys.argv[1])
