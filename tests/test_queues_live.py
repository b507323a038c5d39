"""The queue configuration on the live service (tests/conftest.py's 3-node cluster, one `slot`
per node): least attained service (the default order, `las-share`, of a queue that names
none) preempts a long job for a short one of its queue, a lender
takes its nominal quota back from a borrower, and a bad file changes nothing. Every
preemption is the zero-loss one: the victim checkpoints, goes back to the queue and resumes
from exactly that step. Quotas are in the cluster's resource names, so the files use `slot`;
jobs without GPUs attain worker-seconds.

The service is shared by the whole session: every test leaves it with no configuration.
"""

import json
import time
from pathlib import Path

import pytest

from tests.test_service import events, train_steps, when


@pytest.fixture
def queues(service, tmp_path):
    """`apply(yaml_text)`: `orchestrator queues apply` of that file; cleared after the test."""

    def apply(text: str, name: str = "queues.yaml"):
        path = tmp_path / name
        path.write_text(text)
        return service.cli("queues", "apply", str(path))

    yield apply
    cleared = service.cli("queues", "apply", "--clear")
    assert cleared.returncode == 0, cleared.stdout + cleared.stderr
    assert not (service.store / "queues.json").exists()


def show(service) -> str:
    result = service.cli("queues", "show")
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def preempted_once_without_loss(job: dict, victim_for: str) -> dict:
    assert job["preemptions"] == 1 and job["steps_lost"] == 0, job
    asked = next(e for e in job["history"] if e["event"] == "stop-requested")
    assert asked["why"] == "preempt" and asked["for"] == victim_for, asked
    preempted = next(e for e in job["history"] if e["event"] == "preempted")
    assert preempted["acknowledged"] is True and preempted["steps_lost"] == 0
    assert 0 < preempted["step"] < job["total_steps"]  # it stopped mid-run
    return preempted


@pytest.mark.timeout(600)
def test_las_preempts_a_long_job_for_a_short_one_and_neither_loses_a_step(service, queues):
    # a queue that names no order has the default, las-share (with no queue file too; here the
    # file only shortens the levels and the waits): thresholds in worker-seconds, a 2-worker job
    # passes 10 after 5 s of its attempt; the short job may preempt at once (las-share's head
    # otherwise waits an hour first)
    applied = queues("queues:\n  lab: {}\nlas: {thresholds_gpu_s: [10], min_run_s: 3, preempt_after_s: 0}\n")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "queue lab: no quota" in show(service) and "order: las-share" in show(service)
    # neither is preemptible: a LAS order (the default one included) is the queue's consent
    name = service.paced("las-long")  # still training when the short job comes
    long = service.submit("scheduling.queue=lab", name=name, steps=600)
    service.wait(long, lambda j: j["state"] == "running" and j["step"] >= 50, what="progress")
    submitted = time.time()
    short = service.submit("scheduling.queue=lab", name="las-short", steps=30)
    s = service.done(short)
    service.release(name)
    lo = service.done(long)
    preempted_once_without_loss(lo, victim_for=short)
    assert when(s, "admitted") >= when(lo, "preempted")  # it waited for the checkpoint only
    assert when(lo, "admitted", 1) >= when(s, "succeeded")  # level 1 does not preempt level 0
    assert events(s).count("admitted") == 1
    assert lo["step"] == 600 and lo["attempt"] == 2 and lo["user"] == s["user"] != "unknown"
    # its service over both attempts, from admission to each attempt's end, x 2 workers
    held = (when(lo, "preempted") - when(lo, "admitted")) + (when(lo, "succeeded") - when(lo, "admitted", 1))
    assert lo["attained_s"] == pytest.approx(2 * held, rel=0.01)
    assert train_steps(service.runs / "las-long") == list(range(5, 601, 5))  # each step once
    assert train_steps(service.runs / "las-short") == list(range(5, 31, 5))
    print(
        f"LAS: short job admitted {when(s, 'admitted') - submitted:.1f} s after its submission "
        f"(long job stopped {when(lo, 'preempted') - when(lo, 'stop-requested'):.1f} s after the request), "
        f"done {when(s, 'succeeded') - submitted:.1f} s after it; long job done "
        f"{when(lo, 'succeeded') - when(lo, 'queued'):.1f} s after its submission"
    )


