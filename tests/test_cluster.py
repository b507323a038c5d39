"""The service on a real multi-node Ray cluster: gangs across nodes (checked in the node-loss
test, whose job spans two), a node lost under a running job, a node that joins, a node drained before it goes.

The cluster is the service's own (tests/conftest.py's SERVICE_NODES): a head and two worker
nodes, raylets of their own on this machine, each with one `slot` standing in for a GPU. A
node dies as a machine does: its raylet gets SIGKILL. What the tests count comes from the
ground truth: Ray's own node and actor tables, the checkpoints and the metrics log on disk.
How long each took is printed against its goal (`pytest -s`), not asserted: on a loaded
machine a correct service misses it.
"""

import collections
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.metrics_log import read_metrics
from core.run_folder import checkpoint_step, checkpoints
from orchestrator.testing.local_cluster import RAY, list_actors, list_nodes
from tests.conftest import ROOT, SERVICE_SPEC
from tests.test_parallel import FP32_TOL
from tests.test_service import events, train_steps, when
from workers.checkpoint_files import incomplete_reason


def alive_nodes(service) -> set[str]:
    return {
        n["node_id"] for n in list_nodes(service.head.dashboard, service.head.env) if n["state"] == "ALIVE"
    }


def train_workers(service) -> list[dict]:
    """Ray Train's worker actors alive now, from Ray's actor table."""
    actors = list_actors(service.head.dashboard, service.head.env, "RayTrainWorker")
    return [a for a in actors if a["state"] == "ALIVE"]


def slot_nodes(service) -> int:
    nodes = list_nodes(service.head.dashboard, service.head.env)
    return sum(1 for n in nodes if n["state"] == "ALIVE" and n["resources_total"].get("slot"))


def assert_the_gang_is_where_the_service_counted_it(service, placement: dict[str, int]) -> None:
    """Ray's actor table: the job's workers on exactly the nodes the service counted (one slot
    per node: the gang spans two), and the service itself on the head, which outlives them."""
    assert len(placement) == 2, placement
    deadline = time.time() + 30
    while len(workers := train_workers(service)) < 2 and time.time() < deadline:
        time.sleep(0.5)
    assert collections.Counter(w["node_id"] for w in workers) == placement
    nodes = list_nodes(service.head.dashboard, service.head.env)
    head = next(n["node_id"] for n in nodes if n["is_head_node"])
    services = list_actors(service.head.dashboard, service.head.env, "OrchestratorService")
    assert [a["node_id"] for a in services if a["state"] == "ALIVE"] == [head]


def ray_declared_dead_at(service, node_id: str) -> float | None:
    """When Ray's node table says the node died (its own health checks gave up), or None yet."""
    nodes = list_nodes(service.head.dashboard, service.head.env, detail=True)
    node = next(n for n in nodes if n["node_id"] == node_id)
    return node["end_time_ms"] / 1000 if node["state"] == "DEAD" else None


def test_the_service_reads_the_health_checks_the_cluster_runs_with(service):
    """The test cluster leaves Ray's health checks as Ray ships them; the service reads them
    from the head's GCS and waits as long as they imply, no longer."""
    from orchestrator.ray.node_health import HealthChecks

    checks = HealthChecks.of_cluster(service.head.address)
    assert checks.source == "the cluster's GCS"
    assert (checks.period_s, checks.timeout_s, checks.threshold) == (3.0, 10.0, 5)


