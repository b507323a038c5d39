"""Replica groups on a cluster of their own: a lost group replaced without a service, and a
raylet that freezes under a group the service runs.

- `orchestrator run` (no service): kill -9 of one group's node; the attempt starts the group
  again wherever Ray finds room (the free node), the new group heals from the live one, and
  the run ends with every logged step once.
- Through the service, a raylet that freezes: a raylet can hang (a machine thrashing, a stuck
  kernel call); here it gets SIGSTOP. Ray's health checks declare the node dead after about a
  minute (Ray's defaults), but nothing ends the node's processes: its workers train on, in the
  job's quorum, until the raylet wakes and learns it is dead. The service then counts that
  group lost and places its replacement on the free node; the attempt tells the frozen group
  to leave, and its workers stop training at once, while the raylet is still frozen. The
  groups are HSDP (two workers each, FSDP2 inside a group, DDP across).

Counted from the ground truth: the workers' CPU time (`ps`), the metrics log on disk, the
summary and the job's history. The cluster (it kills one node and freezes another): a head
without slots (the attempt's controller, the service once it is up) and three worker nodes of
two slots each: a group per node.
"""

import contextlib
import json
import signal
import subprocess
import sys
import time

import psutil
import pytest

from orchestrator.testing.local_cluster import list_actors, list_nodes, start_ray_head, stop_ray_head
from tests.conftest import ROOT, SERVICE_SPEC, Service
from tests.service_helpers import events, train_steps, when
from tests.test_head_restart import logged_steps, processes_of

IDLE_CPU_S = 0.3  # CPU seconds in WINDOW_S of a group that no longer trains (idle: ~0.1; training: ~2)
WINDOW_S = 5.0
NODES = ("node-1", "node-2", "node-3")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The cluster, with no service on it yet (`frozen` starts one)."""
    tmp = tmp_path_factory.mktemp("groups")
    head = start_ray_head(num_cpus=4)  # Ray's own health checks; no slot: the groups go to the nodes
    svc = Service(head, tmp / "home", tmp / "store", tmp / "runs")
    try:
        for name in NODES:
            head.add_node(name, 2, {"slot": 2})
        yield svc
    finally:
        for node in head.nodes:  # a raylet left frozen by a failed test must be able to stop
            with contextlib.suppress(RuntimeError, psutil.Error):
                node.raylet().send_signal(signal.SIGCONT)
        svc.cli("down", timeout=60)
        stop_ray_head(head)
        left = processes_of(head)
        assert not left, f"processes of the cluster left running: {left}"


@pytest.fixture(scope="module")
def frozen(cluster):
    """The service on the cluster, with three live nodes of two slots."""
    svc = cluster
    live = [n for n in list_nodes(svc.head.dashboard, svc.head.env) if n["state"] == "ALIVE"]
    for _ in range(len(NODES) + 1 - len(live)):  # the head and the three nodes
        svc.head.add_node(f"node-{len(svc.head.nodes) + 1}", 2, {"slot": 2})
    svc.up()
    return svc


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def cpu_in_window(*pids: int) -> float:
    """The CPU seconds the processes spend in the next WINDOW_S, together."""
    before = sum(map(cpu_seconds, pids))
    time.sleep(WINDOW_S)
    return sum(map(cpu_seconds, pids)) - before


def wait_for(predicate, timeout: float, what: str, process: subprocess.Popen):
    deadline = time.time() + timeout
    while not (found := predicate()):
        assert process.poll() is None, f"`orchestrator run` ended ({process.returncode}) before {what}"
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)
    return found


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


@pytest.mark.timeout(600)
def test_an_hsdp_group_whose_raylet_froze_leaves_at_once_and_its_replacement_heals(frozen):
    svc = frozen
    name = svc.paced("frozen", 0.1)  # still training a minute and more after the freeze
    sets = ("resources.num_workers=4", "parallel.strategy=fsdp2", "fault_tolerance.replica_groups=2")
    a = svc.submit(*sets, "checkpoint.every_steps=50", steps=1200, name=name)
    run_dir = svc.runs / svc.job(a)["run"]
    job = svc.wait(a, lambda j: j["state"] == "running" and j["step"] >= 20, what="step 20")
    nodes = {svc.head.node_id_of(n): n for n in svc.head.nodes if n.process.poll() is None}
    placed = job["group_placements"]
    assert [len(p) for p in placed] == [1, 1] and set(job["placement"]) <= set(nodes), placed  # a node each
    victim = sorted(job["placement"])[0]
    lost_group = next(g for g, p in enumerate(placed) if victim in p)
    workers = list_actors(svc.head.dashboard, svc.head.env, "RayTrainWorker")
    frozen_pids = [w["pid"] for w in workers if w["state"] == "ALIVE" and w["node_id"] == victim]
    assert len(frozen_pids) == 2, workers
    training = cpu_in_window(*frozen_pids)
    assert training > IDLE_CPU_S  # they train

    raylet = nodes[victim].raylet()
    frozen_at = time.time()
    raylet.send_signal(signal.SIGSTOP)
    lost = svc.wait(a, lambda j: "group-lost" in events(j), timeout=180, what="group-lost")
    lost_at = when(lost, "group-lost")
    assert lost["attempt"] == 1 and lost["state"] == "running"
    # told to leave, the frozen group's worker stops training while its raylet is still frozen
    # (nothing else could end it: Ray has declared its node dead)
    deadline = lost_at + 30
    while (spent := cpu_in_window(*frozen_pids)) > IDLE_CPU_S:
        assert time.time() < deadline, f"the frozen group still trains ({spent:.2f} CPU s in {WINDOW_S:g} s)"
    left_s = time.time() - lost_at
    assert raylet.status() == psutil.STATUS_STOPPED and all(psutil.pid_exists(pid) for pid in frozen_pids)

    # the free node takes the lost group's place; the new group heals from the live one
    healed = svc.wait(
        a,
        lambda j: j["replica_groups"][str(lost_group)].get("healed_at", 0) > lost_at,
        timeout=120,
        what="the new group's heal",
    )
    group = healed["replica_groups"][str(lost_group)]
    assert group["state"] == "training" and victim not in group["nodes"]
    raylet.send_signal(signal.SIGCONT)  # it learns it is dead and ends, its worker with it
    svc.release(name)
    done = svc.done(a, timeout=300)
    assert done["attempt"] == 1 and "node-lost" not in events(done)  # never requeued
    assert train_steps(run_dir) == list(range(5, 1201, 5))  # every logged step once
    parts = {p["group"]: p for p in done["summary"]["replica_groups"]}
    assert parts[lost_group]["healed_at"] == [group["healed_step"]]  # the replacement's part
    print(
        f"raylet frozen (SIGSTOP) under one of 2 replica groups (HSDP, 2 workers each): Ray "
        f"declared its node dead and the service counted the group lost {lost_at - frozen_at:.0f} s "
        f"after the freeze; the frozen group stopped training {left_s:.1f} s after that (its raylet "
        f"still frozen; {spent:.2f} CPU s in {WINDOW_S:g} s, {training:.2f} while it trained); the "
        f"replacement healed {group['healed_at'] - lost_at:.1f} s after the loss"
    )
