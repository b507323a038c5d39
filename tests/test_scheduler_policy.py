"""The orchestrator's scheduling policy: one pass (`Policy.schedule`): priorities, backfill,
quotas, preemption; and no Ray in the policy. The building blocks are tested in
test_scheduler_admission.py and test_scheduler_victims.py, the properties on a simulated
cluster in test_scheduler_simulation.py.

Resource names are arbitrary: "accel" stands in for GPUs, as a custom Ray resource would.
"""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import pytest

from bench.fifo import FifoPolicy
from orchestrator.policy import Policy
from tests.scheduler_helpers import FIFO, admitted, job, nodes_of, running

ROOT = Path(__file__).resolve().parents[1]


# -- the policy -----------------------------------------------------------------------------------


def test_two_jobs_each_over_half_the_cluster_run_one_after_the_other():
    policy = Policy(nodes_of(4, 4))
    first, second = job("first", workers=5, submitted_at=0), job("second", workers=5, submitted_at=1)
    decision = policy.schedule(0, [first, second], [])
    assert decision.admit == [("first", {"n0": 4, "n1": 1})]
    assert decision.head == "second" and "second" in decision.notes
    # while the first runs nothing of the second starts; once it ends, the second starts whole
    busy = [running("first", {"n0": 4, "n1": 1})]
    assert policy.schedule(5, [second], busy).admit == []
    assert policy.schedule(9, [second], []).admit == [("second", {"n0": 4, "n1": 1})]


def test_higher_priority_starts_first():
    policy = Policy(nodes_of(2))
    decision = policy.schedule(0, [job("low", workers=2, priority=0), job("high", workers=2, priority=1)], [])
    assert admitted(decision) == ["high"]


def test_fifo_within_a_priority_level():
    policy = Policy(nodes_of(2), queues=FIFO)
    jobs = [job("second", workers=2, submitted_at=2), job("first", workers=2, submitted_at=1)]
    assert admitted(policy.schedule(5, jobs, [])) == ["first"]


def test_backfill_that_ends_before_the_head_starts():
    policy = Policy(nodes_of(4))
    busy = [running("r", {"n0": 2}, est_end=100)]
    head = job("head", workers=4, priority=1)  # waits for "r", expected at t=100
    long = job("long", workers=2, est=500, submitted_at=1)  # would still hold 2 at t=100
    short = job("short", workers=2, est=50, submitted_at=2)
    decision = policy.schedule(0, [head, long, short], busy)
    assert decision.head == "head" and decision.head_start == 100
    assert admitted(decision) == ["short"]
    assert "delay" in decision.notes["long"]


def test_backfill_beside_the_head_reservation_may_run_long():
    policy = Policy(nodes_of(4, 4))
    busy = [running("r", {"n0": 4}, est_end=100)]
    head = job("head", workers=6, priority=1)  # at t=100: all of n0 and 2 of n1
    beside = job("beside", workers=2, est=10_000, submitted_at=1)  # the other 2 of n1
    greedy = job("greedy", workers=3, est=10_000, submitted_at=2)
    decision = policy.schedule(0, [head, greedy, beside], busy)
    assert decision.admit == [("beside", {"n1": 2})]
    # that start leaves the head's reservation intact: at t=100 it starts as promised
    after = policy.schedule(100, [head, greedy], [running("beside", {"n1": 2}, est_end=10_000)])
    assert admitted(after) == ["head"]


def test_unknown_runtime_jobs_backfill_only_when_preemptible_by_the_head():
    policy = Policy(nodes_of(4), queues=FIFO)  # (LAS lets a job of the head's level pass it)
    busy = [running("r", {"n0": 2}, est_end=100)]
    head = job("head", workers=4, priority=1)
    blind = job("blind", workers=1, submitted_at=1)  # no estimate, not preemptible
    assert admitted(policy.schedule(0, [head, blind], busy)) == []
    spot = job("spot", workers=1, submitted_at=2, preemptible=True)
    decision = policy.schedule(0, [head, blind, spot], busy)
    assert admitted(decision) == ["spot"]
    assert "no runtime estimate" in decision.notes["blind"]
    # a preemptible job of the head's own priority cannot be taken back by it: no backfill
    same_level = job("same", workers=1, priority=1, submitted_at=3, preemptible=True)
    assert admitted(policy.schedule(0, [head, same_level], busy)) == []


def test_backfill_off_means_nothing_passes_the_head():
    policy = Policy(nodes_of(4), backfill=False)
    busy = [running("r", {"n0": 2}, est_end=100)]
    jobs = [job("head", workers=4, priority=1), job("short", est=1, submitted_at=1)]
    assert admitted(policy.schedule(0, jobs, busy)) == []


def test_backfill_window_bounds_how_far_the_pass_looks():
    policy = Policy(nodes_of(4), backfill_window=2)
    busy = [running("r", {"n0": 2}, est_end=100)]
    jobs = [job("head", workers=4, priority=1)] + [
        job(f"w{i}", workers=3, est=1, submitted_at=i) for i in range(3)
    ]
    jobs.append(job("fits", workers=1, est=1, submitted_at=10))
    decision = policy.schedule(0, jobs, busy)
    assert admitted(decision) == []
    assert "fits" not in decision.notes and "w1" in decision.notes