@pytest.mark.timeout(600)
def test_a_node_lost_under_a_job_requeues_it_to_resume_on_the_nodes_that_remain(service):
    """kill -9 of a worker node under a 2-node gang that checkpoints to S3, on a cluster with
    Ray's default health checks (a dead node is Ray's verdict only ~15 s later): the service's
    own probe requeues the job, it trains again on the nodes that remain, and no job is placed
    on the dead node meanwhile."""
    runs = service.s3.uri("node-loss")
    # paced until it trains again, so that the node dies mid-run whatever the machine's pace
    name = service.paced("node-loss", 0.05)
    a = service.submit(f"checkpoint.storage={runs}", "checkpoint.every_steps=50", steps=800, name=name)
    waiting = service.submit(steps=30, name="bystander")  # queued behind it: no room for two
    run_uri = f"{runs}/{service.job(a)['run']}"
    ids = {service.head.node_id_of(n): n for n in service.head.nodes if n.process.poll() is None}
    job = service.wait(a, lambda j: j["state"] == "running" and j["step"] >= 150, what="step 150")
    # a gang across two nodes, each rank's part of every checkpoint in the bucket
    assert_the_gang_is_where_the_service_counted_it(service, job["placement"])
    newest = next(c for c in reversed(checkpoints(run_uri)) if incomplete_reason(c) is None)
    parts = service.s3.files("node-loss", "node-loss", newest.rsplit("/", 1)[-1])
    assert {"rng/rank_00000.pt", "rng/rank_00001.pt", "manifest.json"} <= set(parts), parts
    assert {name[:3] for name in parts if name.endswith(".distcp")} == {"__0", "__1"}
    victim = next(node_id for node_id in job["placement"] if node_id in ids)  # a worker node, not the head
    killed_at = service.head.kill_node(ids[victim])
    complete = [c for c in checkpoints(run_uri) if incomplete_reason(c) is None]
    on_storage = sorted(checkpoint_step(c) for c in complete)  # at the kill
    requeued = service.wait(a, lambda j: "node-lost" in events(j), timeout=60, what="node-lost")
    noticed_s = when(requeued, "node-lost") - killed_at
    lost_event = next(e for e in requeued["history"] if e["event"] == "node-lost")
    assert lost_event["nodes"] == [victim]
    assert lost_event["why"][victim].startswith("does not answer"), lost_event
    queue = service.cli("queue")
    assert f"{victim[:8]} unreachable" in queue.stdout, queue.stdout  # the cluster line names it

    again = service.wait(a, lambda j: events(j).count("admitted") >= 2, timeout=60, what="admitted again")
    assert victim not in again["placement"]
    # admitted elsewhere while Ray still listed the dead node alive: the service's probe, not Ray
    readmitted = when(again, "admitted", 1)
    dead_at = ray_declared_dead_at(service, victim)
    assert dead_at is None or readmitted < dead_at, (readmitted - killed_at, dead_at - killed_at)
    again = service.wait(a, lambda j: events(j).count("running") >= 2, timeout=180, what="running again")
    back_s = when(again, "running", 1) - killed_at
    assert set(again["placement"]) <= alive_nodes(service)
    # the job kept its place: the queued job behind it was never admitted meanwhile
    assert service.job(waiting)["attempt"] == 0

    service.release(name)
    done = service.done(a, timeout=300)
    lost_event = next(e for e in done["history"] if e["event"] == "node-lost")  # made exact since
    steps = [r["step"] for r in read_metrics(run_uri) if "loss" in r]
    assert steps == sorted(set(steps)) and steps[-1] == 800  # every step logged once, in order
    assert lost_event["step"] < 800, "the job had finished training before its node died"
    resumed = done["summary"]["resumed_from_step"]
    # the newest complete checkpoint: one the dead node's rank finished uploading as it died counts
    assert on_storage[-1] <= resumed <= lost_event["step"] and resumed > 0
    lost = lost_event["steps_lost"]
    assert lost_event["step"] - lost == resumed  # lost: the steps after it
    assert 0 <= lost <= 50 and done["steps_lost"] == lost
    dead_at = ray_declared_dead_at(service, victim)
    print(
        f"node loss (Ray's default health checks): noticed in {noticed_s:.1f} s (goal: under 10 s), "
        f"training again {back_s:.1f} s after the kill (goal: under 60 s), {lost} steps lost "
        f"(checkpoint every 50); Ray declared the node dead {dead_at - killed_at:.1f} s after the kill"
    )
    assert service.cli("stop", waiting, "--now").returncode == 0  # it has shown what it had to


