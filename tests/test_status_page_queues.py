"""The status page's queues panel, in headless Chromium: each queue's use, quota and borrowing
as the CLI shows them, queue names as text, and no panel without a queue configuration."""

from __future__ import annotations

import pytest

from core.queues import DEFAULT_ORDER
from orchestrator.commands.queue import queue_lines
from orchestrator.monitoring.web import make_app, serve
from tests.status_page_browser import load, page_errors, wait_for
from tests.status_page_fake import FakeService
from tests.status_page_helpers import HOSTILE_QUEUE, QUEUES, fetch_json

pytest_plugins = ["tests.status_page_fixtures"]  # the fixtures `registry`, `served`, `browser`


READ_QUEUES = """
const text = (node) => (node ? node.textContent : null);
return [...document.querySelectorAll('#queues-body tr')].map(tr => ({
  name: text(tr.querySelector('.name')), key: tr.dataset.queue,
  cohort: text(tr.querySelector('.cohort')), order: text(tr.querySelector('.order')),
  use: [...tr.querySelectorAll('.quota')].map(line => ({
    resource: text(line.querySelector('.res-name')), value: text(line.querySelector('.res-value')),
    width: line.querySelector('.quota-bar').getBoundingClientRect().width,
    parts: Object.fromEntries([...line.querySelectorAll('.seg')].map(
      s => [s.dataset.part, s.getBoundingClientRect().width])),
  })),
  useText: text(tr.querySelector('.use')),
  extra: [...tr.querySelectorAll('.extra div')].map(text),
  limit: text(tr.querySelector('.limit')),
}));
"""


def line_from_page(row: dict) -> str:
    """`queue_lines`'s line for a queue, rebuilt from the page's row: the CLI's words around
    the numbers the page shows."""
    where = {"hard cap": "cap", "—": ""}.get(row["cohort"], f"cohort {row['cohort']}")
    kind = ", ".join(filter(None, [where, row["order"] if row["order"] != DEFAULT_ORDER else ""]))
    use = ", ".join(f"{u['value'].replace(' / ', '/')} {u['resource']}" for u in row["use"]) or row["useText"]
    head = f"queue {row['name']} ({kind})" if kind else f"queue {row['name']}"
    return f"{head}: {use}" + (f"; {', '.join(row['extra'])}" if row["extra"] else "")


def queues_panel_shown(browser) -> bool:
    return browser.find_element("id", "queues").is_displayed()


def test_queues_panel_shows_use_quota_and_borrowing_as_the_cli_does(browser):
    source = FakeService(queues=QUEUES)
    server, url = serve(make_app(source), "127.0.0.1", 0)
    try:
        assert fetch_json(url + "api/info")[1]["queues"] == QUEUES  # passed on as the service gives it
        load(browser, url, "#queues-body tr", len(QUEUES["use"]), "a row per queue")
        assert queues_panel_shown(browser)
        assert browser.find_element("id", "queues-count").text == "5"
        rows = browser.execute_script(READ_QUEUES)
        assert [row["name"] for row in rows] == sorted(QUEUES["use"])  # the CLI's order
        shown = {row["name"]: row for row in rows}

        # the fake's numbers, as the page writes them
        for name, q in QUEUES["use"].items():
            row = shown[name]
            assert row["order"] == q["order"], name
            assert [(u["resource"], u["value"]) for u in row["use"]] == [
                (r, f"{q['used'][r]:g} / {n:g}") for r, n in q["nominal"].items()
            ], name
        research, vision, nlp, batch, scratch = (
            shown[n] for n in ("research", "vision", "nlp", "batch", "scratch")
        )
        assert (research["cohort"], research["use"][0]["value"]) == ("lab", "8 / 4")
        assert research["extra"] == ["borrows 4 GPU"] and research["limit"] == "8 GPU"
        assert vision["extra"] == ["lends 2.54545 GPU"] and nlp["extra"] == ["lends 1.45455 GPU"]
        assert vision["limit"] == nlp["limit"] == "—"  # no limit but the cohort's unused quota
        assert batch["cohort"] == "hard cap" and batch["extra"] == [] and batch["limit"] == "—"
        assert [u["value"] for u in batch["use"]] == ["8 / 64", "0 / 2"]
        assert scratch["use"] == [] and scratch["useText"] == "no quota"

        # each bar: use within the quota, beyond it and lent, against the larger of use and quota
        def fractions(line):
            return {part: width / line["width"] for part, width in line["parts"].items()}

        assert research["use"][0]["width"] > 100
        assert fractions(research["use"][0]) == pytest.approx(
            {"within": 0.5, "borrowed": 0.5, "lent": 0}, abs=0.01
        )
        assert fractions(vision["use"][0]) == pytest.approx(
            {"within": 5 / 12, "borrowed": 0, "lent": 7 * 4 / 11 / 12}, abs=0.01
        )
        assert fractions(nlp["use"][0]) == pytest.approx(
            {"within": 0, "borrowed": 0, "lent": 4 / 11}, abs=0.01
        )
        assert fractions(batch["use"][1]) == pytest.approx({"within": 0, "borrowed": 0, "lent": 0}, abs=0.01)

        # and `orchestrator queue` says the same, line for line
        assert [line_from_page(row) for row in rows] == queue_lines(QUEUES)
        assert page_errors(browser) == []
    finally:
        server.stop()