def test_quota_limits_a_queue_and_does_not_hold_up_others():
    policy = Policy(nodes_of(8), quotas={"research": {"accel": 3}}, queues=FIFO)  # a FIFO queue waits
    busy = [running("r", {"n0": 2}, queue="research")]
    jobs = [
        job("r-big", workers=2, queue="research", submitted_at=1),
        job("r-small", workers=1, queue="research", submitted_at=2),  # fits the quota, waits its turn
        job("other", workers=4, submitted_at=3),
    ]
    decision = policy.schedule(0, jobs, busy)
    assert admitted(decision) == ["other"]
    assert "quota of queue 'research' reached" in decision.notes["r-big"]
    assert "behind job r-big" in decision.notes["r-small"]


def test_the_head_keeps_its_share_of_its_queue_quota():
    policy = Policy(nodes_of(4), quotas={"q": {"accel": 3}}, queues=FIFO)  # (a LAS head keeps none)
    busy = [running("r", {"n0": 2}, queue="other", est_end=100)]
    head = job("head", workers=3, queue="q", priority=1)  # fits its quota, waits for resources
    same_queue = job("mine", workers=1, queue="q", est=10_000, submitted_at=1)
    other_queue = job("theirs", workers=1, queue="other", est=10_000, submitted_at=2)
    decision = policy.schedule(0, [head, same_queue, other_queue], busy)
    # both fit beside the head's placement, but "mine" would leave the head without quota
    assert admitted(decision) == ["theirs"]
    assert "share kept for job head" in decision.notes["mine"]


def test_preemption_stops_lower_priority_preemptible_jobs_for_the_head():
    policy = Policy(nodes_of(4))
    busy = [
        running("old", {"n0": 2}, started_at=1, preemptible=True),
        running("new", {"n0": 2}, started_at=2, preemptible=True),
    ]
    decision = policy.schedule(10, [job("urgent", workers=2, priority=1)], busy)
    assert decision.preempt == ["new"] and decision.reserved_for == "urgent"
    assert decision.admit == []
    assert "preempting 1" in decision.notes["urgent"]


def test_no_preemption_when_switched_off():
    policy = Policy(nodes_of(4), preemption=False)
    busy = [running("p", {"n0": 4}, preemptible=True)]
    decision = policy.schedule(10, [job("urgent", workers=2, priority=1)], busy)
    assert decision.preempt == [] and decision.reserved_for is None


def test_stopping_victims_are_not_chosen_twice_and_their_resources_stay_promised():
    policy = Policy(nodes_of(4))
    busy = [
        running("victim", {"n0": 2}, preemptible=True, stopping=True),
        running("spare", {"n0": 2}, preemptible=True),
    ]
    urgent = job("urgent", workers=2, priority=2)
    filler = job("filler", workers=2, priority=1, est=1, submitted_at=1)
    decision = policy.schedule(10, [urgent, filler], busy)
    assert decision.preempt == []  # no second victim while the first is stopping
    assert decision.reserved_for == "urgent"
    assert "waiting for 1 stopping job" in decision.notes["urgent"]
    assert decision.admit == []  # the filler may not take what is promised to "urgent"
    assert "promised" in decision.notes["filler"]


def test_fifo_policy_stops_at_the_first_job_that_does_not_fit():
    fifo = FifoPolicy(nodes_of(4))
    jobs = [
        job("a", workers=2, submitted_at=0, priority=0),
        job("b", workers=4, submitted_at=1, priority=9),
        job("c", workers=1, submitted_at=2, est=1),
    ]
    decision = fifo.schedule(0, jobs, [])
    assert admitted(decision) == ["a"] and "b" in decision.notes


def test_schedule_is_pure():
    policy = Policy(nodes_of(4, 4), quotas={"q": {"accel": 5}})
    pending = [
        job(
            f"j{i}",
            workers=1 + i % 3,
            priority=i % 2,
            queue="q" if i % 2 else "default",
            est=i or None,
            submitted_at=i,
            preemptible=bool(i % 3),
        )
        for i in range(8)
    ]
    busy = [running("r", {"n0": 3}, est_end=50, preemptible=True), running("s", {"n1": 2}, priority=1)]
    before = copy.deepcopy((pending, busy))
    first = policy.schedule(7, pending, busy)
    assert (pending, busy) == before  # inputs untouched
    assert policy.schedule(7, list(reversed(pending)), list(reversed(busy))) == first


# -- no Ray in the policy -------------------------------------------------------------------------

PURE_MODULES = [
    ROOT / "orchestrator" / "policy" / name
    for name in ("__init__.py", "types.py", "queue.py", "admission.py", "preemption.py", "policy.py")
] + [ROOT / "bench" / "scheduler_sim.py"]


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
            "__import__",
            "import_module",
        ):
            names.update(
                arg.value for arg in node.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
            )
    return names


@pytest.mark.parametrize("path", PURE_MODULES, ids=lambda p: p.name)
def test_the_policy_never_imports_ray(path):
    imported = imported_modules(path)
    assert imported, f"{path} parsed to no imports at all"
    assert not [name for name in imported if name == "ray" or name.startswith("ray.")]


def test_the_import_check_sees_ray(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    import ray.train\n    return __import__('ray')\n")
    assert {"ray.train", "ray"} <= imported_modules(sample)
