"""The results of bench/scheduler_sim.py: a run's summary, the policy against FIFO, the
markdown table and the line printed per run."""

from __future__ import annotations

import statistics

from bench.scheduler_sim_workload import PRIORITY_NAMES, Outcome
from bench.sim_stats import decision_summary, percentile


def summarize(outcome: Outcome, total_gpus: int) -> dict:
    jobs = outcome.jobs.values()
    waits = {
        PRIORITY_NAMES[level]: [job.waited_s for job in jobs if job.plan.priority == level]
        for level in sorted(PRIORITY_NAMES)
    }
    decision_ms = [s * 1e3 for s in outcome.decision_s]
    capacity_s = total_gpus * outcome.makespan_s
    return {
        "makespan_h": outcome.makespan_s / 3600,
        "gpu_utilisation": outcome.gpu_busy_s / capacity_s,
        "gpu_goodput": outcome.gpu_useful_s / capacity_s,
        # how well the GPUs are packed while there is work waiting (the part the policy decides)
        "gpu_utilisation_queued": outcome.gpu_busy_queued_s / (total_gpus * outcome.queued_s)
        if outcome.queued_s
        else None,
        "queued_h": outcome.queued_s / 3600,
        "wait_h": {
            name: {
                "jobs": len(values),
                "mean": statistics.fmean(values) / 3600 if values else 0.0,
                "p50": percentile(values, 50) / 3600,
                "p99": percentile(values, 99) / 3600,
            }
            for name, values in waits.items()
        },
        "preemptions": outcome.preemptions,
        "unacknowledged_preemptions": outcome.unacknowledged,
        "steps_lost": sum(job.lost_steps for job in jobs),
        "gpu_hours_lost": sum(job.lost_steps * job.plan.step_s * job.plan.gpus for job in jobs) / 3600,
        "decision_ms": decision_summary(decision_ms),
        "max_pending": outcome.max_pending,
        "invariant_checks": outcome.invariant_checks,
        "invariants_held": True,  # any violation stops the run with an AssertionError
    }


def compare(policy: dict, fifo: dict) -> dict:
    def ratio(a: float, b: float) -> float | None:
        return a / b if b > 0 else None

    return {
        "utilisation_ratio": ratio(policy["gpu_utilisation"], fifo["gpu_utilisation"]),
        "utilisation_queued_ratio": ratio(
            policy["gpu_utilisation_queued"] or 0.0, fifo["gpu_utilisation_queued"] or 0.0
        ),
        "makespan_ratio": ratio(policy["makespan_h"], fifo["makespan_h"]),
        "p99_wait_ratio": {
            name: ratio(policy["wait_h"][name]["p99"], fifo["wait_h"][name]["p99"])
            for name in policy["wait_h"]
        },
        "mean_wait_ratio": {
            name: ratio(policy["wait_h"][name]["mean"], fifo["wait_h"][name]["mean"])
            for name in policy["wait_h"]
        },
    }


