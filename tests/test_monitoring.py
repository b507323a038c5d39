"""Monitoring of a real job on a real cluster (the session's orchestrator service): its metrics in
Prometheus' text format (checked by `promtool`), scraped by a real Prometheus server started
with the shipped configuration, the status page in headless Chromium, and the Grafana
dashboard against the metrics the exporter can produce.

Debian's `prometheus` (with `promtool`) and `chromium` + `chromium-driver` are installed by
.ci/run where apt is available; a test that needs one skips only when it is not installed.
"""

import contextlib
import json
import math
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.monitoring.exporter import EXPORTED
from orchestrator.monitoring.prometheus_config import DISCOVERY_FILE, prometheus_config
from tests.conftest import ROOT

HOSTILE = "<img src=x onerror=alert(1)>"


def fetch(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def samples(text: str, name: str, job: str) -> list:
    return [
        s
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and s.labels.get("job") == job
    ]


@pytest.fixture(scope="module")
def running(service):
    """A long 2-worker job, running, with checkpoint storage whose path holds HTML."""
    storage = service.runs / f"monitored-{HOSTILE}"
    job_id = service.submit(
        "checkpoint.every_steps=50",
        f"checkpoint.storage={storage}",
        name=service.paced("monitored", 0.05),  # it leaves the CPUs to the scrapes and the page
        steps=200000,
    )
    service.wait(job_id, lambda j: j["state"] == "running" and j["step"] >= 50, what="a running job")
    yield job_id
    service.cli("stop", job_id, "--now")


@pytest.mark.timeout(300)
def test_a_running_jobs_metrics_move_and_pass_promtool(service, running, tmp_path):
    first = fetch(f"{service.page}metrics")
    deadline = time.time() + 60
    while time.time() < deadline:
        time.sleep(2)
        second = fetch(f"{service.page}metrics")
        step_before = samples(first, "orchestrator_train_step", running)[0].value
        step_after = samples(second, "orchestrator_train_step", running)[0].value
        if step_after > step_before:
            break
    assert step_after > step_before  # the step moves between scrapes
    (loss,) = samples(second, "orchestrator_train_loss", running)
    assert math.isfinite(loss.value) and loss.labels["rank"] == "0"
    # the step time split of both ranks: rank 1's arrives on its own, at most every second or so
    deadline = time.time() + 30
    while True:
        phases = {
            (s.labels["rank"], s.labels["phase"])
            for s in samples(second, "orchestrator_train_step_phase_seconds", running)
        }
        if len(phases) == 8 or time.time() > deadline:
            break
        time.sleep(1)
        second = fetch(f"{service.page}metrics")
    # sync: a DDP rank's wait for the other at the end of its backward (CPU)
    assert phases == {(r, p) for r in ("0", "1") for p in ("data", "compute", "sync", "optimizer")}
    assert samples(second, "orchestrator_train_grad_norm", running)[0].value > 0
    states = {s.labels["state"]: s.value for s in samples(second, "orchestrator_job_state", running)}
    assert states["running"] == 1.0 and sum(states.values()) == 1.0
    saves = samples(second, "orchestrator_checkpoint_save_seconds_count", running)
    assert saves and saves[0].value >= 1  # a histogram of the saves so far
    busy = [
        s
        for f in text_string_to_metric_families(second)
        for s in f.samples
        if s.name == "orchestrator_cluster_resources" and s.labels == {"resource": "slot", "state": "busy"}
    ]
    assert busy and busy[0].value == 2.0
    assert "step=" not in second  # no per-step label, ever

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed here (apt-get install prometheus)")
    check = subprocess.run(
        [promtool, "check", "metrics"], input=second, capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_shipped_prometheus_config_is_the_one_up_writes_for_the_default_addresses():
    assert (ROOT / "deploy/prometheus/prometheus.yml").read_text() == prometheus_config()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def prometheus(config: str, tmp_path: Path):
    """A real Prometheus (Debian's package) with `config` (scraping every second); yields a
    function from a PromQL query to its result, [] until there is one."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("Prometheus is not installed here (apt-get install prometheus)")
    (tmp_path / "prometheus.yml").write_text(config.replace("scrape_interval: 5s", "scrape_interval: 1s"))
    port = _free_port()
    server = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "prometheus.log", "w"),
    )

    def query(promql: str) -> list:
        try:
            answer = fetch(f"http://127.0.0.1:{port}/api/v1/query?query={urllib.parse.quote(promql)}")
        except OSError:
            return []  # still starting
        return json.loads(answer)["data"]["result"]

    try:
        yield query
    finally:
        server.terminate()
        server.wait(30)


def wait_for(query, promql: str, tmp_path: Path, timeout: float = 90.0) -> list:
    deadline, result = time.time() + timeout, []
    while time.time() < deadline and not result:
        time.sleep(1)
        result = query(promql)
    assert result, f"{promql}: nothing; " + (tmp_path / "prometheus.log").read_text()[-3000:]
    return result


@pytest.mark.timeout(300)
def test_a_prometheus_server_with_the_shipped_config_finds_the_jobs_loss(service, running, tmp_path):
    page = urllib.parse.urlparse(service.page)
    discovery = Path(service.head.temp_dir) / "ray" / DISCOVERY_FILE
    config = prometheus_config(f"{page.hostname}:{page.port}", str(discovery))  # the shipped one's shape
    with prometheus(config, tmp_path) as query:
        result = wait_for(query, f'orchestrator_train_loss{{job="{running}"}}', tmp_path)
        assert result[0]["metric"]["job"] == running  # honor_labels: our job label, not the scrape job's
        assert math.isfinite(float(result[0]["value"][1]))


def _browser():
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not (chromium and driver):
        pytest.skip("Chromium is not installed here (apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service as DriverService

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(flag)
    return webdriver.Chrome(service=DriverService(driver), options=options)


def _wait(predicate, timeout: float = 60.0, what: str = "the page"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if predicate():
                return
        except Exception:  # the element is not there yet
            pass
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.timeout(300)
def test_the_status_page_shows_the_running_jobs_curve_and_escapes_spec_strings(service, running, tmp_path):
    browser = _browser()
    try:
        browser.get(f"{service.page}#/jobs/{urllib.parse.quote(running)}")
        points = "return +document.getElementById('chart-loss').dataset.points"
        _wait(lambda: browser.execute_script(points) > 0, what="points on the running job's loss curve")
        first = browser.execute_script(points)
        _wait(lambda: browser.execute_script(points) > first, what="the curve to grow without a reload")
        _wait(lambda: HOSTILE in browser.find_element("tag name", "body").text, what="the checkpoint URIs")
        assert browser.find_elements("css selector", "img") == []  # shown as text, never as markup
        assert browser.execute_script("return window.__pwned") is None
        link = browser.find_element("css selector", f'a[href*="{running}"]')
        assert link.get_attribute("href").startswith(service.head.dashboard)
        shot = Path(os.environ.get("ORCHESTRATOR_SCREENSHOT_DIR") or tempfile.mkdtemp()) / "status-page.png"
        shot.parent.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(shot))
        assert shot.stat().st_size > 20_000
    finally:
        browser.quit()


def dashboard_queries(node) -> list[str]:
    """Every PromQL query (`expr`) anywhere in a Grafana dashboard's JSON."""
    if isinstance(node, dict):
        own = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return own + [q for value in node.values() for q in dashboard_queries(value)]
    if isinstance(node, list):
        return [q for value in node for q in dashboard_queries(value)]
    return []


def test_the_grafana_dashboard_asks_only_for_exported_metrics():
    dashboard = json.loads((ROOT / "deploy/grafana/orchestrator.json").read_text())
    assert dashboard["uid"] and [v["name"] for v in dashboard["templating"]["list"]] == ["datasource", "job"]
    exprs = dashboard_queries(dashboard)
    assert len(exprs) >= 20
    exported = set(EXPORTED) | {f"{n}_{s}" for n in EXPORTED for s in ("bucket", "sum", "count")}
    for expr in exprs:
        names = set(re.findall(r"\borchestrator_[a-z0-9_]+", expr))
        assert names and names <= exported, f"{expr}: {names - exported}"
    variable = dashboard["templating"]["list"][1]["query"]["query"]
    assert re.findall(r"orchestrator_[a-z_]+", variable)[0] in exported
    panels = {p["title"] for p in dashboard["panels"]}
    for wanted in (
        "Train loss",
        "MFU",
        "Device memory",
        "Step time by phase",
        "Job states",
        "Queue length by priority",
    ):
        assert wanted in panels
