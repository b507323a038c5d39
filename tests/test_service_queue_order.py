"""`orchestrator queue` and the status page's queue list the waiting jobs in the order the
policy admits them: the service asks the policy (`Policy.order`, the order its own pass walks),
so the list and the admissions cannot disagree. No Ray: a service's table, cycle and views
over a store in a temporary folder."""

import time
from types import SimpleNamespace

import pytest

from core.queues import validate_queue_config
from orchestrator.monitoring.queue_query import QueueQuery
from orchestrator.policy import Node, Policy
from orchestrator.service.cycle import SchedulingCycle, allocation, request
from orchestrator.service.lifecycle import Lifecycle
from orchestrator.service.store import Store
from orchestrator.service.submission import new_record
from orchestrator.service.views import Views
from tests.test_queues_service import CONFIG, SPEC  # a 2-worker job; the lifecycle's settings

HOUR = 3600.0
NODE = Node("n1", {"CPU": 1000.0, "GPU": 1000.0})  # room for every job: a pass admits them all


def service_with(tmp_path, queues=None) -> tuple[Views, SchedulingCycle]:
    life = Lifecycle(Store(str(tmp_path)), runner=None, config=CONFIG, generation=1)
    cluster = SimpleNamespace(autoscaler=None, probe=lambda address, port: None)
    cycle = SchedulingCycle(life, Policy([NODE], queues=queues), CONFIG, cluster)
    watchdog = SimpleNamespace(stragglers=lambda job_id: [], watches={})
    return Views(life.jobs, {}, watchdog, cycle), cycle


def add(cycle: SchedulingCycle, job_id: str, user: str, submitted: float, gpu_hours: float, priority=0):
    job = new_record(SPEC, job_id, {"user": user, "priority": priority}, launched_by="driver")
    job.submitted_at, job.attained_s = submitted, gpu_hours * HOUR
    cycle.jobs[job.id] = job
    return job


def fill(cycle: SchedulingCycle, now: float) -> None:
    """Ada runs a job with 50 GPU-hours behind it; five wait: their submission order is not
    the LAS order (levels, then each user's service in the queue, then age)."""
    running = add(cycle, "ada-running", "ada", now - 3 * HOUR, gpu_hours=50)
    cycle.lifecycle.admit(running, {NODE.id: 2}, now=now - 60)
    add(cycle, "bob-long", "bob", now - 2 * HOUR, gpu_hours=20)  # level 2: after the shorter ones
    add(cycle, "cid-some", "cid", now - HOUR, gpu_hours=2)  # level 1
    add(cycle, "ada-new", "ada", now - 30, gpu_hours=0)  # level 0, ada has 50 GPU-hours in the queue
    add(cycle, "bob-new", "bob", now - 20, gpu_hours=0)  # level 0, bob 20: ahead of ada's
    add(cycle, "urgent", "dan", now - 10, gpu_hours=30, priority=5)  # priority first


def admitted_by_a_pass(cycle: SchedulingCycle, now: float) -> list[str]:
    """The order the policy's own pass admits the waiting jobs in, on room for all of them."""
    pending = [request(j) for j in cycle.jobs.pending()]
    running = [allocation(j) for j in cycle.jobs.holding()]
    return [job_id for job_id, _ in cycle.policy.schedule(now, pending, running).admit]


@pytest.mark.parametrize(
    ("queues", "expected"),
    [
        (None, ["urgent", "bob-new", "ada-new", "cid-some", "bob-long"]),  # las-share, the default
        (validate_queue_config({"order": "fifo"}), ["urgent", "bob-long", "cid-some", "ada-new", "bob-new"]),
    ],
    ids=["las-share", "fifo"],
)
def test_the_queue_lists_the_waiting_jobs_in_the_order_a_pass_admits_them(tmp_path, queues, expected):
    views, cycle = service_with(tmp_path, queues)
    now = time.time()  # the views order the queue as of now
    fill(cycle, now)
    listed = [view["id"] for view in views.queue()]
    assert listed[0] == "ada-running"  # the jobs holding resources first
    assert listed[1:] == expected == admitted_by_a_pass(cycle, now)
    assert [view["id"] for view in views.queue(waiting=2)] == ["ada-running", *expected[:2]]
    # the status page's pages and its filter by state follow the same order
    page = views.queue_page(QueueQuery(states=frozenset({"queued"}), limit=10))
    assert [view["id"] for view in page["jobs"]] == expected
    assert [view["id"] for view in views.queue_page(QueueQuery(offset=2, limit=3))["jobs"]] == listed[2:5]
