"""Following queued jobs to their end (`submit --wait`): each job's history as it happens, its
progress (a live panel on a terminal, plain lines elsewhere) and a result line, read from the
service over HTTP or as an actor."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

from core.jobs import TERMINAL_VALUES
from core.records import eval_fields, is_eval, is_train
from core.run_folder import checkpoint_step
from orchestrator.errors import UsageError


class ActorReader:
    """A job's view and metrics from the service actor (the CLI joined the cluster)."""

    def __init__(self, service):
        self.service = service

    def status(self, job_id: str) -> dict:
        from orchestrator import client

        return client.call(self.service.status, job_id)

    def metrics_since(self, job_id: str, since_step: int) -> list[dict]:
        from orchestrator import client

        return client.call(self.service.metrics_since, job_id, since_step)


class HttpReader:
    """The same from the service's HTTP API, waiting out a restart of the service for a minute."""

    def __init__(self, page: str, patience_s: float = 60.0):
        self.page, self.patience_s = page, patience_s

    def status(self, job_id: str) -> dict:
        from orchestrator import client

        return self._retry(client.api_job, job_id) or {"id": job_id, "state": "unknown", "history": []}

    def metrics_since(self, job_id: str, since_step: int) -> list[dict]:
        from orchestrator import client

        return self._retry(client.api_metrics_since, job_id, since_step)

    def _retry(self, read, *args):
        from orchestrator import client

        deadline = time.monotonic() + self.patience_s
        while True:
            try:
                return read(self.page, *args)
            except client.Unreachable as err:
                if time.monotonic() > deadline:
                    raise UsageError(f"the orchestrator service does not answer ({err})") from None
                time.sleep(1.0)


def follow_queued(
    reader, job_ids: list[str], poll_s: float = 1.0, summary_path: str | None = None, interrupt=None
) -> int:
    """Show each job's history as it happens and its progress (a live panel on a terminal,
    plain lines elsewhere) until all have ended, then each job's result; exit 0 only if all
    succeeded. `summary_path` receives the final summary (one job) or a list of them;
    `interrupt`, called at every turn, may raise to stop following."""
    from orchestrator.monitoring.terminal import Display

    seen = {job_id: 0 for job_id in job_ids}
    last_step = {job_id: -1 for job_id in job_ids}
    evals_shown = {job_id: set() for job_id in job_ids}  # steps whose evaluation was shown
    checkpoint = {job_id: None for job_id in job_ids}
    views: dict[str, dict] = {}
    with Display() as display:
        while True:
            for job_id in job_ids:
                job = views[job_id] = reader.status(job_id)
                for event in job["history"][seen[job_id] :]:
                    display.event(job_id, describe_event(event))
                seen[job_id] = len(job["history"])
                total, waiting = job.get("total_steps"), job["state"] in ("queued", "preempted")
                display.update(
                    job_id,
                    state=job["state"],
                    total=total,
                    eta_s=job.get("remaining_s"),
                    note=job.get("note") if waiting else None,
                )
                if job.get("last_checkpoint") not in (None, checkpoint[job_id]):
                    checkpoint[job_id] = uri = job["last_checkpoint"]
                    display.event(job_id, f"checkpoint at step {checkpoint_step(uri)}: {uri}")
                if job["state"] in ("queued", "preempted", "admitted"):
                    continue  # (an ended job is read once more: a short one may end between looks)
                # from the last step shown: an evaluation of that step may come in a later batch
                records = reader.metrics_since(job_id, last_step[job_id] - 1)
                for r in records:
                    if is_eval(r) and r["step"] not in evals_shown[job_id]:
                        evals_shown[job_id].add(r["step"])
                        display.event(job_id, f"eval at step {r['step']}: {', '.join(eval_parts(r))}")
                train = [r for r in records if is_train(r)]
                if train:
                    r = train[-1]
                    last_step[job_id] = r["step"]
                    loss = math.nan if r["loss"] is None else r["loss"]  # the page's JSON has no NaN
                    tokens = r.get("tokens_per_s")
                    rate, unit = (tokens, "tokens/s") if tokens else (r.get("samples_per_s"), "samples/s")
                    display.progress(
                        job_id,
                        f"step {r['step']}{f'/{total}' if total else ''}  loss {loss:.4f}  "
                        f"{rate or 0:,.0f} {unit}",
                        step=r["step"],
                        loss=loss,
                        rate=rate,
                        rate_unit=unit,
                    )
            if all(view["state"] in TERMINAL_VALUES for view in views.values()):
                break
            time.sleep(poll_s)
            if interrupt is not None:
                interrupt()
    for job_id in job_ids:
        print(result_line(views[job_id]), flush=True)
    if summary_path:
        summaries = [dict(views[j].get("summary") or {}, job=j, state=views[j]["state"]) for j in job_ids]
        content = summaries[0] if len(summaries) == 1 else summaries
        try:
            Path(summary_path).parent.mkdir(parents=True, exist_ok=True)
            Path(summary_path).write_text(json.dumps(content, indent=2))
        except OSError as err:  # the job's own result is safe in the queue and in storage
            reason = err.strerror or err
            print(f"error: --summary {summary_path}: cannot write it ({reason})", file=sys.stderr)
            return 2
    failed = [j for j in job_ids if views[j]["state"] != "succeeded"]
    for job_id in failed:
        print(f"error: job {job_id} {views[job_id]['state']}", file=sys.stderr)
    return 1 if failed else 0


def describe_event(event: dict) -> str:
    if event["event"] == "resuming":
        return f"resuming run {event['run']} from step {event['step']} (its newest complete checkpoint)"
    detail = ", ".join(f"{k} {v}" for k, v in event.items() if k not in ("time", "event"))
    return event["event"] + (f" ({detail})" if detail else "")


def eval_parts(metrics: dict) -> list[str]:
    """['loss 0.3120', 'accuracy 90.50%'] for an eval record or the summary's eval section."""
    return [
        f"{name} {value:.2%}" if name.endswith("accuracy") else f"{name} {value:.4f}"
        for name, value in eval_fields(metrics).items()
    ]


def result_line(view: dict) -> str:
    """One line per finished job: its state, steps, eval metrics, throughput and last checkpoint."""
    summary = view.get("summary") or {}
    parts = [f"[{view['id']}] {view['state']}"]
    if summary.get("steps") is not None:
        parts.append(f"{summary['steps']} steps")
    if summary.get("final_train_loss") is not None:
        parts.append(f"train loss {summary['final_train_loss']:.4f}")
    # the last evaluation, labelled apart from the training loss
    parts += [f"eval {part}" for part in eval_parts(summary.get("eval") or {})]
    if summary.get("samples_per_s"):
        parts.append(f"{summary['samples_per_s']:,.0f} samples/s")
    if summary.get("elapsed_s"):
        parts.append(f"{summary['elapsed_s']:.0f} s training")
    checkpoint = summary.get("checkpoint") or view.get("last_checkpoint")
    if checkpoint:
        parts.append(f"checkpoint {checkpoint}")
    return ", ".join(parts[:1]) + (": " + ", ".join(parts[1:]) if len(parts) > 1 else "")
