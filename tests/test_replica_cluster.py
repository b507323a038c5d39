"""A raylet that freezes under a replica group the service runs, on a cluster of its own.

A raylet can hang (a machine thrashing, a stuck kernel call); here it gets SIGSTOP. Ray's health
checks declare the node dead after about a minute (Ray's defaults), but nothing ends the node's
processes: its workers train on, in the job's quorum, until the raylet wakes and learns it is
dead. The service then counts that group lost and places its replacement on the free node; the
attempt tells the frozen group to leave, and its workers stop training at once, while the
raylet is still frozen. The groups are HSDP (two workers each, FSDP2 inside a group, DDP across).

Counted from the ground truth: the workers' CPU time (`ps`), the metrics log on disk, the
summary and the job's history. The cluster (it freezes a node for a minute): a head without
slots (the service, the attempt's controller) and three worker nodes of two slots each: a group
per node.
"""

import contextlib
import signal
import time

import psutil
import pytest

from orchestrator.testing.local_cluster import list_actors, start_ray_head, stop_ray_head
from tests.conftest import Service
from tests.service_helpers import events, train_steps, when
from tests.test_head_restart import processes_of

IDLE_CPU_S = 0.3  # CPU seconds in WINDOW_S of a group that no longer trains (idle: ~0.1; training: ~1)
WINDOW_S = 5.0
NODES = ("node-1", "node-2", "node-3")


@pytest.fixture(scope="module")
def frozen(tmp_path_factory):
    with cluster_of_its_own(tmp_path_factory.mktemp("frozen")) as svc:
        svc.up()
        yield svc


@contextlib.contextmanager
def cluster_of_its_own(tmp):
    """A head without slots and three nodes of two; what a failed test leaves frozen is woken
    so that it stops, and nothing of the cluster is left running."""
    head = start_ray_head(num_cpus=4)  # Ray's own health checks; no slot: the groups go to the nodes
    svc = Service(head, tmp / "home", tmp / "store", tmp / "runs")
    try:
        for name in NODES:
            head.add_node(name, 2, {"slot": 2})
        yield svc
    finally:
        for node in head.nodes:
            with contextlib.suppress(RuntimeError, psutil.Error):
                node.raylet().send_signal(signal.SIGCONT)
        svc.cli("down", timeout=60)
        stop_ray_head(head)
        left = processes_of(head)
        assert not left, f"processes of the cluster left running: {left}"


def waited(svc: Service, job_id: str, predicate, what: str, timeout: float = 240) -> dict:
    """`svc.wait`, with the attempt's log printed when it times out (what a failure in CI needs)."""
    try:
        return svc.wait(job_id, predicate, timeout=timeout, what=what)
    except AssertionError:
        print(svc.cli("logs", job_id).stdout[-6000:])
        raise


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def cpu_in_window(*pids: int) -> float:
    """The CPU seconds the processes spend in the next WINDOW_S, together."""
    before = sum(map(cpu_seconds, pids))
    time.sleep(WINDOW_S)
    return sum(map(cpu_seconds, pids)) - before


@pytest.mark.timeout(600)
def test_an_hsdp_group_whose_raylet_froze_leaves_at_once_and_its_replacement_heals(frozen):
    svc = frozen
    name = svc.paced("frozen", 0.2)  # at most 5 steps a second: still training at the heal
    sets = ("resources.num_workers=4", "parallel.strategy=fsdp2", "fault_tolerance.replica_groups=2")
    a = svc.submit(*sets, "checkpoint.every_steps=50", steps=600, name=name)
    run_dir = svc.runs / svc.job(a)["run"]
    job = waited(svc, a, lambda j: j["state"] == "running" and j["step"] >= 20, "step 20")
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
    assert train_steps(run_dir) == list(range(5, 601, 5))  # every logged step once
    parts = {p["group"]: p for p in done["summary"]["replica_groups"]}
    assert parts[lost_group]["healed_at"] == [group["healed_step"]]  # the replacement's part
    print(
        f"raylet frozen (SIGSTOP) under one of 2 replica groups (HSDP, 2 workers each): Ray "
        f"declared its node dead and the service counted the group lost {lost_at - frozen_at:.0f} s "
        f"after the freeze; the frozen group stopped training {left_s:.1f} s after that (its raylet "
        f"still frozen; {spent:.2f} CPU s in {WINDOW_S:g} s, {training:.2f} while it trained); the "
        f"replacement healed {group['healed_at'] - lost_at:.1f} s after the loss"
    )
