"""The orchestrator's live status page itself, in a real headless Chromium (Debian's `chromium`
+ `chromium-driver`) fed by a fake service whose running job keeps training while the browser
watches: the queue and live curves, spec strings as text, one page of 308 jobs and the search,
the dashboard link, and a service that cannot be reached.

The rest of the page: test_status_page_goodput.py (where each job's time went),
test_status_page_health.py (stragglers, hangs, avoided nodes), test_status_page_queues.py (the
queues panel); its HTTP API: test_status_page_api.py."""

from __future__ import annotations

import re
import time
import urllib.parse

from orchestrator.monitoring.web import make_app, serve
from tests.status_page_browser import (
    assert_scrolled_job_view_is_whole,
    clean_console,
    load,
    page_errors,
    points,
    save_full_page,
    wait_for,
)
from tests.status_page_fake import FakeService
from tests.status_page_helpers import ARTIFACTS, DASHBOARD, HOSTILE_NAME, HOSTILE_URI, SCREENSHOT, by_state

pytest_plugins = ["tests.status_page_fixtures"]  # the fixtures `registry`, `served`, `browser`


def test_page_shows_the_queue_and_live_curves(browser, registry):
    source = FakeService()
    server, url = serve(make_app(source, registry), "127.0.0.1", 0)
    source.start_training()
    try:
        clean_console(browser)
        browser.get(url)
        rows = wait_for(
            lambda: (
                browser.find_elements("css selector", "#queue-body tr")
                if len(browser.find_elements("css selector", "#queue-body tr")) == len(source.jobs)
                else None
            ),
            what="a row per job",
        )
        assert rows[0].get_attribute("data-job-id") == source.running_id
        table = browser.find_element("id", "queue").text
        for expected in ("gpt2-small-owt", "running", "preempted", "failed", "research", "8 × 1 GPU"):
            assert expected in table
        assert "3/2..4 × 1 GPU" in table  # an elastic job: its size now and its range
        facts = browser.find_element("id", "facts").text
        assert "51c7e0aa draining" in facts and "77be01f2 joined 2m" in facts  # node events
        assert "autoscaler may add 2 gpu-8x" in facts and "cpu-16" not in facts  # room left to grow
        # the running job's newest losses, as a line in its row, that follows the job
        spark = browser.find_element("css selector", f'[data-job-id="{source.running_id}"] svg.spark')
        wait_for(lambda: int(spark.get_attribute("data-points") or 0) >= 2, what="the loss sparkline")
        newest = lambda: int(
            re.search(r"–([\d,]+):", spark.get_attribute("aria-label")).group(1).replace(",", "")
        )  # noqa: E731
        shown = newest()
        wait_for(lambda: newest() > shown, what="the sparkline to follow the job")
        assert spark.is_displayed() and spark.size["width"] >= 100
        drawn = "return [...document.querySelectorAll('svg.spark')].filter(s => s.dataset.points >= 2).length"
        assert browser.execute_script(drawn) == 1  # only the running job has one
        assert "loss is not finite at or before step 3100" in table  # the failed job's reason
        failed_badge = browser.find_element("css selector", '[data-job-id^="gpt-nano-char"] .badge')
        assert "s-failed" in failed_badge.get_attribute("class")
        link = browser.find_element("css selector", f'[data-job-id="{source.running_id}"] a.ext')
        assert link.get_attribute("href") == f"{DASHBOARD}/#/jobs/{source.running_id}-a2"
        assert browser.find_element("id", "dashboard-link").get_attribute("href") == DASHBOARD + "/"

        browser.execute_script("window.__sameDocument = true")
        rows[0].click()
        wait_for(lambda: points(browser, "loss") > 0, what="the loss curve")
        assert browser.current_url.endswith("#/jobs/" + source.running_id)
        assert_scrolled_job_view_is_whole(browser)
        first = points(browser, "loss")
        assert first >= 320  # the 8,000 steps logged before the page opened, every 25 steps
        wait_for(lambda: points(browser, "loss") >= first + 10, what="new points on the loss curve")
        assert browser.execute_script("return window.__sameDocument") is True  # no reload
        counts = browser.execute_script(
            "return ['loss', 'eval', 'rate'].map(c => +document.getElementById('chart-' + c).dataset.points)"
        )
        assert counts[1] >= 8 and counts[2] == counts[0]  # eval every 1,000 steps; a rate per step
        uplot = browser.execute_script(
            "return document.querySelectorAll('#chart-loss .uplot canvas, #chart-eval .uplot canvas').length"
        )
        assert uplot == 2

        panel = browser.find_element("id", "job")
        assert "s3://ml-checkpoints/gpt2-small-owt/checkpoint_008000" in panel.text
        assert "driver-exited" in panel.text and "node-2f9c61 × 4" in panel.text
        job_link = browser.find_element("id", "job-dashboard")
        assert job_link.get_attribute("href") == f"{DASHBOARD}/#/jobs/{source.running_id}-a2"

        source.stop_training()
        time.sleep(2.5)  # one more poll, so the screenshot shows settled values
        save_full_page(browser, SCREENSHOT)
        assert page_errors(browser) == []
    finally:
        source.stop_training()
        browser.set_window_size(1400, 900)
        server.stop()


