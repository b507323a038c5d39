"""`orchestrator run` of a job of replica groups on a cluster without a service: kill -9 of one
group's node; the attempt starts the group again wherever Ray finds room (the free node), the
new group heals from the live one, and the run ends with every logged step once. A cluster of
its own (it kills a node): a head without slots and three nodes of two slots each.
"""

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.testing.local_cluster import list_actors
from tests.conftest import ROOT, SERVICE_SPEC
from tests.service_helpers import train_steps
from tests.test_head_restart import logged_steps
from tests.test_replica_cluster import cluster_of_its_own


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with cluster_of_its_own(tmp_path_factory.mktemp("run-groups")) as svc:
        yield svc


def wait_for(predicate, timeout: float, what: str, process: subprocess.Popen):
    deadline = time.time() + timeout
    while not (found := predicate()):
        assert process.poll() is None, f"`orchestrator run` ended ({process.returncode}) before {what}"
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)
    return found


def healed_after(log: Path, step: int) -> bool:
    """Whether `orchestrator run` showed a group healed from a peer after `step`."""
    healed = re.findall(r"replica group \d+ healed from a peer at step (\d+)", log.read_text())
    return any(int(s) > step for s in healed)


@pytest.mark.timeout(420)
def test_orchestrator_run_starts_a_lost_group_again_where_ray_finds_room(cluster, tmp_path):
    """No service: the attempt beside `orchestrator run` places no group itself; Ray Train does
    where Ray finds room (here the free node), and the new group heals from the live one."""
    head = cluster.head
    name = cluster.paced("run-groups", 0.1)
    sets = {
        "name": name,
        "checkpoint.storage": tmp_path / "runs",
        "checkpoint.every_steps": 50,
        "resources.custom_per_worker.slot": 2,  # a node each
        "fault_tolerance.replica_groups": 2,
        "train.steps": 600,
        "metrics.log_every": 5,
    }
    args = ["run", SERVICE_SPEC, "--address", head.address, "--summary", str(tmp_path / "summary.json")]
    for key, value in sets.items():
        args += ["--set", f"{key}={value}"]
    env = {**cluster.env, "PYTHONPATH": str(ROOT)}
    with open(tmp_path / "run.log", "w") as out:
        command = [sys.executable, "-m", "orchestrator", *args]
        run = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        run_dir = wait_for(lambda: next((tmp_path / "runs").glob(f"{name}*"), None), 120, "the run", run)
        wait_for(lambda: max(logged_steps(run_dir), default=0) >= 20, 120, "step 20", run)
        workers = list_actors(head.dashboard, head.env, "RayTrainWorker")
        placed = sorted(w["node_id"] for w in workers if w["state"] == "ALIVE")
        assert len(placed) == 2 and len(set(placed)) == 2, workers  # a group per node
        nodes = {head.node_id_of(n): n for n in head.nodes}
        step_at_kill = max(train_steps(run_dir))
        head.kill_node(nodes[placed[0]])
        # paced until the new group has healed (what `orchestrator run` shows), then at full speed
        wait_for(lambda: healed_after(tmp_path / "run.log", step_at_kill), 240, "the heal", run)
        cluster.release(name)
        assert run.wait(timeout=300) == 0, (tmp_path / "run.log").read_text()[-3000:]
    finally:
        if run.poll() is None:
            run.kill()
    log = (tmp_path / "run.log").read_text()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "succeeded", log[-3000:]
    assert train_steps(run_dir) == list(range(5, 601, 5))  # every logged step once
    # (a group that starts a few steps after the other heals from it then too)
    healed = [p for p in summary["replica_groups"] if max(p["healed_at"], default=0) > step_at_kill]
    assert len(healed) == 1, summary["replica_groups"]  # the replacement, from the live group
    survivor = next(p for p in summary["replica_groups"] if p is not healed[0])
    assert survivor["steps_degraded"] > 0  # it trained alone while the other group was away
    print(
        f"`orchestrator run`, no service: a group's node killed at step {step_at_kill}; the group "
        f"started again on the free node healed from the live one at step {max(healed[0]['healed_at'])}; "
        f"the survivor took {survivor['steps_degraded']} steps alone; every logged step once"
    )