@pytest.mark.timeout(600)
def test_a_node_lost_under_one_replica_group_leaves_the_other_training_and_a_new_group_heals(service):
    """The node-loss test's job with `fault_tolerance.replica_groups: 2` (a group of one worker
    on each of two nodes, the attempt's controller and the groups' lighthouse on the head):
    kill -9 of the node of one group mid-training. The job is not requeued: the other group
    trains on, the lost group is placed again once a node joins, and its new worker heals from
    the live group's and joins. Counted from the metrics log in the bucket, the job's history
    and ledger; timings printed against their goals."""
    runs = service.s3.uri("groups")
    name = service.paced("groups", 0.05)
    sets = (f"checkpoint.storage={runs}", "checkpoint.every_steps=50", "fault_tolerance.replica_groups=2")
    a = service.submit(*sets, steps=800, name=name)
    run_uri = f"{runs}/{service.job(a)['run']}"
    ids = {service.head.node_id_of(n): n for n in service.head.nodes if n.process.poll() is None}
    job = service.wait(a, lambda j: j["state"] == "running" and j["step"] >= 150, what="step 150")
    placed = job["group_placements"]
    assert sorted(sum(p.values()) for p in placed) == [1, 1] and len(job["placement"]) == 2, placed
    victim = next(node_id for node_id in job["placement"] if node_id in ids)  # a worker node
    lost_group = next(g for g, nodes in enumerate(placed) if victim in nodes)
    free = slot_nodes(service) - 2  # taken by another job: no room for a new group until a node joins
    filler = (
        service.submit(f"resources.num_workers={free}", steps=100000, name="filler-groups") if free else None
    )
    if filler:
        service.wait(filler, lambda j: j["state"] == "running", what="filler running")
    killed_at = service.head.kill_node(ids[victim])
    step_at_kill = max(train_steps(run_uri))

    lost = service.wait(a, lambda j: "group-lost" in events(j), timeout=60, what="group-lost")
    event = next(e for e in lost["history"] if e["event"] == "group-lost")
    assert (event["groups"], event["nodes"]) == ([lost_group], [victim])
    assert lost["state"] == "running" and lost["attempt"] == 1
    # the other group trains on: its steps reach the log after the kill (no room for a new group yet)
    after = service.wait(a, lambda j: j["step"] >= step_at_kill + 50, timeout=120, what="50 more steps")
    assert after["group_placements"][lost_group] == {} and after["attempt"] == 1
    paused_s = longest_pause(run_uri, killed_at)
    status = service.cli("status", a)
    assert "1 of 2 training" in status.stdout and f"group {lost_group}: lost" in status.stdout, status.stdout

    joined_at = time.time()
    node = service.head.add_node(f"node-{len(service.head.nodes) + 1}", 2, {"slot": 1})
    new_node = service.head.node_id_of(node)
    placed = service.wait(a, lambda j: "group-placed" in events(j), timeout=60, what="group-placed")
    assert placed["group_placements"][lost_group] == {new_node: 1}
    healed = service.wait(a, lambda j: healed_after(j, lost_group, joined_at), what="the new group's heal")
    group = healed["replica_groups"][str(lost_group)]
    assert group["state"] == "training" and group["nodes"] == [new_node]
    assert group["healed_step"] > step_at_kill  # from the live group's step, not a checkpoint's
    whole = service.wait(a, lambda j: "groups-whole" in events(j), timeout=60, what="groups-whole")
    status = service.cli("status", a)
    assert "2 of 2 training" in status.stdout and "healed from a peer at step" in status.stdout, status.stdout

    service.release(name)
    if filler:
        assert service.cli("stop", filler, "--now").returncode == 0
    done = service.done(a, timeout=300)
    assert done["attempt"] == 1 and "node-lost" not in events(done)  # never requeued
    steps = train_steps(run_uri)
    assert steps == list(range(5, 801, 5))  # every logged step once, none lost, in order
    degraded = done["ledger"]["degraded_s"]
    assert 0 < degraded <= done["finished_at"] - killed_at
    parts = {p["group"]: p for p in done["summary"]["replica_groups"]}
    assert parts[1 - lost_group]["steps_degraded"] >= 50  # the survivor's steps alone
    assert parts[lost_group]["healed_at"] == [group["healed_step"]]
    print(
        f"node lost under one of 2 replica groups (Ray's default health checks): the other group "
        f"trained on, its longest pause between logged steps {paused_s:.1f} s (goal: under 10 s), "
        f"no restart; a node "
        f"joined: the new group placed {when(placed, 'group-placed') - joined_at:.1f} s and healed "
        f"{group['healed_at'] - joined_at:.1f} s after `ray start` (goal: under 60 s), at step "
        f"{group['healed_step']}; degraded {degraded:.1f} s; 0 steps lost (checkpoint every 50); "
        f"whole again {when(whole, 'groups-whole') - killed_at:.1f} s after the kill"
    )


