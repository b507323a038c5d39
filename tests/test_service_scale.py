"""bench/service_scale.py at a small size (50 running, 500 queued): what it measures is what it
says. Every job submitted is in the queue's data, the status page's first page and search come
from the service's own paging, `/api/queue?waiting=N` and `orchestrator queue` show the running
jobs and the head of the queue with a count of the rest,
and the drivers' reports fold into `status`, the exporter and `/metrics`. No timings are
asserted: the machine decides those. No Ray cluster: the service runs against the bench's fakes.
"""

import time

import pytest

from bench import service_scale

RUNNING, QUEUED = 50, 500


@pytest.fixture(scope="module")
def measured():
    return service_scale.measure(RUNNING, QUEUED, history=30)


def test_every_figure_is_measured(measured):
    figures, _ = measured
    assert set(service_scale.GOALS) <= set(figures)
    assert all(value >= 0 for value in figures.values())
    assert figures["submit_per_s"] > 0 and figures["reports_per_s"] > 0


def test_every_job_is_in_the_queue_data_in_order(measured):
    _, read = measured
    bench = read["bench"]
    everyone = read["api_queue_s"]
    assert {view["id"] for view in everyone} == set(bench.drivers) | set(bench.queued_ids)
    states = [view["state"] for view in everyone]
    assert states == ["running"] * RUNNING + ["queued"] * QUEUED  # holding resources first
    page = read["api_queue_page_s"]
    assert [view["id"] for view in page] == [view["id"] for view in everyone][
        : RUNNING + service_scale.WAITING
    ]


def test_the_pages_first_page_and_search_come_from_the_service(measured):
    _, read = measured
    bench, everyone = read["bench"], read["api_queue_s"]
    first = read["api_queue_first_page_s"]
    assert [view["id"] for view in first["jobs"]] == [view["id"] for view in everyone][: service_scale.PAGE]
    assert first["total"] == RUNNING + QUEUED and first["counts"] == {"running": RUNNING, "queued": QUEUED}
    assert all(view["live"] is not None for view in first["jobs"])  # the running jobs' newest rates
    found = read["api_queue_search_s"]
    assert [view["id"] for view in found["jobs"]] == [bench.queued_ids[-1]]
    assert found["total"] == 1 and found["counts"] == {"queued": 1}


def test_the_services_pages_follow_its_queue_order_states_and_search(tmp_path):
    """`queue_page` on the real service: any slice of its queue order, its states picked, and
    a search through its jobs' names and the scheduler's notes, counted by state."""
    from orchestrator.monitoring.queue_query import QueueQuery

    bench = service_scale.Bench(4, 40, history=1, tmp=tmp_path)
    try:
        bench.fill()
        service = bench.service
        ordered = [view["id"] for view in service.queue(include_finished=True)]
        for offset, limit in ((0, 3), (2, 5), (40, 10)):  # across the running and waiting, and the end
            page = service.queue_page(QueueQuery(offset=offset, limit=limit))
            assert [view["id"] for view in page["jobs"]] == ordered[offset : offset + limit]
            assert page["total"] == len(ordered)
        waiting = service.queue_page(QueueQuery(states=frozenset({"queued"}), limit=500))
        queued = [job_id for job_id in ordered if service.jobs[job_id].state.value == "queued"]
        assert [view["id"] for view in waiting["jobs"]] == queued and set(queued) == set(bench.queued_ids)
        theirs = [job for job in service.jobs.values() if job.name == "scale-w4"]
        found = service.queue_page(QueueQuery(words=("scale-w4",), limit=500))
        assert [view["id"] for view in found["jobs"]] == [
            i for i in ordered if service.jobs[i].name == "scale-w4"
        ]
        counts: dict[str, int] = {}
        for job in theirs:
            counts[job.state.value] = counts.get(job.state.value, 0) + 1
        assert found["counts"] == counts and len(counts) == 2  # running and waiting ones
        # the scheduler's note on each waiting job, which its record does not keep, is searched too
        service.tick()  # a pass after the last submission (the woken loop's may not have run yet)
        views = service.queue(include_finished=True)
        behind = [view["id"] for view in views if "behind" in (view["note"] or "")]
        page = service.queue_page(QueueQuery(words=("behind",), limit=500))
        assert behind and [view["id"] for view in page["jobs"]] == behind
    finally:
        bench.close()


def test_the_queue_command_shows_the_running_and_counts_the_rest(measured):
    _, read = measured
    bench, out = read["bench"], read["cli_queue_s"]
    assert all(job_id in out for job_id in bench.drivers)
    assert f"and {QUEUED - service_scale.WAITING} more waiting" in out


