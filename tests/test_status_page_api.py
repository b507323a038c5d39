"""The status page's HTTP API on a real server fed by a fake service: the static page and its
assets, `/api/info`, `/api/queue` (pages, searches), a job's view, its metrics, Prometheus
metrics, and jobs sent over HTTP (the CLI's quick `submit`)."""

from __future__ import annotations

import re
import socket
import time
import urllib.parse
from pathlib import Path

import prometheus_client
import pytest

from core.ledger import BUCKETS, LOST, STALLED, STOPPING
from orchestrator.monitoring import web
from orchestrator.monitoring.queue_query import MAX_LIMIT
from orchestrator.monitoring.web import make_app, serve
from tests.status_page_fake import FakeService
from tests.status_page_helpers import DASHBOARD, by_state, fetch, fetch_json

pytest_plugins = ["tests.status_page_fixtures"]  # the fixtures `registry`, `served`, `browser`


# --- the API -----------------------------------------------------------------------------------------


def test_serve_binds_loopback_on_a_free_port_and_stops():
    server, url = serve(make_app(FakeService()), "127.0.0.1", 0)
    parsed = urllib.parse.urlparse(url)
    assert parsed.hostname == "127.0.0.1" and parsed.port and parsed.port > 0
    assert fetch(url)[0] == 200
    server.stop()
    server.stop()  # a second stop is harmless
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", parsed.port), timeout=2).close()


def test_page_is_static_and_carries_no_service_data(served):
    source, url = served
    status, headers, body = fetch(url)
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert body == (Path(web.__file__).parent / "static" / "index.html").read_bytes()
    page = body.decode()
    for job in source.jobs.values():  # every value arrives later, through the API, as text
        assert job["id"] not in page and job["name"] not in page
    assert "s3://" not in page and DASHBOARD not in page
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    assert "<script>" not in page  # no inline script: the policy would refuse it anyway
    for src in ("static/uPlot.iife.min.js", "static/app.js", "static/app.css", "static/uPlot.min.css"):
        assert src in page and "//" not in src  # served here, no CDN


def test_static_assets_and_uplot_license(served):
    _, url = served
    status, headers, body = fetch(url + "static/app.js")
    assert status == 200 and "javascript" in headers["Content-Type"]
    # the page writes text nodes only: no HTML parsing of any value
    assert not re.search(
        rb"(inner|outer)HTML\s*\+?=|insertAdjacentHTML|document\.write|createContextualFragment", body
    )
    status, _, body = fetch(url + "static/uPlot.iife.min.js")
    assert status == 200 and body.startswith(b"/*! https://github.com/leeoniya/uPlot (v1.6.32) */")
    status, headers, body = fetch(url + "static/uPlot.min.css")
    assert status == 200 and headers["Content-Type"].startswith("text/css")
    status, _, body = fetch(url + "static/uPlot.LICENSE")
    assert status == 200 and b"MIT License" in body and b"Leon Sorokin" in body
    assert fetch(url + "static/nothing.js")[0] == 404
    assert fetch(url + "static/%2e%2e/web.py")[0] in (403, 404)  # nothing outside the folder


def test_info_and_queue(served):
    source, url = served
    status, info = fetch_json(url + "api/info")
    assert status == 200 and info["generation"] == 3 and info["dashboard"] == DASHBOARD
    assert info["jobs"]["running"] == 2 and info["resources"]["total"]["GPU"] == 32.0
    status, queue = fetch_json(url + "api/queue")
    assert status == 200 and [j["id"] for j in queue] == list(source.jobs)
    views = {j["id"]: j for j in queue}
    gpt = views[source.running_id]
    assert "history" not in gpt and gpt["step"] == 8000 and gpt["total_steps"] == 30000
    newest = [r for r in source.records[source.running_id] if "loss" in r][-1]
    assert gpt["live"]["step"] == newest["step"] and gpt["live"]["mfu"] == pytest.approx(newest["mfu"])
    assert gpt["live"]["tokens_per_s"] == pytest.approx(newest["tokens_per_s"])
    assert gpt["restarts"] == 1  # two admissions, no preemption: the driver died once
    preempted = views["vit-small-distill-1123-0820-5b11"]
    assert preempted["live"] is None and preempted["restarts"] == 0  # waiting: no rate shown
    done = views["convnet-fashion-1123-0700-11aa"]
    assert done["live"]["samples_per_s"] == 41250.0 and done["live"]["loss"] == 0.284


