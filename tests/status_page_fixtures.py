"""The status page tests' fixtures, a pytest plugin their files name in `pytest_plugins`:
`registry` (a Prometheus registry), `served` (a fake service on a real server) and `browser`
(headless Chromium, one per test module; the tests skip without it)."""

from __future__ import annotations

import shutil

import prometheus_client
import pytest

from orchestrator.monitoring.web import make_app, serve
from tests.status_page_fake import FakeService

# --- serving ---------------------------------------------------------------------------------------


@pytest.fixture
def registry():
    reg = prometheus_client.CollectorRegistry()
    gauge = prometheus_client.Gauge("orchestrator_jobs", "Jobs by state", ["state"], registry=reg)
    gauge.labels(state="running").set(2)
    return reg


@pytest.fixture
def served(registry):
    """A real server on a free loopback port: (fake service, base url)."""
    source = FakeService()
    server, url = serve(make_app(source, registry), "127.0.0.1", 0)
    yield source, url
    server.stop()


# --- the page in a real browser ------------------------------------------------------------------------


def _browser_binaries() -> tuple[str, str] | None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (chromium, driver) if chromium and driver else None


@pytest.fixture(scope="module")
def browser():
    binaries = _browser_binaries()
    if binaries is None:
        pytest.skip("Chromium is not installed here (apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binaries[0]
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,900"):
        options.add_argument(arg)
    options.add_argument("--lang=en-US")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(binaries[1]), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()
