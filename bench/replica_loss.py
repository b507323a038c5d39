"""Does a job of replica groups that lost a group learn as well as one that did not?

The digits convnet with `fault_tolerance.replica_groups: 2` (one process per group, under
torchrun, each step paced so that the kill lands mid-run), run without a fault once per seed,
then with seed 0 again while group 1 is killed (SIGKILL, its torchrun and its worker) at step
`--kill-at` and a new group 1 starts `--back-after` steps later and heals from group 0. The
curves are compared as moving averages of the logged training loss; the run-to-run spread is
how far the other seeds' curves lie from seed 0's. Prints each run's final evaluation, the
faulted run's distance from seed 0 against that spread, and writes bench/results/replica_loss.json.

    python bench/replica_loss.py --seeds 0,1,2 --steps 300 --kill-at 100 --back-after 30
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.provenance import provenance  # noqa: E402
from core.metrics_log import read_metrics  # noqa: E402
from orchestrator.testing.replica_groups import kill_tree, torchrun_group  # noqa: E402

PACE_S = 0.05  # a step at most this often: the kill lands mid-run whatever the machine's pace
WINDOW = 20  # steps in the moving average of the loss


def group(index: int, work: Path, seed: int, steps: int, lighthouse: str, tag: str, again: str = ""):
    """Group `index` of the run `seed{seed}{tag}`; `again` names a replacement's files apart."""
    sets = [
        "fault_tolerance.replica_groups=2",
        f"train.steps={steps}",
        f"train.seed={seed}",
        f"train.eval_every={steps}",
        "metrics.log_every=1",
        f"checkpoint.every_steps={steps}",
        f"checkpoint.storage={work / 'runs'}",
        f"name=seed{seed}{tag}",
    ]
    files = work / f"seed{seed}{tag}{again}-group{index}"
    summary, log = files.with_suffix(".json"), files.with_suffix(".log")
    return torchrun_group(index, sets, summary, lighthouse, work / "faults", log)


def shown_step(log: Path) -> int:
    shown = re.findall(r"\] step (\d+)/", log.read_text()) if log.exists() else []
    return int(shown[-1]) if shown else 0


def wait_step(log: Path, step: int, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while shown_step(log) < step:
        if time.time() > deadline:
            raise SystemExit(f"error: {log.name} did not reach step {step}")
        time.sleep(0.2)


def run(work: Path, seed: int, args, fault: bool) -> dict:
    """One run of two groups; with `fault`, group 1 killed and replaced. Its loss curve and
    final evaluation."""
    from torchft.coordination import LighthouseServer

    tag = "-fault" if fault else ""
    (work / "faults").mkdir(exist_ok=True)
    (work / "faults" / f"seed{seed}{tag}").write_text(f"paced={PACE_S}\n")
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=2000)
    procs = [group(g, work, seed, args.steps, lighthouse.address(), tag) for g in (0, 1)]
    try:
        if fault:
            wait_step(work / f"seed{seed}{tag}-group1.log", args.kill_at)
            kill_tree(procs[1])
            wait_step(work / f"seed{seed}{tag}-group0.log", args.kill_at + args.back_after)
            procs.append(group(1, work, seed, args.steps, lighthouse.address(), tag, again="-new"))
        codes = [p.wait(timeout=900) for p in (procs[0], procs[-1])]
        if codes != [0, 0]:
            raise SystemExit(f"error: seed {seed}{tag}: a group failed (logs in {work})")
    finally:
        for p in procs:
            if p.poll() is None:
                kill_tree(p)
        lighthouse.shutdown()  # its port goes with it
    if fault:  # the new group healed from group 0, at the step group 0 had reached
        healed = re.findall(
            r"group 1 healed from a peer at step (\d+)",
            (work / f"seed{seed}{tag}-new-group1.log").read_text(),
        )
        if not healed or int(healed[0]) < args.kill_at + args.back_after:
            raise SystemExit(f"error: the new group 1 did not heal from group 0 (logs in {work})")
    history = read_metrics(str(work / "runs" / f"seed{seed}{tag}"))
    losses = {r["step"]: r["loss"] for r in history if "loss" in r}
    evals = [r for r in history if "eval_loss" in r]
    return {"losses": [losses[s] for s in sorted(losses)], "steps": sorted(losses), "eval": evals[-1]}


def moving_average(values: list[float], window: int = WINDOW) -> list[float]:
    return [sum(values[i - window : i]) / window for i in range(window, len(values) + 1)]


def distance(a: list[float], b: list[float]) -> float:
    """The largest gap between two curves' moving averages."""
    return max(abs(x - y) for x, y in zip(moving_average(a), moving_average(b)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--kill-at", type=int, default=100)
    parser.add_argument("--back-after", type=int, default=30)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "replica_loss.json"))
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    with tempfile.TemporaryDirectory(prefix="replica-loss-") as tmp:
        work = Path(tmp)
        runs = {seed: run(work, seed, args, fault=False) for seed in seeds}
        faulted = run(work, seeds[0], args, fault=True)
    base = runs[seeds[0]]
    assert faulted["steps"] == base["steps"], "the faulted run's log lacks or repeats steps"
    spread = max(distance(runs[s]["losses"], base["losses"]) for s in seeds[1:])
    gap = distance(faulted["losses"], base["losses"])
    evals = {f"seed {s}": runs[s]["eval"] for s in seeds}
    evals[f"seed {seeds[0]}, group 1 lost"] = faulted["eval"]
    for label, e in evals.items():
        print(f"{label:>24}: eval loss {e['eval_loss']:.4f}, accuracy {e['eval_accuracy']:.4f}")
    print(
        f"loss curve ({WINDOW}-step moving average), largest gap from seed {seeds[0]}'s: the faulted run "
        f"{gap:.4f}, the other seeds' (run-to-run spread) {spread:.4f}: x{gap / spread:.2f} of the spread"
    )
    result = {
        **provenance(),
        "steps": args.steps,
        "kill_at": args.kill_at,
        "back_after": args.back_after,
        "evals": evals,
        "gap": gap,
        "spread": spread,
        "ratio": gap / spread,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
