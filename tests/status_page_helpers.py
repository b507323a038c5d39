"""Helpers of the status page's tests (tests/test_status_page*.py): where screenshots go, the
hostile strings, the queues panel's data, the fake service's job views and time ledgers, and
HTTP requests to the page's server."""

from __future__ import annotations

import json
import math
import os
import random
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from core.ledger import Ledger

ROOT = Path(__file__).resolve().parents[1]
# the README's pictures are refreshed only on request (ORCHESTRATOR_SCREENSHOT_DIR=docs/images):
# a test run must not rewrite a tracked file. docs/images/goodput.png comes from
# tests/test_status_page_goodput.py (`-k where_each_jobs_time_went`), status-page.png from
# tests/test_monitoring.py's real service.
SCREENSHOTS = Path(os.environ.get("ORCHESTRATOR_SCREENSHOT_DIR") or tempfile.mkdtemp())
SCREENSHOT = SCREENSHOTS / "status-page.png"
GOODPUT_SCREENSHOT = SCREENSHOTS / "goodput.png"
ARTIFACTS = ROOT / "tests" / "_artifacts"
DASHBOARD = "http://127.0.0.1:8265"
HOSTILE_NAME = "<img src=x onerror=alert(1)>"
HOSTILE_NOTE = "<script>window.__pwned = true</script> waiting for <b>8 GPU</b>"
HOSTILE_URI = 's3://bucket/"><img src=x onerror=alert(2)>/checkpoint_000200'
HOSTILE_QUEUE = "<img src=x onerror=alert(6)>"


def _use(cohort, used, nominal, borrowed, lent, order="fifo") -> dict:
    """One queue's entry in `queues_view()["use"]`."""
    return {
        "cohort": cohort,
        "used": used,
        "nominal": nominal,
        "borrowed": borrowed,
        "lent": lent,
        "order": order,
    }


# /api/info's "queues" as the service's `queues_view()` builds it (checked against CohortBook):
# the applied configuration, defaults left out, and each queue's use now. research runs 8 GPU
# on a nominal 4 and borrows 4 of the cohort's unused quota; vision and nlp lend it in
# proportion to what each leaves unused (7 and 4 of 11). batch is in no cohort: a hard cap.
QUEUES = {
    "config": {
        "cohorts": ["lab"],
        "queues": {
            "research": {
                "cohort": "lab",
                "nominal": {"GPU": 4.0},
                "borrowing_limit": {"GPU": 8.0},
                "order": "las",
            },
            "vision": {"cohort": "lab", "nominal": {"GPU": 12.0}},
            "nlp": {"cohort": "lab", "nominal": {"GPU": 4.0}},
            "batch": {"nominal": {"CPU": 64.0, "GPU": 2.0}},
            "scratch": {"order": "las"},
        },
    },
    "use": {
        "research": _use("lab", {"GPU": 8.0}, {"GPU": 4.0}, {"GPU": 4.0}, {"GPU": 0.0}, "las"),
        "vision": _use("lab", {"GPU": 5.0}, {"GPU": 12.0}, {"GPU": 0.0}, {"GPU": 7 * 4 / 11}),
        "nlp": _use("lab", {"GPU": 0.0}, {"GPU": 4.0}, {"GPU": 0.0}, {"GPU": 4 * 4 / 11}),
        "batch": _use(None, {"CPU": 8.0, "GPU": 0.0}, {"CPU": 64.0, "GPU": 2.0}, {}, {}),
        "scratch": _use(None, {}, {}, {}, {}, "las"),
    },
}


# --- the fake service's jobs (tests/status_page_fake.py) ------------------------------------------


def _loss(step: int, rng: random.Random) -> float:
    """A language model's training loss: fast drop, long tail, a little noise."""
    base = 3.05 + 7.9 * math.exp(-step / 900) + 0.55 * math.exp(-step / 9000)
    return base * (1 + rng.gauss(0, 0.012))


def _job(job_id: str, name: str, state: str, **fields) -> dict:
    view = {
        "id": job_id,
        "name": name,
        "run": name,
        "state": state,
        "priority": 0,
        "queue": "default",
        "preemptible": False,
        "workers": 1,
        "per_worker": {"CPU": 8, "GPU": 1},
        "submitted_at": time.time() - 3600,
        "admitted_at": None,
        "started_at": None,
        "finished_at": None,
        "attempt": 0,
        "preemptions": 0,
        "steps_lost": 0,
        "step": 0,
        "total_steps": None,
        "step_time_s": None,
        "remaining_s": None,
        "last_checkpoint": None,
        "note": None,
        "reason": None,
        "submission_id": None,
        "submission": None,
        "launched_by": "service",
        "placement": {},
        "stop_requested": None,
        "sweep": None,
        "sweep_params": {},
        "summary": None,
        "history": [],
        "stragglers": [],  # [{rank, node, ip, ratio}] while it runs
        "hung": False,  # judged hung, until it steps again
        "avoid_nodes": [],  # stragglers' nodes it was restarted away from
    }
    view.update(fields)
    return view


def _trained(
    ledger: Ledger,
    steps: range,
    start: float,
    end: float,
    eval_every: int = 0,
    eval_s: float = 0.0,
    save_every: int = 0,
    save_s: float = 0.0,
    total_steps: int | None = None,
) -> None:
    """Feed `ledger` what a driver reports of an attempt that trains from `start` to about `end`:
    a train record every `steps.step` steps, an evaluation of `eval_s` every `eval_every` steps,
    a checkpoint every `save_every` steps whose save blocks training for `save_s` (the next
    record says so)."""
    evals = sum(1 for step in steps if eval_every and step % eval_every == 0)
    saves = sum(1 for step in steps if save_every and step % save_every == 0)
    step_s = (end - start - evals * eval_s - saves * save_s) / (len(steps) * steps.step)
    t, saving = start, 0.0
    for step in steps:
        t += steps.step * step_s + saving
        ledger.train(step, t, step_s=step_s, checkpoint_s=saving or None, total_steps=total_steps)
        saving = 0.0
        if save_every and step % save_every == 0:
            ledger.checkpointed(step)
            saving = save_s
        if eval_every and step % eval_every == 0:
            t += eval_s
            ledger.evaluated(t, duration_s=eval_s)


def fetch(url: str) -> tuple[int, dict, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def fetch_json(url: str):
    status, headers, body = fetch(url)
    assert headers["Content-Type"].startswith("application/json"), headers
    return status, json.loads(body)


def by_state(views) -> dict[str, int]:
    counts: dict[str, int] = {}
    for view in views:
        counts[view["state"]] = counts.get(view["state"], 0) + 1
    return counts