def test_queue_reads_running_jobs_metrics_incrementally(served):
    source, url = served
    fetch_json(url + "api/queue")
    first = [since for job, since in source.metrics_calls if job == source.running_id]
    assert first == [-1]
    with source.lock:
        source._train(source.running_id, 100)
    source.metrics_calls.clear()
    _, queue = fetch_json(url + "api/queue")
    assert (source.running_id, 8000) in source.metrics_calls  # only records past the last step seen
    assert {job for job, _ in source.metrics_calls} == {
        j["id"] for j in queue if j["state"] in ("admitted", "running", "stopping")
    }
    assert next(j for j in queue if j["id"] == source.running_id)["live"]["step"] == 8100
    # `orchestrator queue` asks for the views alone: no job's metrics read, no rates or trails
    source.metrics_calls.clear()
    _, plain = fetch_json(url + "api/queue?rates=0")
    assert source.metrics_calls == [] and [j["id"] for j in plain] == [j["id"] for j in queue]
    assert not any({"live", "loss_trail", "restarts"} & set(j) for j in plain)


def test_queue_pages_and_searches_on_the_server(served):
    source, url = served
    waiting = source.add_waiting(300)
    _, everyone = fetch_json(url + "api/queue?rates=0")  # the plain list of older callers: unchanged
    assert isinstance(everyone, list) and len(everyone) == len(source.jobs)
    ids = [view["id"] for view in everyone]

    status, first = fetch_json(url + "api/queue?limit=50")
    assert status == 200 and [view["id"] for view in first["jobs"]] == ids[:50]
    assert (first["offset"], first["limit"], first["total"]) == (0, 50, len(ids))
    assert first["counts"] == by_state(everyone)
    running = next(view for view in first["jobs"] if view["id"] == source.running_id)
    assert running["live"]["step"] == source.jobs[source.running_id]["step"]  # the page's rates
    _, last = fetch_json(url + "api/queue?offset=300&limit=50")
    assert [view["id"] for view in last["jobs"]] == ids[300:] and last["total"] == len(ids)

    # a job on no page but the last, by a word of its name and one of its queue, any case
    wanted = waiting[-23]
    source.page_queries.clear()
    _, found = fetch_json(url + f"api/queue?q={source.jobs[wanted]['name'].upper()}+BATCH")
    assert [view["id"] for view in found["jobs"]] == [wanted]
    assert found["total"] == 1 and found["counts"] == {"queued": 1}
    assert source.page_queries[-1].words == (source.jobs[wanted]["name"], "batch")
    # a note's words find the jobs waiting behind llama; a state narrows, the counts stay the search's
    _, behind = fetch_json(url + "api/queue?q=behind+LLAMA&state=preempted")
    noted = [v for v in everyone if "behind" in (v.get("note") or "") and "llama" in v["note"]]
    assert len(by_state(noted)) == 2  # one queued, one preempted
    assert behind["counts"] == by_state(noted) and behind["total"] == by_state(noted)["preempted"]
    assert {view["state"] for view in behind["jobs"]} == {"preempted"}

    source.metrics_calls.clear()
    _, queued = fetch_json(url + "api/queue?state=queued,preempted&offset=10&limit=5")
    pending = [view["id"] for view in everyone if view["state"] in ("queued", "preempted")]
    assert [view["id"] for view in queued["jobs"]] == pending[10:15] and queued["total"] == len(pending)
    assert source.metrics_calls == []  # no running job on this page: no job's metrics read
    _, unfinished = fetch_json(url + f"api/queue?finished=0&limit={MAX_LIMIT}")
    assert [view["id"] for view in unfinished["jobs"]] == [
        view["id"] for view in everyone if view["state"] not in ("succeeded", "failed", "stopped")
    ]


