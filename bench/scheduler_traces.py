"""The committed trace replay table: every policy on every trace, checked against issue 21's targets.

    python bench/scheduler_traces.py            # ~2-3 minutes on 2 cores
    python bench/scheduler_traces.py --out /tmp/traces

Traces (bench/traces/, each with its provenance in its first lines): Tiresias' public
60-job trace; Philly-like traces from two duration families at load 0.7-0.8, several seeds
(`bench/traces.py`); two teams in one cohort, one submitting 4x the other's work; one team
alone with the other's quota idle. The 10,000-job timing run and the idle-quota case on
seeds 1-5 are generated here (seeded) rather than committed. Writes
`<out>/scheduler_traces.json` and `.md`, with provenance.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from provenance import git_commit  # noqa: E402  (bench/ is on sys.path: this script's folder)
from trace_sim import POLICIES, SimConfig, replay  # noqa: E402
from traces import read_trace, two_teams, write_trace  # noqa: E402

from core.queues import load_queue_config  # noqa: E402

TRACES = ROOT / "bench" / "traces"
PHILLY = [
    ("philly-lognormal-s1-load0.70", 8),
    ("philly-lognormal-s2-load0.75", 8),
    ("philly-lognormal-s3-load0.80", 8),
    ("philly-pareto-s1-load0.75", 8),
    ("philly-pareto-s2-load0.80", 8),
]


def run_all(log) -> dict:
    tables = {}
    log("== Tiresias 60-job trace on 1 node x 8 GPUs")
    tables["tiresias-60"] = replay(read_trace(TRACES / "tiresias-60.csv"), SimConfig(1, 8), POLICIES, log=log)
    for name, nodes in PHILLY:
        log(f"== {name} on {nodes} nodes x 8 GPUs")
        tables[name] = replay(read_trace(TRACES / f"{name}.csv"), SimConfig(nodes, 8), POLICIES, log=log)
    teams = load_queue_config(TRACES / "teams.yaml")
    for name in ("teams-4to1-s1", "teams-idle-b-s1"):
        log(f"== {name} on 8 nodes x 8 GPUs (queues: bench/traces/teams.yaml)")
        names = ("fifo", "default", "las", "configured")
        tables[name] = replay(read_trace(TRACES / f"{name}.csv"), SimConfig(8, 8), names, teams, log=log)
    return tables


def timing(log) -> dict:
    """Item 6: 10,000 jobs on 512 GPUs with LAS and fair share on (two teams, one cohort)."""
    jobs = two_teams(512, seed=2, jobs=10_000, load=0.8)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "teams.yaml"
        path.write_text((TRACES / "teams.yaml").read_text().replace("32", "256"))
        queues = load_queue_config(path)
        write_trace(Path(folder) / "t.csv", jobs)
    log("== timing: 10,000 jobs (two teams, load 0.8) on 64 nodes x 8 GPUs, LAS + cohorts")
    result = replay(jobs, SimConfig(64, 8), ("configured",), queues, log=log)["configured"]
    return {"jobs": len(jobs), "gpus": 512, "wall_s": result["wall_s"], "decision_ms": result["decision_ms"]}


def idle_quota_seeds(log, seeds=range(1, 6)) -> dict:
    """The idle-quota case on more seeds than the committed one (team-a alone, 64 GPUs)."""
    teams = load_queue_config(TRACES / "teams.yaml")
    out = {}
    for seed in seeds:
        jobs = two_teams(64, seed=seed, jobs=1500, ratio=float("inf"), load=1.0)
        log(f"== teams-idle-b seed {seed} on 8 nodes x 8 GPUs")
        result = replay(jobs, SimConfig(8, 8), ("configured",), teams, log=log)["configured"]
        out[str(seed)] = {
            "utilisation_while_waiting": result["utilisation_while_waiting"],
            "idle_short_while_waiting": result["idle_short_while_waiting"],
            "preemptions_per_job": result["preemptions_per_job"],
        }
    return out


def targets(tables: dict, timed: dict, seeds: dict) -> dict:
    """Issue 21's targets, per trace, for `las` (no durations) against the baselines."""
    out = {}
    for name, table in tables.items():
        if name.startswith("teams"):
            continue
        las, fifo, sjf = table["las"], table["fifo"], table["sjf-oracle"]
        out[name] = {
            "avg_jct_fifo_over_las": fifo["avg_jct_s"] / las["avg_jct_s"],  # target >= 2
            "avg_jct_las_over_sjf": las["avg_jct_s"] / sjf["avg_jct_s"],  # target <= 1.3
            "p99_jct_las_over_fifo": las["p99_jct_s"] / fifo["p99_jct_s"],  # target <= 1.5
            "utilisation_las_minus_fifo": las["utilisation"] - fifo["utilisation"],  # target >= 0
            "preemptions_per_job": las["preemptions_per_job"],  # target <= 2
        }
    fair = tables["teams-4to1-s1"]["configured"]["fair_share"]
    idle = tables["teams-idle-b-s1"]
    out["fair_share"] = {
        "min_share_while_both_wait": min(q["share"] for q in fair["queues"].values()),  # target >= 0.45
        "jain": fair["jain"],
        "idle_quota_utilisation_while_waiting": idle["configured"]["utilisation_while_waiting"],  # >= 0.95
        "same_without_cohorts": idle["las"]["utilisation_while_waiting"],
        "idle_short_of_it": idle["configured"]["idle_short_while_waiting"],
        "idle_quota_utilisation_over_seeds": {
            "min": min(row["utilisation_while_waiting"] for row in seeds.values()),
            "mean": sum(row["utilisation_while_waiting"] for row in seeds.values()) / len(seeds),
            "max": max(row["utilisation_while_waiting"] for row in seeds.values()),
        },
    }
    out["timing"] = {"wall_s": timed["wall_s"], "decision_p99_ms": timed["decision_ms"]["p99"]}  # < 60, < 10
    return out


