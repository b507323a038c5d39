"""bench/service_scale.py at a small size (50 running, 500 queued): what it measures is what it
says. Every job submitted is in the queue's data, the first page of `/api/queue` and
`orchestrator queue` show the running jobs and the head of the queue with a count of the rest,
and the drivers' reports fold into `status`, the exporter and `/metrics`. No timings are
asserted: the machine decides those. No Ray cluster: the service runs against the bench's fakes.
"""

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