@pytest.mark.parametrize(
    "query, says",
    [
        ("limit=0", f"limit must be a whole number, 1 to {MAX_LIMIT}"),
        (f"limit={MAX_LIMIT + 1}", f"limit must be a whole number, 1 to {MAX_LIMIT}"),
        ("offset=-1", "offset must be a whole number, 0 or more"),
        ("offset=ten", "offset must be a whole number, 0 or more"),
        ("state=sideways", "unknown state 'sideways': one of queued, admitted"),
    ],
)
def test_a_page_asked_for_badly_is_refused_in_one_line(served, query, says):
    _, url = served
    status, reply = fetch_json(url + "api/queue?" + query)
    assert status == 400 and reply["error"].startswith(says) and "\n" not in reply["error"]


def test_job_view_with_history_and_checkpoints(served):
    source, url = served
    status, view = fetch_json(url + "api/jobs/" + source.running_id)
    assert status == 200 and view["id"] == source.running_id
    assert [h["event"] for h in view["history"]][:3] == ["queued", "admitted", "running"]
    assert view["checkpoints"][-1] == "s3://ml-checkpoints/gpt2-small-owt/checkpoint_008000"
    assert len(view["checkpoints"]) == 4 and view["restarts"] == 1
    status, error = fetch_json(url + "api/jobs/no-such-job")
    assert status == 404 and "no-such-job" in error["error"]


def test_job_views_carry_their_time_ledgers_and_info_the_clusters_goodput(served):
    source, url = served
    _, queue = fetch_json(url + "api/queue")
    views = {j["id"]: j for j in queue}
    done = "convnet-fashion-1123-0700-11aa"
    assert views[done]["ledger"] == source.ledgers[done].view(time.time())  # ended: it stays put
    for job_id in source.ledgers:
        ledger = views[job_id]["ledger"]
        assert list(ledger["buckets"]) == list(BUCKETS)
        assert sum(ledger["buckets"].values()) == pytest.approx(ledger["wall_s"])
        assert set(ledger["goodput"]) == {"scheduling", "runtime", "program", "time"}
    assert "ledger" not in views["gpt-nano-char-1123-0955-f00d"]  # a record from before ledgers
    gpt = views[source.running_id]["ledger"]
    assert gpt["buckets"][LOST] > 0 and gpt["buckets"][STALLED] > 0  # the driver hung, then died
    assert gpt["gpu_seconds"] == pytest.approx(8 * gpt["wall_s"])
    assert gpt["goodput"]["program"] == pytest.approx(source.mfu(source.running_id))
    _, vit = fetch_json(url + "api/jobs/vit-b16-imagenet-1123-1040-07be")
    assert vit["ledger"]["buckets"][LOST] > 0 and vit["ledger"]["buckets"][STOPPING] > 0  # preempted
    _, info = fetch_json(url + "api/info")
    expected = source.goodput(time.time())
    for factor in ("scheduling", "runtime", "program", "time"):
        assert info["goodput"][factor] == pytest.approx(getattr(expected, factor), abs=1e-4)


def test_metrics_since_step(served):
    source, url = served
    status, records = fetch_json(url + f"api/jobs/{source.running_id}/metrics?since=7900")
    assert status == 200
    assert [r["step"] for r in records] == [7925, 7950, 7975, 8000, 8000]  # the last one is an eval
    assert set(records[-1]) == {"step", "eval_loss", "eval_accuracy", "eval_perplexity"}
    status, everything = fetch_json(url + f"api/jobs/{source.running_id}/metrics")
    assert len(everything) == len(source.records[source.running_id])
    assert fetch_json(url + f"api/jobs/{source.running_id}/metrics?since=abc")[0] == 400
    assert fetch_json(url + "api/jobs/nope/metrics?since=0")[0] == 404