def render_markdown(record: dict) -> str:
    cfg, policy, fifo, ratios = record["config"], record["policy"], record["fifo"], record["comparison"]

    def fmt(value: float | None, digits: int = 2) -> str:
        return "n/a" if value is None else f"{value:.{digits}f}"

    def fmt_share(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.1%}"

    lines = [
        "# Scheduling policy simulation",
        "",
        f"- {record['date']}; commit `{record['commit']}`; command: `{record['command']}`",
        f"- Python {record['machine']['python']} on {record['machine']['platform']},"
        f" {record['machine']['cpus']} CPU(s); wall time {record['wall_s']:.1f} s for both runs",
        f"- workload: {cfg['jobs']:,} jobs on {cfg['nodes']} nodes x {cfg['gpus_per_node']} GPUs"
        f" ({cfg['nodes'] * cfg['gpus_per_node']} GPUs), seed {cfg['seed']}, offered load {cfg['load']:.2f};"
        f" log-normal runtimes (median {cfg['median_runtime_s'] / 60:.0f} min, sigma {cfg['runtime_sigma']});"
        f" {cfg['estimate_share']:.0%} of jobs with a runtime estimate;"
        f" {cfg['no_ack_share']:.0%} of victims do not acknowledge (killed after {cfg['grace_s']:.0f} s)",
        "- wait: total time a job spent queued (first submission to start, plus every requeue);"
        " utilisation: GPU-time held by jobs over GPUs x makespan (while jobs wait: over the time some"
        " job was queued); goodput: GPU-time of the work that was kept",
        "",
        "| | Policy | FIFO | Policy / FIFO |",
        "|---|---:|---:|---:|",
        f"| makespan (h) | {policy['makespan_h']:.1f} | {fifo['makespan_h']:.1f}"
        f" | {fmt(ratios['makespan_ratio'])} |",
        f"| GPU utilisation | {policy['gpu_utilisation']:.1%} | {fifo['gpu_utilisation']:.1%}"
        f" | {fmt(ratios['utilisation_ratio'])} |",
        f"| GPU goodput | {policy['gpu_goodput']:.1%} | {fifo['gpu_goodput']:.1%} | |",
        f"| GPU utilisation while jobs wait | {fmt_share(policy['gpu_utilisation_queued'])}"
        f" | {fmt_share(fifo['gpu_utilisation_queued'])}"
        f" | {fmt(ratios['utilisation_queued_ratio'])} |",
    ]
    for name in policy["wait_h"]:
        p, f = policy["wait_h"][name], fifo["wait_h"][name]
        lines.append(
            f"| wait {name} ({p['jobs']} jobs): mean / p99 (h) | {p['mean']:.2f} / {p['p99']:.2f}"
            f" | {f['mean']:.2f} / {f['p99']:.2f}"
            f" | {fmt(ratios['mean_wait_ratio'][name])} / {fmt(ratios['p99_wait_ratio'][name])} |"
        )
    lines += [
        f"| preemptions (not acknowledged) | {policy['preemptions']} ({policy['unacknowledged_preemptions']})"
        f" | {fifo['preemptions']} | |",
        f"| steps lost (GPU-hours) | {policy['steps_lost']:,} ({policy['gpu_hours_lost']:.1f})"
        f" | {fifo['steps_lost']:,} | |",
        f"| largest queue | {policy['max_pending']:,} | {fifo['max_pending']:,} | |",
        "",
        "Decision time per event (one `schedule` call):",
        "",
        "| | events | mean ms | p50 ms | p99 ms | max ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label, result in (("Policy", policy), ("FIFO", fifo)):
        d = result["decision_ms"]
        lines.append(
            f"| {label} | {d['events']:,} | {d['mean']:.3f} | {d['p50']:.3f} | {d['p99']:.3f}"
            f" | {d['max']:.2f} |"
        )
    lines += [
        "",
        f"Invariants held in both runs (capacity, no job twice, every job finished;"
        f" {policy['invariant_checks']} full accounting checks in the policy run).",
        "",
    ]
    return "\n".join(lines)


def print_result(name: str, result: dict) -> None:
    d = result["decision_ms"]
    waits = ", ".join(f"{level} {w['mean']:.2f}/{w['p99']:.2f} h" for level, w in result["wait_h"].items())
    print(
        f"{name:6s} makespan {result['makespan_h']:.1f} h, GPU utilisation {result['gpu_utilisation']:.1%}"
        f" (goodput {result['gpu_goodput']:.1%}); wait mean/p99 {waits}; preemptions {result['preemptions']}"
        f" ({result['unacknowledged_preemptions']} not acknowledged, {result['steps_lost']:,} steps lost);"
        f" decision ms mean {d['mean']:.3f} p50 {d['p50']:.3f} p99 {d['p99']:.3f} max {d['max']:.2f}"
        f" over {d['events']:,} events; {result['wall_s']:.1f} s",
        flush=True,
    )