HEADER = (
    "| policy | avg JCT | median | p99 | avg wait | makespan | utilisation | preemptions/job"
    " | decision p99 ms |"
)


def render(record: dict) -> str:
    lines = [
        "# Scheduling policies on job traces",
        "",
        f"- {record['date']}; commit `{record['commit']}`; command: `{record['command']}`",
        f"- Python {record['machine']['python']}, {record['machine']['cpus']} CPU(s);"
        f" wall {record['wall_s']:.0f} s",
        "- JCT and wait in hours; utilisation over the makespan (in brackets: while some job waits);"
        " `fifo-backfill` and `sjf-oracle` get exact durations, the others none; preemption costs 60 s",
        "",
    ]
    for name, table in record["tables"].items():
        lines += [f"## {name}", "", HEADER, "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for policy, r in table.items():
            waiting = r["utilisation_while_waiting"]
            waiting = "n/a" if waiting is None else f"{waiting:.1%}"
            lines.append(
                f"| {policy} | {r['avg_jct_s'] / 3600:.2f} | {r['median_jct_s'] / 3600:.2f}"
                f" | {r['p99_jct_s'] / 3600:.2f} | {r['avg_wait_s'] / 3600:.2f}"
                f" | {r['makespan_s'] / 3600:.1f}"
                f" | {r['utilisation']:.1%} ({waiting})"
                f" | {r['preemptions_per_job']:.2f} | {r['decision_ms']['p99']:.2f} |"
            )
            fair = r.get("fair_share")
            if fair and fair["jain"] is not None:
                shares = ", ".join(f"{q} {v['share']:.1%}" for q, v in fair["queues"].items())
                lines.append(
                    f"| | GPU time while both queues wait: {shares}; Jain {fair['jain']:.3f} | | | | | | | |"
                )
        lines.append("")
    lines += ["## Targets", "", "```", json.dumps(record["targets"], indent=2), "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args(argv)
    started = time.perf_counter()
    tables = run_all(lambda line: print(line, flush=True))
    timed = timing(lambda line: print(line, flush=True))
    seeds = idle_quota_seeds(lambda line: print(line, flush=True))
    record = {
        "what": "scheduling policies replayed on job traces (issue 21)",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "command": " ".join(
            ["python", "bench/scheduler_traces.py", *(sys.argv[1:] if argv is None else argv)]
        ),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "tables": tables,
        "timing": timed,
        "idle_quota_seeds": seeds,
    }
    record["targets"] = targets(tables, timed, seeds)
    record["wall_s"] = time.perf_counter() - started
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "scheduler_traces.json").write_text(json.dumps(record, indent=2) + "\n")
    (out / "scheduler_traces.md").write_text(render(record))
    print(json.dumps(record["targets"], indent=2))
    print(f"written to {out / 'scheduler_traces.json'} and .md ({record['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