def test_spec_strings_are_shown_as_text_never_as_markup(browser):
    source = FakeService(hostile=True)
    server, url = serve(make_app(source), "127.0.0.1", 0)
    try:
        clean_console(browser)
        browser.get(url)
        wait_for(
            lambda: HOSTILE_NAME in browser.find_element("id", "queue").text, what="the hostile job's row"
        )
        browser.find_element("css selector", f'[data-job-id="{source.hostile_id}"]').click()
        wait_for(lambda: points(browser, "loss") == 2, what="the hostile job's curve")
        panel = browser.find_element("id", "job").text
        assert HOSTILE_NAME in browser.find_element("id", "job-name").text
        assert "<b>oops</b><script>window.__pwned = true</script>" in panel  # the reason, as text
        assert "<svg onload=alert(3)>" in panel and HOSTILE_URI in panel and "<img src=x>" in panel
        assert "<img src=x onerror=alert(5)>" in panel  # a history detail
        save_full_page(browser, ARTIFACTS / "status-page-hostile.png")
        assert browser.execute_script("return document.querySelectorAll('img, svg image, b, i').length") == 0
        scripts = browser.execute_script(
            "return Array.from(document.scripts).map(s => s.getAttribute('src'))"
        )
        assert scripts == ["static/uPlot.iife.min.js", "static/app.js"]
        # the logo, and the page's own loss lines (one per queue row, drawn only for running jobs)
        svgs = "return [...document.querySelectorAll('svg')].map(s => s.getAttribute('class'))"
        assert sorted(browser.execute_script(svgs)) == ["logo"] + ["spark"] * len(source.jobs)
        assert browser.execute_script("return window.__pwned === undefined") is True
        # a submission id is a URL component, never markup or a way out of the attribute
        href = browser.find_element("id", "job-dashboard").get_attribute("href")
        assert href == DASHBOARD + "/#/jobs/" + urllib.parse.quote(
            'x"><img src=x onerror=alert(4)>', safe="()!*'~"
        )  # as encodeURIComponent
        assert page_errors(browser) == []
    finally:
        browser.set_window_size(1400, 900)
        server.stop()


READ_ROWS = "return [...document.querySelectorAll('#queue-body tr')].map(tr => tr.dataset.jobId)"
READ_TILES = """
return Object.fromEntries([...document.querySelectorAll('#counts .tile')].map(
  t => [t.querySelector('.label').textContent, t.querySelector('.n').textContent]));
"""


def type_search(browser, text: str) -> None:
    box = browser.find_element("id", "filter")
    browser.execute_script("arguments[0].value = ''", box)
    box.send_keys(text) if text else browser.execute_script(
        "arguments[0].dispatchEvent(new Event('input'))", box
    )


def press(browser, element) -> None:
    """Click `element` as a person does: scrolled into view first, clear of the sticky top bar."""
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", element)
    element.click()