@pytest.mark.timeout(600)
def test_a_lender_reclaims_its_nominal_quota_from_a_borrower_which_resumes_later(service, queues):
    config = (
        "cohorts: [lab]\n"
        "queues:\n"
        "  lender: {cohort: lab, nominal: {slot: 2}}\n"
        "  borrower: {cohort: lab, nominal: {slot: 1}}\n"
    )
    assert queues(config).returncode == 0
    one = ("resources.num_workers=1", "scheduling.queue=borrower", "scheduling.preemptible=true")
    # the first borrower trains (paced: it leaves the CPUs to the others) until the test stops
    # it: it must hold its slot through the reclaim; the second is paced until the lender's job
    # has run
    first = service.submit(*one, name=service.paced("borrow-1", 0.05), steps=10**6)
    service.wait(first, lambda j: j["state"] == "running", what="running")
    name = service.paced("borrow-2")
    second = service.submit(*one, name=name, steps=600)  # beyond its nominal quota: borrows
    service.wait(second, lambda j: j["state"] == "running" and j["step"] >= 50, what="progress")
    lines = show(service)
    assert "queue borrower (cohort lab): 2/1 slot; borrows 1 slot" in lines, lines
    assert "queue lender (cohort lab): 0/2 slot; lends 1 slot" in lines, lines
    queue = service.cli("queue").stdout
    assert queue.splitlines()[1].startswith("queue borrower (cohort lab): 2/1 slot"), queue
    submitted = time.time()
    lender = service.submit("scheduling.queue=lender", name="lend-1", steps=30)  # 2 slots: its nominal
    done = service.done(lender)
    service.release(name)
    b2 = service.done(second)
    b1 = service.job(first)
    assert service.cli("stop", first, "--now").returncode == 0
    service.wait(first, lambda j: j["state"] == "stopped", timeout=60, what="stopped")  # its slot free
    # the most recently started borrower gave the slot back; the other kept the borrower's nominal
    preempted_once_without_loss(b2, victim_for=lender)
    assert b1["state"] == "running" and b1["preemptions"] == 0 and events(b1).count("admitted") == 1
    assert when(done, "admitted") >= when(b2, "preempted")
    # it came back only into the slot that came free when the lender's job ended
    assert when(b2, "admitted", 1) >= when(done, "succeeded")
    assert b2["step"] == 600 and train_steps(service.runs / "borrow-2") == list(range(5, 601, 5))
    freed = when(done, "succeeded")
    print(
        f"reclaim: lender job admitted {when(done, 'admitted') - submitted:.1f} s after its submission, "
        f"borrower resumed {when(b2, 'admitted', 1) - freed:.1f} s after a slot came free"
    )


@pytest.mark.timeout(300)
def test_a_bad_queue_file_is_refused_with_one_line_and_changes_nothing(service, queues):
    assert queues("queues:\n  lab: {order: las}\n").returncode == 0
    before = show(service)
    stored = json.loads((service.store / "queues.json").read_text())
    bad = queues("queues:\n  lab: {order: lass}\n", name="bad.yaml")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.splitlines() == [
        f"error: {bad.args[-1]}: queues.lab.order: 'lass' is not allowed;"
        " expected 'fifo', 'las' or 'las-share'; did you mean 'las'?"
    ]
    assert show(service) == before
    assert json.loads((service.store / "queues.json").read_text()) == stored
    # `up --queues` on a running service applies the file too; a bad one stops it before anything
    good = bad.args[-1].replace("bad.yaml", "good.yaml")
    Path(good).write_text("cohorts: [lab]\nqueues:\n  lab: {cohort: lab, nominal: {slot: 2}}\n")
    up = service.up_args("--queues")
    assert service.cli(*up, bad.args[-1]).returncode == 2 and show(service) == before
    result = service.cli(*up, good)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "queue lab (cohort lab): 0/2 slot" in show(service)