def test_queue_names_are_shown_as_text_never_as_markup(browser):
    cohort, resource = "<b>lab</b>", "<i>GPU</i>"
    hostile = {
        "config": {
            "cohorts": [cohort],
            "queues": {
                HOSTILE_QUEUE: {
                    "cohort": cohort,
                    "nominal": {resource: 2.0},
                    "borrowing_limit": {resource: 1.0},
                }
            },
        },
        "use": {
            HOSTILE_QUEUE: {
                "cohort": cohort,
                "used": {resource: 3.0},
                "nominal": {resource: 2.0},
                "borrowed": {resource: 1.0},
                "lent": {resource: 0.0},
                "order": "<script>window.__pwned = true</script>",
            }
        },
    }
    source = FakeService(queues=hostile)
    server, url = serve(make_app(source), "127.0.0.1", 0)
    try:
        load(browser, url, "#queues-body tr", what="the queue's row")
        [row] = browser.execute_script(READ_QUEUES)
        assert row["name"] == row["key"] == HOSTILE_QUEUE and row["cohort"] == cohort
        assert row["order"] == "<script>window.__pwned = true</script>"
        assert [(u["resource"], u["value"]) for u in row["use"]] == [(resource, "3 / 2")]
        assert row["extra"] == [f"borrows 1 {resource}"] and row["limit"] == f"1 {resource}"
        assert HOSTILE_QUEUE in browser.find_element("id", "queues").text
        markup = "return document.querySelectorAll('img, b, i, #queues script').length"
        assert browser.execute_script(markup) == 0
        assert browser.execute_script("return window.__pwned === undefined") is True
        assert page_errors(browser) == []
    finally:
        server.stop()


def test_queues_panel_is_hidden_without_a_queue_configuration(browser):
    source = FakeService()  # no queue configuration applied: "queues" is None

    def after_a_fresh_poll():
        """Wait until the page has drawn a poll that began after now."""
        calls = source.info_calls
        wait_for(lambda: source.info_calls >= calls + 2, what="two more polls")

    server, url = serve(make_app(source), "127.0.0.1", 0)
    try:
        browser.get(url)
        wait_for(lambda: browser.find_elements("css selector", "#queue-body tr"), what="the jobs")
        assert not queues_panel_shown(browser)
        assert browser.find_elements("css selector", "#queues-body tr") == []
        with source.lock:  # `orchestrator queues apply`: the panel appears without a reload
            source.queues = QUEUES
        wait_for(lambda: queues_panel_shown(browser), what="the panel to appear")
        with source.lock:  # a configuration without queues shows nothing either
            source.queues = {"config": {"cohorts": ["lab"]}, "use": {}}
        wait_for(lambda: not queues_panel_shown(browser), what="the panel to go")
        assert browser.find_elements("css selector", "#queues-body tr") == []
        with source.lock:
            source.queues = None
        after_a_fresh_poll()
        assert not queues_panel_shown(browser)
        assert browser.find_element("id", "queues-count").text == ""
    finally:
        server.stop()
