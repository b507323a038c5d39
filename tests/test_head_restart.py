"""The head's GCS dies and comes back: with Ray's GCS fault tolerance (backed by a real Redis,
Debian's `redis-server`), the service, the running job and the queue carry on; no job is lost
and none runs twice.

A cluster of its own: a head (without --block, as `orchestrator up` starts one) whose GCS
keeps its tables in Redis, and one more node; the service on it through `orchestrator up`.
"""

import json

import psutil
import pytest

from core.metrics_log import read_metrics
from tests.conftest import Service
from tests.ray_cluster import restart_gcs, start_ray_head, start_redis, stop_ray_head
from tests.test_service import events, when


@pytest.fixture(scope="module")
def ft_service(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ft")
    redis = start_redis()
    head = start_ray_head(num_cpus=4, resources={"slot": 1}, redis=redis.address)
    svc = Service(head, tmp / "home", tmp / "store", tmp / "runs")
    try:
        head.add_node("node-1", 2, {"slot": 1})
        up = svc.cli("up", "--address", head.address, "--store", str(svc.store), "--metrics-port", "0")
        assert up.returncode == 0, up.stdout + up.stderr
        yield svc
    finally:
        svc.cli("down", timeout=60)
        stop_ray_head(head)
        redis.stop()
        left = [
            p for p in psutil.process_iter(["cmdline"]) if head.temp_dir in " ".join(p.info["cmdline"] or [])
        ]
        assert not left, f"processes of the cluster left running: {left}"


@pytest.mark.timeout(600)
def test_a_gcs_restart_with_redis_loses_no_job_and_runs_none_twice(ft_service):
    svc = ft_service
    info = json.loads((svc.home / "cluster.json").read_text())
    assert info["address"] == svc.head.address
    trains = svc.submit("checkpoint.every_steps=400", steps=1200, name="trains")
    # no room beside it; once it ends, the two fit together
    waiting = [svc.submit("resources.num_workers=1", steps=30, name=f"waits-{i}") for i in range(2)]
    svc.wait(trains, lambda j: j["state"] == "running" and j["step"] >= 200, what="step 200")
    killed_at, restarted_at = restart_gcs(svc.head, down_s=3.0)

    done = [svc.done(job_id, timeout=400) for job_id in (trains, *waiting)]
    for job in done:  # each ran once: one admission, one attempt, nothing lost
        assert events(job).count("admitted") == 1 and job["attempt"] == 1, job["history"]
        assert job["steps_lost"] == 0
    steps = [r["step"] for r in read_metrics(str(svc.runs / "trains")) if "loss" in r]
    assert steps == list(range(5, 1201, 5))  # every step once: training never stopped
    # the queue moved on after the restart: the waiting jobs were admitted once the first ended
    assert all(when(job, "admitted") >= when(done[0], "succeeded") for job in done[1:])
    records = read_metrics(str(svc.runs / "trains"))
    gap = max(b["time"] - a["time"] for a, b in zip(records, records[1:]))
    print(
        f"GCS restart with Redis: down {restarted_at - killed_at:.1f} s, the running job's longest "
        f"pause between logged steps {gap:.1f} s, 0 steps lost, 3 of 3 jobs succeeded once"
    )
