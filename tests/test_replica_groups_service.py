"""What the service does for a job of replica groups (`fault_tolerance.replica_groups`) when a
node dies, without Ray: the service's own lifecycle, scheduling pass and ledger over a store in
a temporary folder, on nodes of one `slot` each. A node lost under one group leaves the job
running on the others, the lost group is placed again before any waiting job, and the time
between is the job's degraded time; a node lost under every group requeues the job as before.
The same on a real cluster, with the workers: tests/test_cluster.py."""

from types import SimpleNamespace

import pytest

from core.jobs import JobState
from core.spec import validate
from orchestrator.policy import Node, Policy
from orchestrator.ray.launcher import group_placements, union
from orchestrator.service.cycle import SchedulingCycle
from orchestrator.service.lifecycle import Lifecycle
from orchestrator.service.store import Store
from orchestrator.service.submission import new_record
from tests.test_queues_service import CONFIG

NODES = [Node(name, {"CPU": 2.0, "slot": 1.0}) for name in ("n1", "n2", "n3")]


def spec(groups: int = 2, name: str = "groups"):
    return validate(
        {
            "name": name,
            "model": {"family": "convnet", "preset": "tiny"},
            "data": {"source": "synthetic"},
            "train": {"steps": 100},
            "resources": {"num_workers": 2, "custom_per_worker": {"slot": 1}},
            "parallel": {"strategy": "ddp"},
            "fault_tolerance": {"replica_groups": groups},
        }
    )


@pytest.fixture
def cycle(tmp_path):
    life = Lifecycle(Store(str(tmp_path)), runner=None, config=CONFIG, generation=1)
    cluster = SimpleNamespace(autoscaler=None, probe=lambda address, port: None)
    cycle = SchedulingCycle(life, Policy(NODES), CONFIG, cluster)
    cycle.alive = {n.id for n in NODES}
    return cycle


def running(cycle, job_id: str, placement: dict[str, int], groups: int = 2, now: float = 100.0):
    job = new_record(spec(groups, job_id), job_id, {"user": "ann"}, launched_by="driver")
    cycle.jobs[job.id] = job
    cycle.lifecycle.admit(job, placement, now)
    cycle.lifecycle.mark_running(job, job.attempt)
    return job


def lose(cycle, node: str) -> None:
    """Ray's node table without `node` (the pass's own read of it)."""
    cycle.alive.discard(node)
    cycle.policy.set_nodes([n for n in NODES if n.id in cycle.alive])


def test_a_placement_splits_into_equal_groups_in_the_order_of_the_workers():
    assert group_placements({"b": 1, "a": 1}, 2) == [{"a": 1}, {"b": 1}]
    assert group_placements({"a": 2, "b": 2}, 2) == [{"a": 2}, {"b": 2}]
    assert group_placements({"a": 3, "b": 1}, 2) == [{"a": 2}, {"a": 1, "b": 1}]  # a shares two
    assert union([{"a": 2}, {}, {"a": 1, "b": 1}]) == {"a": 3, "b": 1}


def test_a_node_lost_under_one_group_leaves_the_job_running_and_the_group_placed_again(cycle):
    job = running(cycle, "groups-1", {"n1": 1, "n2": 1})
    assert job.group_placements == [{"n1": 1}, {"n2": 1}]
    waiting = new_record(spec(1, "waiting"), "waiting", {"user": "bob"}, launched_by="driver")
    cycle.jobs[waiting.id] = waiting

    lose(cycle, "n2")
    cycle.reconcile(now=200.0)
    assert job.state is JobState.RUNNING and job.attempt == 1  # no requeue, no new attempt
    assert job.group_placements == [{"n1": 1}, {}] and job.placement == {"n1": 1}
    lost = [e for e in job.history if e["event"] == "group-lost"]
    assert [(e["groups"], e["nodes"]) for e in lost] == [([1], ["n2"])]
    assert job.ledger.degraded_since == 200.0

    cycle.schedule(now=201.0)  # n3's slot: the lost group's before the waiting job's
    assert job.group_placements == [{"n1": 1}, {"n3": 1}] and job.placement == {"n1": 1, "n3": 1}
    assert waiting.state is JobState.QUEUED  # the 2-worker job finds no room left
    assert [e["nodes"] for e in job.history if e["event"] == "group-placed"] == [["n3"]]

    # the attempt's account: the new group trains, but has not healed from its peer yet
    view = {
        "0": {"state": "training", "started_at": 101.0, "nodes": ["n1"]},
        "1": {"state": "training", "started_at": 202.0, "joined_at": 205.0, "nodes": ["n3"]},
    }
    stale = {**view, "1": {"state": "training", "started_at": 101.0, "nodes": ["n2"]}}
    cycle.lifecycle.groups_reported(job, stale, now=203.0)  # it has not seen the lost group end yet
    assert job.ledger.degraded_since == 200.0
    cycle.lifecycle.groups_reported(job, view, now=206.0)
    assert job.ledger.degraded_since == 200.0
    view["1"].update(healed_at=207.0, healed_step=40)
    cycle.lifecycle.groups_reported(job, view, now=208.0)
    assert job.ledger.degraded_since is None and job.ledger.degraded_s == pytest.approx(8.0)
    assert [e["degraded_s"] for e in job.history if e["event"] == "groups-whole"] == [8.0]
    assert job.ledger.view(300.0)["degraded_s"] == pytest.approx(8.0)


def test_a_lost_group_waits_for_room_and_the_waiting_jobs_do_not_take_it(cycle):
    job = running(cycle, "groups-2", {"n1": 1, "n2": 1})
    other = running(cycle, "other", {"n3": 1}, groups=1)
    other.spec.resources.num_workers = other.workers = 1
    lose(cycle, "n1")
    cycle.reconcile(now=200.0)
    cycle.schedule(now=201.0)
    assert job.group_placements == [{}, {"n2": 1}]  # no room: it waits
    cycle.lifecycle.finish(other, JobState.SUCCEEDED, now=300.0)  # n3 frees
    cycle.schedule(now=301.0)
    assert job.group_placements == [{"n3": 1}, {"n2": 1}]


def test_a_node_lost_under_every_group_requeues_the_job_as_a_job_of_one_group(cycle):
    job = running(cycle, "groups-3", {"n1": 2}, groups=2)  # both groups on one node
    assert job.group_placements == [{"n1": 1}, {"n1": 1}]
    lose(cycle, "n1")
    cycle.reconcile(now=200.0)
    assert job.state is JobState.QUEUED and job.group_placements == []
    assert [e["event"] for e in job.history if e["event"] in ("node-lost", "group-lost")] == ["node-lost"]
    assert job.ledger.degraded_since is None


def test_a_job_of_one_group_is_requeued_by_a_node_loss_as_before(cycle):
    job = running(cycle, "single", {"n1": 1, "n2": 1}, groups=1)
    assert job.group_placements == []
    lose(cycle, "n2")
    cycle.reconcile(now=200.0)
    assert job.state is JobState.QUEUED
