"""The queue drives Ray's autoscaler: a job that fits only once nodes are added waits for
them, the service asks Ray's autoscaler for them (`request_resources`), the job starts when
they come, and the request is withdrawn so that idle nodes go afterwards.

A real Ray autoscaler on a head of its own, with Ray's fake multi-node provider (what Ray's
own autoscaler tests use): each node it adds is a raylet on this machine. The service finds
the autoscaler's config itself, from the monitor process on the head. What is counted comes
from Ray's node table and the job's own history and metrics log.
"""

import json
import time
import urllib.request
from pathlib import Path

import pytest

from orchestrator.testing.local_cluster import list_nodes, start_ray_head, stop_ray_head
from tests.conftest import SERVICE_SPEC, Service
from tests.test_service import events, train_steps, when

SLOT_NODE = {"resources": {"CPU": 2, "slot": 1}, "max_workers": 2}


def page_api(svc, what: str):
    """The service's own HTTP API (what the status page reads): fast enough to catch a note
    that lasts only while the nodes come."""
    page = json.loads((svc.home / "cluster.json").read_text())["status_page"]
    with urllib.request.urlopen(f"{page.rstrip('/')}/api/{what}", timeout=10) as reply:
        return json.load(reply)


def slot_nodes(head) -> int:
    nodes = list_nodes(head.dashboard, head.env)
    return sum(1 for n in nodes if n["state"] == "ALIVE" and n["resources_total"].get("slot"))


def autoscaler_log(head, lines: int = 60) -> str:
    """The tail of the autoscaler's own log on the head: what it decided, for a failure message."""
    logs = sorted(Path(head.temp_dir).glob("ray/session_latest/logs/monitor.*"))
    return "\n".join(line for log in logs for line in log.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture(scope="module")
def scaling(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("autoscaling")
    head = start_ray_head(num_cpus=2, autoscaling={"slot-node": SLOT_NODE})  # no slot on the head
    svc = Service(head, tmp / "home", tmp / "store", tmp / "runs")
    try:
        svc.up()
        yield svc
    finally:
        svc.cli("down", timeout=60)
        stop_ray_head(head)


@pytest.mark.timeout(420)
def test_a_job_that_needs_new_nodes_asks_the_autoscaler_starts_on_them_and_they_go_after(scaling):
    head = scaling.head
    assert slot_nodes(head) == 0
    queue = scaling.cli("queue").stdout
    assert "autoscaler may add: 2 slot-node" in queue  # found from the monitor on the head
    # 2 workers x 1 slot: more than the cluster has now, not more than it may grow to
    job_id = scaling.submit(steps=600, name="scaled")
    asked = scaling.wait(job_id, lambda j: "autoscaler-requested" in events(j), timeout=30, what="asked")
    request = next(e for e in asked["history"] if e["event"] == "autoscaler-requested")
    assert request["nodes"] == "2 more node(s) of slot-node (2 CPU, 1 slot)"
    view = next(j for j in page_api(scaling, "queue") if j["id"] == job_id)
    if view["state"] == "queued":  # the note lasts until the nodes come (a few seconds)
        assert view["note"] == "waiting for the autoscaler: 2 more node(s) of slot-node (2 CPU, 1 slot)"
    running = scaling.wait(job_id, lambda j: j["state"] == "running", timeout=240, what="running")
    nodes = list_nodes(head.dashboard, head.env)
    added = {n["node_id"] for n in nodes if n["state"] == "ALIVE" and n["resources_total"].get("slot")}
    assert set(running["placement"]) == added and len(added) == 2  # on the nodes it asked for
    done = scaling.done(job_id, timeout=300)
    assert train_steps(scaling.runs / "scaled")[-1] == 600
    # the request is withdrawn once the job runs: idle nodes go (6 s idle timeout)
    deadline = time.time() + 60
    while slot_nodes(head) and time.time() < deadline:
        time.sleep(1)
    assert slot_nodes(head) == 0
    print(
        f"autoscaler: requested -> admitted {when(done, 'admitted') - request['time']:.1f} s, "
        f"-> running {when(done, 'running') - request['time']:.1f} s; nodes gone "
        f"{time.time() - when(done, 'succeeded'):.0f} s after the job"
    )


def test_a_job_larger_than_the_autoscaler_may_grow_to_is_refused(scaling):
    result = scaling.cli(
        "submit",
        SERVICE_SPEC,
        "--set",
        "resources.custom_per_worker.slot=1",
        "--set",
        "resources.num_workers=4",
    )
    assert result.returncode == 2, result.stderr
    assert (
        "room for only 2 such worker(s) (3 node(s)), counting the 2 the autoscaler may still add"
        in result.stderr
    )


@pytest.mark.timeout(300)
def test_a_job_stopped_while_its_nodes_come_withdraws_the_request_and_they_go(scaling):
    head = scaling.head
    job_id = scaling.submit(steps=100_000, name="withdrawn")
    scaling.wait(job_id, lambda j: "autoscaler-requested" in events(j), timeout=30, what="asked")
    assert page_api(scaling, "info")["autoscaler"]["asked_for"] == {
        job_id: "2 more node(s) of slot-node (2 CPU, 1 slot)"
    }
    deadline = time.time() + 240  # as long as the first test gives it: nodes of that job may still be going
    while not slot_nodes(head) and time.time() < deadline:  # the autoscaler acts on it
        time.sleep(0.5)
    assert slot_nodes(head) >= 1, autoscaler_log(head)
    assert scaling.cli("stop", job_id, "--now").returncode == 0
    stopped = scaling.wait(job_id, lambda j: j["state"] == "stopped", timeout=120, what="stopped")
    deadline = time.time() + 10  # withdrawn by the next scheduling pass (every second)
    while page_api(scaling, "info")["autoscaler"]["asked_for"] and time.time() < deadline:
        time.sleep(0.5)
    assert page_api(scaling, "info")["autoscaler"]["asked_for"] == {}
    # a request still standing would keep them (Ray keeps what request_resources asks for)
    deadline = time.time() + 90
    while slot_nodes(head) and time.time() < deadline:
        time.sleep(1)
    assert slot_nodes(head) == 0, "the nodes asked for a stopped job stayed"
    assert stopped["step"] < 100_000
