"""The head's GCS dies and comes back: with Ray's GCS fault tolerance (backed by a real Redis,
Debian's `redis-server`), the service, the running job and the queue carry on; no job is lost
and none runs twice.

A cluster of its own: a head (without --block, as `orchestrator up` starts one) whose GCS
keeps its tables in Redis, and one more node; the service on it through `orchestrator up`.

Without Redis, a head that dies takes the cluster with it: what survives is the job store.
A new head and the next `orchestrator up` on the same store bring back the queue, and the jobs
that were running resume from their newest complete checkpoints.
"""

import contextlib
import json
import signal
import time

import psutil
import pytest

from core.metrics_log import read_metrics
from core.run_folder import checkpoint_step, checkpoints
from orchestrator.testing.local_cluster import restart_gcs, start_ray_head, start_redis, stop_ray_head
from tests.conftest import Service
from tests.test_service import events, train_steps, when
from workers.checkpoint_files import incomplete_reason


def logged_steps(run_dir) -> list[int]:
    """The training steps in a run's metrics log; [] before its first write."""
    try:
        return train_steps(run_dir)
    except FileNotFoundError:
        return []


def processes_of(head) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"]) if head.temp_dir in " ".join(p.info["cmdline"] or [])]


@pytest.fixture(scope="module")
def ft_service(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ft")
    redis = start_redis()
    head = start_ray_head(num_cpus=4, resources={"slot": 1}, redis=redis.address)
    svc = Service(head, tmp / "home", tmp / "store", tmp / "runs")
    try:
        head.add_node("node-1", 2, {"slot": 1})
        svc.up()
        yield svc
    finally:
        svc.cli("down", timeout=60)
        stop_ray_head(head)
        redis.stop()
        left = processes_of(head)
        assert not left, f"processes of the cluster left running: {left}"


@pytest.mark.timeout(600)
def test_a_gcs_restart_with_redis_loses_no_job_and_runs_none_twice(ft_service):
    svc = ft_service
    info = json.loads((svc.home / "cluster.json").read_text())
    assert info["address"] == svc.head.address
    name = svc.paced("trains", 0.05)  # still training when the GCS goes down and comes back
    trains = svc.submit("checkpoint.every_steps=400", steps=600, name=name)
    # no room beside it; once it ends, the two fit together
    waiting = [svc.submit("resources.num_workers=1", steps=30, name=f"waits-{i}") for i in range(2)]
    svc.wait(trains, lambda j: j["state"] == "running" and j["step"] >= 100, what="step 100")
    killed_at, restarted_at = restart_gcs(svc.head, down_s=3.0)
    assert svc.job(trains)["state"] == "running"
    svc.release(name)

    done = [svc.done(job_id, timeout=400) for job_id in (trains, *waiting)]
    for job in done:  # each ran once: one admission, one attempt, nothing lost
        assert events(job).count("admitted") == 1 and job["attempt"] == 1, job["history"]
        assert job["steps_lost"] == 0
    steps = [r["step"] for r in read_metrics(str(svc.runs / "trains")) if "loss" in r]
    assert steps == list(range(5, 601, 5))  # every step once: training never stopped
    # the queue moved on after the restart: the waiting jobs were admitted once the first ended
    assert all(when(job, "admitted") >= when(done[0], "succeeded") for job in done[1:])
    records = read_metrics(str(svc.runs / "trains"))
    gap = max(b["time"] - a["time"] for a, b in zip(records, records[1:]))
    print(
        f"GCS restart with Redis: down {restarted_at - killed_at:.1f} s, the running job's longest "
        f"pause between logged steps {gap:.1f} s, 0 steps lost, 3 of 3 jobs succeeded once"
    )


@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_a_head_lost_without_redis_keeps_the_queue_and_the_next_up_resumes_its_jobs(tmp_path, s3):
    """The job store and the checkpoints on S3 (`up --store s3://...`): the submission's
    package, the records and the lease live in the bucket; a new head takes them over."""
    heads = [start_ray_head(num_cpus=4, resources={"slot": 2})]
    svc = Service(heads[0], tmp_path / "home", s3.uri("head-lost", "store"), s3.uri("head-lost", "runs"))
    serving = False  # whether a service is up on a live head, for `down` at the end
    try:
        svc.up()
        serving = True
        name = svc.paced("trains-on-s3", 0.02)  # still training when the head dies
        # one worker that holds both slots (half the CPU of two at each start): no room beside it
        one_of_two = ("resources.custom_per_worker.slot=2", "checkpoint.every_steps=200")
        trains = svc.submit(*one_of_two, steps=1000, name=name, workers=1)
        waits = svc.submit("resources.num_workers=1", steps=30, name="waits")
        svc.wait(trains, lambda j: j["state"] == "running", what="running")
        deadline = time.time() + 120  # until its metrics log (flushed every few seconds) has step 500
        while not (steps := logged_steps(f"{svc.runs}/{name}")) or steps[-1] < 500:
            assert time.time() < deadline, "no step 500 in the metrics log"
            time.sleep(0.5)
        # the head machine dies: every process of the cluster at once, the service among them
        machine = [psutil.Process(heads[0].process.pid), *processes_of(heads[0])]
        machine += [c for p in list(machine) for c in p.children(recursive=True)]  # workers, drivers
        killed_at, serving = time.time(), False
        for process in machine:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGKILL)
        psutil.wait_procs(machine, timeout=30)
        running = [p for p in machine if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not processes_of(heads[0]) and not running
        saved = max(
            checkpoint_step(c) for c in checkpoints(f"{svc.runs}/{name}") if incomplete_reason(c) is None
        )
        trained = train_steps(f"{svc.runs}/{name}")[-1]  # the log is flushed every few seconds
        stored = {job_id: svc.job(job_id)["state"] for job_id in (trains, waits)}
        assert stored == {trains: "running", waits: "queued"}  # the store kept the queue as it was
        assert f"{trains}.zip" in s3.files(
            "head-lost", "store", "packages"
        )  # the project it runs, in the bucket
        assert "service.json" in s3.files("head-lost", "store")  # the dead service's lease

        heads.append(start_ray_head(num_cpus=4, resources={"slot": 2}))  # a new head, the same store
        svc.head, svc.env = heads[1], {**heads[1].env, "ORCHESTRATOR_HOME": str(svc.home)}
        svc.up()
        serving, back_at = True, time.time()
        svc.release(name)
        first, second = svc.done(trains, timeout=300), svc.done(waits, timeout=300)
        assert first["summary"]["resumed_from_step"] == saved >= 400  # its newest complete checkpoint
        assert trained - saved <= 200 and first["steps_lost"] <= 200  # at most the checkpoint interval
        # the new service finds the old head's node gone: the job is requeued at its place and
        # started again by a new driver, once; the waiting job ran once, after it
        assert events(first).count("node-lost") == 1 and first["attempt"] == 2 and second["attempt"] == 1
        assert when(second, "admitted") >= when(first, "succeeded")  # the queue's order held
        steps = train_steps(f"{svc.runs}/{name}")
        assert steps == list(range(5, 1001, 5))  # each step once in the log: the lost ones were redone
        print(
            f"head lost without Redis: resumed at step {saved} (trained to >= {trained}); "
            f"the next up -> training again {when(first, 'running', 1) - back_at:.1f} s; "
            f"kill -> next up {back_at - killed_at:.1f} s (the test's own pace)"
        )
    finally:
        if serving:
            svc.cli("down", timeout=60)
        for head in heads:
            stop_ray_head(head)
            assert not processes_of(head)