def test_page_lists_one_page_and_its_search_asks_the_service(browser):
    """With a few hundred jobs the page lists one page of them in queue order; its search, state
    tiles and pager ask the service for the page they show, and the tiles still count every job."""
    source = FakeService()
    waiting = source.add_waiting(300)
    views = source.queue()
    ordered = [view["id"] for view in views]
    server, url = serve(make_app(source), "127.0.0.1", 0)
    rows = lambda: browser.execute_script(READ_ROWS)  # noqa: E731
    count = lambda: browser.find_element("id", "job-count").text  # noqa: E731
    try:
        load(browser, url, "#queue-body tr", what="the first page")
        size = source.page_queries[-1].limit
        assert size < len(ordered)
        wait_for(lambda: rows() == ordered[:size], what="the first page, in queue order")
        assert count() == f"1–{size} of {len(ordered):,}"
        assert browser.find_element("id", "pager").is_displayed()
        assert browser.execute_script(READ_TILES) == {s: f"{n:,}" for s, n in by_state(views).items()}

        wanted = waiting[-23]  # on the last page: the page never had it
        type_search(browser, source.jobs[wanted]["name"])
        wait_for(lambda: rows() == [wanted], what="the service's search to find a job past the first page")
        assert source.page_queries[-1].words == (source.jobs[wanted]["name"],)
        assert count() == "1 · found 1 queued" and not browser.find_element("id", "pager").is_displayed()
        type_search(browser, "no-such-job")
        wait_for(lambda: browser.find_element("id", "queue-none").is_displayed(), what="no match")
        assert rows() == [] and not browser.find_element("id", "queue-empty").is_displayed()

        type_search(browser, "")
        wait_for(lambda: rows() == ordered[:size], what="the first page again")
        press(browser, browser.find_element("id", "page-next"))
        wait_for(lambda: rows() == ordered[size : 2 * size], what="the second page")
        assert count() == f"{size + 1}–{2 * size} of {len(ordered):,}"
        assert source.page_queries[-1].offset == size

        running = [view["id"] for view in views if view["state"] == "running"]
        tile = browser.find_element("xpath", "//*[@id='counts']/button[.//*[contains(@class, 's-running')]]")
        press(browser, tile)
        wait_for(lambda: rows() == running, what="the running jobs, from the first of them")
        assert source.page_queries[-1].states == {"running"} and source.page_queries[-1].offset == 0
        assert page_errors(browser) == []
    finally:
        server.stop()


def test_a_dashboard_address_that_is_not_http_never_becomes_a_link(browser):
    source = FakeService()
    source.info = lambda: {**FakeService.info(source), "dashboard": "javascript:window.__pwned=1"}
    server, url = serve(make_app(source), "127.0.0.1", 0)
    try:
        clean_console(browser)
        browser.get(url)
        wait_for(lambda: browser.find_elements("css selector", "#queue-body tr"), what="the queue")
        time.sleep(0.3)
        assert not browser.find_element("id", "dashboard-link").is_displayed()
        links = browser.execute_script(
            "return Array.from(document.querySelectorAll('a[href]')).map(a => a.getAttribute('href'))"
        )
        assert not [h for h in links if h.startswith("javascript:")]
    finally:
        server.stop()


def test_page_says_when_the_service_cannot_be_reached_and_keeps_its_data(browser):
    source = FakeService()
    server, url = serve(make_app(source), "127.0.0.1", 0)
    stopped = False
    try:
        clean_console(browser)
        browser.get(url)
        wait_for(
            lambda: browser.find_element("id", "live").get_attribute("data-state") == "ok", what="a poll"
        )
        server.stop()
        stopped = True
        wait_for(
            lambda: browser.find_element("id", "live").get_attribute("data-state") == "error",
            timeout=10,
            what="the page to notice",
        )
        assert "cannot reach the orchestrator service" in browser.find_element("id", "live").text
        assert len(browser.find_elements("css selector", "#queue-body tr")) == len(source.jobs)
    finally:
        if not stopped:
            server.stop()