def healed_after(job: dict, group: int, since: float) -> bool:
    return job["replica_groups"][str(group)].get("healed_at", 0) > since


def longest_pause(run_uri: str, since: float, window_s: float = 15, timeout: float = 60) -> float:
    """The longest time between two steps the metrics log holds around `since`: from the last
    step before it to the first `window_s` seconds after it (the log is written every few
    seconds: waited for until it reaches past them)."""
    deadline = time.time() + timeout
    while True:
        times = [r["time"] for r in read_metrics(run_uri) if "loss" in r]
        if max(times) > since + window_s:
            break
        assert time.time() < deadline, f"no step logged {window_s} s after {since}"
        time.sleep(1)
    before = max(t for t in times if t <= since)
    around = sorted(t for t in times if before <= t <= since + window_s)
    return max(b - a for a, b in zip(around, around[1:]))


def test_each_worker_node_has_a_disk_of_its_own(service):
    """The test cluster as separate machines are: what a worker node's processes write under
    `local` only that node sees (read through each raylet's own view of the file system)."""
    raylets = {n.name: n.raylet().pid for n in service.head.nodes if n.process.poll() is None}
    for name, pid in raylets.items():
        Path(f"/proc/{pid}/root{service.local}/written-on-{name}").write_text(name)
    for name, pid in raylets.items():  # each node sees its own file, and only its own
        seen = sorted(p.name for p in Path(f"/proc/{pid}/root{service.local}").iterdir())
        assert seen == [f"written-on-{name}"], (name, seen)
    assert raylets and not list(service.local.iterdir())  # and the head (the machine) none of them


def test_checkpoints_on_one_disk_per_node_are_refused_for_a_cluster_of_many_nodes(service):
    """A gang across nodes would leave each rank's checkpoint on its own machine: refused at
    submission, naming the field, nothing queued. The same job on storage every node reaches
    (S3) runs: test_a_node_lost_under_a_job... trains that gang on S3."""
    before = set(service.store.glob("jobs/*.json"))
    refused = service.cli(
        "submit",
        SERVICE_SPEC,
        *("--set", "resources.custom_per_worker.slot=1"),
        *("--set", f"checkpoint.storage={service.local / 'runs'}"),
        *("--set", "name=local-disk"),
    )
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith(f"error: checkpoint.storage: '{service.local / 'runs'}' is a local path"), line
    assert "nodes has a disk of its own" in line and "--shared-storage" in line
    assert f"(declared shared: {service.runs})" in line  # what the operator declared, for comparison
    assert set(service.store.glob("jobs/*.json")) == before