def test_non_finite_values_become_null(served):
    source, url = served
    with source.lock:
        source.records[source.running_id].append({"step": 99999, "loss": float("nan"), "mfu": float("inf")})
    _, records = fetch_json(url + f"api/jobs/{source.running_id}/metrics?since=8000")
    assert records == [{"step": 99999, "loss": None, "mfu": None}]  # JSON.parse accepts this


def test_prometheus_metrics(served):
    _, url = served
    status, headers, body = fetch(url + "metrics")
    assert status == 200 and headers["Content-Type"] == prometheus_client.CONTENT_TYPE_LATEST
    assert b'orchestrator_jobs{state="running"} 2.0' in body
    server, bare = serve(make_app(FakeService()), "127.0.0.1", 0)
    try:
        assert fetch(bare + "metrics")[0] == 404  # no registry given
    finally:
        server.stop()


def test_serve_reports_a_port_that_is_taken():
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        with pytest.raises(OSError):
            serve(make_app(FakeService()), "127.0.0.1", taken.getsockname()[1])
    finally:
        taken.close()


# --- submitting over HTTP (the CLI's quick `submit`) ---------------------------------------------


class RecordingSubmitter:
    """What the service does with jobs sent to POST /api/jobs: the schema check, then the queue."""

    def __init__(self, token):
        self.token, self.queued = token, []

    def submit_specs(self, specs, options, package):
        from core.spec import SpecError, validate

        try:
            typed = [validate(raw, "submitted spec") for raw in specs]
        except SpecError as err:
            raise ValueError(str(err).splitlines()[0]) from None
        self.queued += [(spec.name, option, package) for spec, option in zip(typed, options)]
        return [{"id": f"{spec.name}-1"} for spec in typed]


def test_jobs_sent_over_http_need_the_cluster_token_and_a_valid_spec():
    from core.spec import load_spec
    from orchestrator import client

    spec = load_spec("jobs/vit.yaml").model_dump(mode="json", by_alias=True)
    submitter = RecordingSubmitter("s3cret")
    server, url = serve(make_app(FakeService(), submitter=submitter), "127.0.0.1", 0)
    try:
        assert client.api_submit(url, "s3cret", [spec], [{}], b"zip bytes") == [{"id": "vit-fashion-mnist-1"}]
        assert submitter.queued == [("vit-fashion-mnist", {}, b"zip bytes")]
        # a wrong token queues nothing, and is final: the CLI says so, not tries the cluster
        with pytest.raises(client.Refused, match="^missing or wrong cluster token$"):
            client.api_submit(url, "guess", [spec], [{}], b"")
        bad = {**spec, "train": {**spec["train"], "steps": -1}}
        with pytest.raises(client.Refused, match=r"^submitted spec: train\.steps: "):
            client.api_submit(url, "s3cret", [bad], [{}], b"")
        assert len(submitter.queued) == 1
    finally:
        server.stop()
    # without the service's door, a cluster without token auth takes no jobs over HTTP
    server, url = serve(make_app(FakeService(), submitter=RecordingSubmitter(None)), "127.0.0.1", 0)
    try:
        with pytest.raises(client.Refused, match="only on a cluster with token auth"):
            client.api_submit(url, "anything", [spec], [{}], b"")
    finally:
        server.stop()
    read_only = serve(make_app(FakeService()), "127.0.0.1", 0)
    try:
        with pytest.raises(client.Refused, match="takes no jobs"):
            client.api_submit(read_only[1], "anything", [spec], [{}], b"")
    finally:
        read_only[0].stop()