def test_reports_fold_into_status_the_exporter_and_metrics(measured):
    _, read = measured
    bench = read["bench"]
    job_id, driver = next(iter(bench.drivers.items()))
    status = read["api_status_s"]
    assert status["id"] == job_id and status["step"] == driver.step
    assert status["state"] == "running" and status["last_checkpoint"] == driver.checkpoint
    assert "history" in status and status["ledger"]["buckets"]["training"] > 0
    snapshot = {job["id"]: job for job in read["exporter_snapshot_s"]["jobs"]}
    newest_logged = (
        driver.step // service_scale.service_fakes.LOG_EVERY * service_scale.service_fakes.LOG_EVERY
    )
    assert snapshot[job_id]["latest"]["step"] == newest_logged
    assert len(snapshot[job_id]["ranks"]) == len(driver.workers) - 1
    text = read["metrics_http_s"].decode()
    for running in bench.drivers:
        assert f'orchestrator_train_step{{job="{running}",rank="0"}}' in text
    assert f'orchestrator_queue_length{{priority="0"}} {QUEUED // 2}' in text


def test_waiting_jobs_are_counted_by_queue_and_priority_not_listed(measured):
    _, read = measured
    bench, snapshot = read["bench"], read["exporter_snapshot_s"]
    assert {job["id"] for job in snapshot["jobs"]} == set(bench.drivers)  # no waiting job's view
    assert sum(group["jobs"] for group in snapshot["waiting"]) == QUEUED
    asked = sum(
        bench.service.jobs[job_id].workers * bench.service.jobs[job_id].per_worker.get("GPU", 0.0)
        for job_id in bench.queued_ids
    )
    assert sum(group["demand"].get("GPU", 0.0) for group in snapshot["waiting"]) == asked
    text = read["metrics_http_s"].decode()
    assert not any(f'job="{job_id}"' in text for job_id in bench.queued_ids)
    for level in (0, 3):  # the benchmark queues half at each
        line = f'orchestrator_queue_pending_jobs{{priority="{level}",queue="default",state="queued"}}'
        assert f"{line} {QUEUED // 2}.0" in text
        assert f'orchestrator_queue_oldest_wait_seconds{{priority="{level}",queue="default"}}' in text


def test_the_status_command_reads_the_job(measured):
    _, read = measured
    job_id = next(iter(read["bench"].drivers))
    assert job_id in read["cli_status_s"] and "running" in read["cli_status_s"]


def test_a_page_polling_a_job_with_nothing_new_reads_no_metrics_log(tmp_path, monkeypatch):
    """The page asks every running job for records past the newest it has, every few seconds:
    when the service's memory holds the job's newest records and none is newer, that is an
    empty answer, not a read of the run's metrics log in storage (1,000 reads a poll at scale)."""
    from orchestrator.service import live

    bench = service_scale.Bench(2, 1, history=10, tmp=tmp_path)
    try:
        bench.fill()
        bench.warm()
        job_id, driver = next(iter(bench.drivers.items()))
        newest = bench.service.metrics_since(job_id, -1, 120)[-1]["step"]
        reads = []
        monkeypatch.setattr(live.metrics_log, "read_metrics", lambda uri: reads.append(uri) or [])
        assert bench.service.metrics_since(job_id, newest, 120) == []
        assert reads == []
        steps = 2 * service_scale.service_fakes.LOG_EVERY  # newer records, from memory
        bench.service.report(job_id, driver.attempt, driver.report(steps, time.time()))
        newer = bench.service.metrics_since(job_id, newest, 120)
        assert newer and all(r["step"] > newest for r in newer) and reads == []
    finally:
        bench.close()


def test_fifty_spec_files_sent_at_once_into_one_storage_path_are_all_queued_and_leave_nothing(tmp_path):
    """The service's one way in, 50 threads at once, one storage path: every submission is
    read, checked, its storage probed and queued (a probe named per process once refused a
    valid job: one submission deleted another's probe), and no probe is left behind."""
    bench = service_scale.Bench(2, 0, history=1, tmp=tmp_path)
    try:
        bench.fill()
        replies = bench.sent_at_once(50, threads=50)
        refused = [reply for reply in replies if isinstance(reply, str)]
        assert refused == []
        ids = [view["id"] for reply in replies for view in reply["jobs"]]
        assert len(ids) == len(set(ids)) == 50
        queued = [job for job in bench.service.jobs.values() if job.spec.name.startswith("at-once-")]
        assert len(queued) == 50
        assert {job.spec.checkpoint.storage for job in queued} == {str(tmp_path / "checkpoints")}
    finally:
        bench.close()
    left = sorted(p.name for p in tmp_path.rglob("*") if ".write-probe" in p.name or ".tmp-" in p.name)
    assert left == []