@pytest.mark.timeout(400)
def test_a_node_that_joins_lets_the_head_of_the_queue_start(service):
    # fill every slot the cluster has now, then queue a one-worker job behind it
    filler = service.paced("filler", 0.05)  # holds the slots, and leaves the CPUs to the newcomer
    sets = f"resources.num_workers={slot_nodes(service)}", "data.batch_size=60"
    busy = service.submit(*sets, steps=3000, name=filler)
    service.wait(busy, lambda j: j["state"] == "running", what="running")
    queued = service.submit("resources.num_workers=1", steps=20, name="newcomer")
    time.sleep(3)
    assert service.job(queued)["state"] == "queued"
    try:
        joined_at = time.time()
        node = service.head.add_node(f"node-{len(service.head.nodes) + 1}", 2, {"slot": 1})
        listed_s = time.time() - joined_at
        job = service.wait(
            queued, lambda j: j["state"] in ("admitted", "running"), timeout=60, what="admitted"
        )
        admitted_s = when(job, "admitted") - joined_at
        assert service.head.node_id_of(node) in job["placement"]
        assert f"{service.head.node_id_of(node)[:8]} joined" in service.cli("queue").stdout
        job = service.wait(queued, lambda j: "running" in events(j), timeout=120, what="running")
        print(
            f"node join: listed by Ray {listed_s:.1f} s after `ray start`, job admitted "
            f"{admitted_s:.1f} s (goal: under 5 s after the listing) and training "
            f"{when(job, 'running') - joined_at:.1f} s after it"
        )
        service.done(queued)
    finally:
        service.cli("stop", busy, "--now")


