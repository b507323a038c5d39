"""What CPU training that gives way (workers/cpu_priority.py) costs the job and gives a person
at the same machine: the same local run with the ranks at normal priority and as the product
runs them (`--against adaptive`, the default: giving way while something else wants the CPU;
`--against background`: SCHED_IDLE from the start), in pairs whose order alternates.

    python bench/cpu_priority.py                     # the main job; ~10 min on 2 cores
    python bench/cpu_priority.py --pairs 1 --probe-pairs 1 --steps 60 --probe-steps 60 --out /tmp/c.json

Each run is `orchestrator run jobs/vit.yaml` (local Ray, its one 2-CPU worker, no evaluation,
no checkpoints) in a session of its own, as if started from another terminal; this process is
the person's shell. Quiet pairs (`--pairs`, `--steps`) measure the job's samples/s with
nothing else running: the cost. Pairs with the probe (`--probe-pairs`, `--probe-steps`)
measure what a person gets: while the job trains, a loop of ~0.07 s of CPU runs here every
0.2 s, and its slowdown is its wall time over its CPU time (1.0: it waited for nothing).
Prints the ratios background / normal of both, from the same run of this script; writes
bench/results/cpu_priority.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SETTING = "ORCHESTRATOR_CPU_TRAINING"  # workers/cpu_priority.py
COST_GOAL = 0.03  # giving way costs the job at most 3% on a quiet machine (issue 49)


def probe_once(n: int = 1_000_000) -> tuple[float, float]:
    """(wall s, CPU s) of a fixed loop, as a command typed at the shell does some work."""
    wall, cpu = time.perf_counter(), time.process_time()
    total = 0
    for i in range(n):
        total += i
    return time.perf_counter() - wall, time.process_time() - cpu


def one_run(setting: str, steps: int, spec: str, probe: bool) -> dict:
    """One run of `spec` for `steps` with the ranks' priority `setting`; with `probe`, the
    probe's slowdowns while it trained."""
    storage = tempfile.mkdtemp(prefix="bench-cpu-priority-")
    summary = Path(storage) / "summary.json"
    sets = [
        f"checkpoint.storage={storage}",
        "train.epochs=null",
        f"train.steps={steps}",
        "checkpoint.every_steps=null",
        "train.eval_every=null",
    ]
    command = [sys.executable, "-m", "orchestrator", "run", spec, "--summary", str(summary)]
    command += [a for s in sets for a in ("--set", s)]
    env = {**os.environ, SETTING: setting, "PYTHONPATH": str(ROOT), "ORCHESTRATOR_HOME": storage}
    if setting == "adaptive":  # the product's default: the variable unset
        env.pop(SETTING)
    env.pop("RAY_ADDRESS", None)
    slowdowns, progress = [], Path(storage)
    with tempfile.TemporaryFile("w+") as errors:
        job = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=errors, start_new_session=True
        )
        while job.poll() is None:
            if probe and any(progress.rglob("metrics/*")):  # training has begun: records are in
                wall, cpu = probe_once()
                slowdowns.append(wall / max(cpu, 1e-6))
            time.sleep(0.2)
        if job.returncode != 0:
            errors.seek(0)
            sys.exit(f"run failed ({job.returncode}):\n{errors.read()[-3000:]}")
    done = json.loads(summary.read_text())
    return {"setting": setting, "samples_per_s": done["samples_per_s"], "slowdowns": slowdowns}


def pairs(count: int, probe: bool, steps: int, spec: str, against: str) -> list[tuple[dict, dict]]:
    """`count` pairs (normal, `against`), the order alternating so that a drift of the machine
    weighs on both alike."""
    done = []
    for pair in range(count):
        order = ("normal", against) if pair % 2 == 0 else (against, "normal")
        runs = {setting: one_run(setting, steps, spec, probe) for setting in order}
        for setting in order:
            run = runs[setting]
            line = f"{'with the probe' if probe else 'quiet'}, pair {pair + 1}, {setting}: "
            line += f"{run['samples_per_s']:,.0f} samples/s"
            if probe:
                line += f", a shell's work {statistics.median(run['slowdowns'] or [0]):.2f}x its CPU time"
            print(line, flush=True)
        done.append((runs["normal"], runs[against]))
    return done


def p90(values: list[float]) -> float:
    return sorted(values)[int(0.9 * (len(values) - 1))]


def shell_figures(probed: list[tuple[dict, dict]], against: str) -> tuple[dict, float]:
    """A shell's slowdowns by the ranks' setting (median, p90), printed; and `against` / normal."""
    slow = {
        setting: [s for pair in probed for run in pair if run["setting"] == setting for s in run["slowdowns"]]
        for setting in ("normal", against)
    }
    shell = {
        k: {"median": statistics.median(v), "p90": p90(v), "probes": len(v)} for k, v in slow.items() if v
    }
    for name, figures in shell.items():
        print(
            f"ranks {name}: a shell's work took {figures['median']:.2f}x its CPU time "
            f"(p90 {figures['p90']:.2f}x, {figures['probes']} probes)"
        )
    if len(shell) < 2:
        return shell, None
    ratio = shell[against]["median"] / shell["normal"]["median"]
    print(f"the shell's slowdown, {against} / normal: x{ratio:.2f}")
    return shell, ratio


def main() -> int:
    from provenance import provenance  # bench/provenance.py (this script's folder is on sys.path)

    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", default="jobs/vit.yaml")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--pairs", type=int, default=3, help="quiet pairs: the job's throughput")
    parser.add_argument("--probe-pairs", type=int, default=2, help="pairs with the shell's probe")
    parser.add_argument("--probe-steps", type=int, default=150)
    parser.add_argument("--against", choices=("adaptive", "background"), default="adaptive")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "cpu_priority.json"))
    args = parser.parse_args()
    quiet = pairs(args.pairs, False, args.steps, args.spec, args.against)
    probed = pairs(args.probe_pairs, True, args.probe_steps, args.spec, args.against)
    throughput = (
        statistics.median(b["samples_per_s"] / n["samples_per_s"] for n, b in quiet) if quiet else None
    )
    if quiet:
        what = f"quiet: {args.against} / normal samples/s x{throughput:.3f} (median of {len(quiet)} pairs)"
        print(f"{what}; goal: at least x{1 - COST_GOAL:.2f}")
    shell, ratio = shell_figures(probed, args.against) if probed else ({}, None)
    result = {
        "provenance": provenance(),
        "spec": args.spec,
        "against": args.against,
        "quiet": {"steps": args.steps, "samples_per_s_ratio": throughput, "pairs": quiet},
        "with_probe": {"steps": args.probe_steps, "shell": shell, "slowdown_ratio": ratio, "pairs": probed},
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