@pytest.mark.timeout(400)
def test_a_drained_node_gets_its_job_preempted_with_no_step_lost_before_it_goes(service):
    name = service.paced("drained", 0.05)  # still training when the drain comes
    job_id = service.submit("checkpoint.every_steps=1000", steps=600, name=name)
    job = service.wait(job_id, lambda j: j["state"] == "running" and j["step"] >= 50, what="step 50")
    ids = {service.head.node_id_of(n): n for n in service.head.nodes if n.process.poll() is None}
    drained = next(node_id for node_id in job["placement"] if node_id in ids)
    try:
        asked = time.time()
        drain = subprocess.run(
            [RAY, "drain-node", f"--address={service.head.address}", f"--node-id={drained}"]
            + ["--reason=DRAIN_NODE_REASON_PREEMPTION", "--reason-message=spot reclaim"]
            + ["--deadline-remaining-seconds=120"],
            env={**os.environ, **service.head.env},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert drain.returncode == 0, drain.stdout + drain.stderr
        job = service.wait(job_id, lambda j: "preempted" in events(j), timeout=60, what="preempted")
        moved = next(e for e in job["history"] if e["event"] == "preempted")
        assert moved["acknowledged"] is True and moved["steps_lost"] == 0  # checkpointed where it stopped
        again = service.wait(job_id, lambda j: events(j).count("running") >= 2, timeout=180, what="running")
        assert drained not in again["placement"]  # a draining node takes no new work
        assert f"{drained[:8]} draining" in service.cli("queue").stdout  # (Ray ends it once idle)
        service.release(name)
        done = service.done(job_id, timeout=300)
        assert done["steps_lost"] == 0 and done["summary"]["resumed_from_step"] == moved["step"]
        steps = [r["step"] for r in read_metrics(str(service.runs / "drained")) if "loss" in r]
        assert steps == sorted(set(steps)) and steps[-1] == 600
        print(
            f"drain: preempted {when(job, 'preempted') - asked:.1f} s after the drain request, 0 steps lost"
        )
    finally:  # the node goes (Ray ends a drained node once it is idle); a new one takes its place
        ids[drained].stop()
        service.head.add_node(f"node-{len(service.head.nodes) + 1}", 2, {"slot": 1})


# an elastic job: 1 or 2 workers, 32 samples a micro-batch (two micro-batches a step at 1 worker);
# a constant learning rate after warm-up, so that a run of the same job can stop at any step
ELASTIC = [
    "resources.num_workers={min: 1, max: 2}",
    "scheduling.preemptible=true",
    "scheduler.name=constant",
    "optimizer.lr=0.0003",  # still learning when it is resized: the curves compared are not flat
    "checkpoint.every_steps=1000000",  # only the checkpoints of the resizes and the stop
    "train.eval_every=1000000",
]
PARITY_STEPS = 20  # the window of the parity tests (tests/test_parallel.py)


def fixed_size_continuation(checkpoint: str, step: int, out) -> dict[int, float]:
    """The job at one fixed size (one process, two micro-batches a step), resumed from
    `checkpoint` for PARITY_STEPS steps, without the service: its losses by step."""
    sets = [
        *ELASTIC[1:],
        "resources.num_workers=1",
        "train.grad_accum=2",
        f"train.steps={step + PARITY_STEPS}",
    ]
    sets += [
        f"checkpoint.storage={out}",
        f"checkpoint.resume={checkpoint}",
        "name=fixed",
        "metrics.log_every=5",
    ]
    args = [sys.executable, "-m", "workers.run", SERVICE_SPEC, *(a for s in sets for a in ("--set", s))]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # as a Ray worker with one CPU
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return {
        r["step"]: r["loss"] for r in read_metrics(str(out / "fixed")) if "loss" in r and r["step"] > step
    }


@pytest.mark.timeout(900)
def test_an_elastic_job_shrinks_for_a_higher_priority_job_and_grows_back_with_no_step_lost(service, tmp_path):
    # stopped by the test; paced, so that it leaves the CPUs to the starts and stops it waits for
    job_id = service.submit(*ELASTIC, steps=10**6, name=service.paced("elastic", 0.02))
    try:
        job = service.wait(job_id, lambda j: j["state"] == "running" and j["step"] >= 50, what="step 50")
        assert sum(job["placement"].values()) == 2  # admitted at the largest size that fits
        assert "2/1..2 x" in service.cli("queue").stdout
        urgent = service.done(service.submit(name="urgent", priority=10, steps=200))
        # nothing waits now: it grows back to 2 workers, and trains on
        grown = service.wait(job_id, lambda j: events(j).count("running") == 3, timeout=180, what="regrown")
        assert "2/1..2 x" in service.cli("queue").stdout
        service.wait(job_id, lambda j: j["step"] >= grown["step"] + PARITY_STEPS + 20, what="steps")
    finally:
        service.cli("stop", job_id)
    job = service.wait(job_id, lambda j: j["state"] == "stopped", what="stopped")
    resized = [e for e in job["history"] if e["event"] == "resized"]
    assert [(e["workers"], e["to"]) for e in resized] == [(2, 1), (1, 2)]
    assert all(e["acknowledged"] and e["steps_lost"] == 0 for e in resized)  # checkpointed where it stopped
    assert job["resizes"] == 2 and job["preemptions"] == 0 and job["steps_lost"] == 0
    assert [e["workers"] for e in job["history"] if e["event"] == "admitted"] == [2, 1, 2]
    # the urgent job started once the elastic one had shrunk; it grew back once nothing waited
    assert resized[0]["time"] <= when(urgent, "admitted") and when(urgent, "succeeded") <= resized[1]["time"]
    # every step once: each restart resumed at the very step it stopped at
    steps = train_steps(service.runs / "elastic")
    assert steps == list(range(5, steps[-1] + 1, 5)) and steps[-1] >= resized[1]["step"] + PARITY_STEPS
    # after each resize the curve is that of a fixed-size run from the same checkpoint
    ours = {r["step"]: r["loss"] for r in read_metrics(str(service.runs / "elastic")) if "loss" in r}
    saved = {checkpoint_step(c): c for c in checkpoints(str(service.runs / "elastic"))}
    for n, event in enumerate(resized):
        fixed = fixed_size_continuation(saved[event["step"]], event["step"], tmp_path / f"fixed-{n}")
        compared = [s for s in fixed if s in ours]  # the final step may fall between logged ones
        assert len(compared) >= PARITY_STEPS // 5 - 1, (sorted(fixed), event)
        assert max(abs(ours[s] - fixed[s]) / abs(fixed[s]) for s in compared) <= FP32_TOL, (ours, fixed)
    pauses = [when(job, "running", n + 1) - when(job, "stop-requested", n) for n in range(2)]
    print(f"elastic: stop requested -> training again: shrink {pauses[0]:.1f} s, grow {pauses[1]:.1f} s")
