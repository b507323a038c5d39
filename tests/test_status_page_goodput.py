"""Where each job's time went on the status page, in headless Chromium: the cluster's goodput
tile, a bar per job in the queue, and a job's time by bucket (docs/images/goodput.png)."""

from __future__ import annotations

import math
import re
import tempfile
import time
from pathlib import Path

import pytest

from core.ledger import BUCKETS, Ledger
from orchestrator.monitoring.web import make_app, serve
from tests.status_page_browser import clean_console, page_errors, save_full_page, wait_for
from tests.status_page_fake import FakeService
from tests.status_page_helpers import GOODPUT_SCREENSHOT

pytest_plugins = ["tests.status_page_fixtures"]  # the fixtures `registry`, `served`, `browser`


def fmt_duration(seconds: float) -> str:
    """The page's fmtDuration: 45s, 3m 05s, 4h 05m, 2d 3h."""
    s = max(0, math.floor(seconds + 0.5))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    hours = s // 3600
    return f"{hours}h {s // 60 % 60:02d}m" if hours < 48 else f"{hours // 24}d {hours % 24}h"


READ_LEDGER_BAR = """
const read = (bar) => ({
  shown: bar.offsetParent !== null, width: bar.getBoundingClientRect().width,
  label: bar.getAttribute('aria-label'), title: bar.title,
  segments: Object.fromEntries(
    [...bar.children].map(s => [s.dataset.bucket, s.getBoundingClientRect().width])),
});
"""


def shares(ledger: Ledger, now: float) -> dict[str, float]:
    seconds = ledger.buckets(now)
    return {bucket: value / sum(seconds.values()) for bucket, value in seconds.items()}


def test_page_shows_where_each_jobs_time_went(browser):
    source = FakeService()
    server, url = serve(make_app(source), "127.0.0.1", 0)
    try:
        clean_console(browser)
        browser.get(url)
        wait_for(
            lambda: len(browser.find_elements("css selector", "#queue-body tr .ledger")) == len(source.jobs),
            what="a ledger bar per row",
        )
        # the queue: a small bar per job, a segment per bucket as wide as its share of the wall time
        bars = browser.execute_script(
            READ_LEDGER_BAR
            + "return Object.fromEntries([...document.querySelectorAll('#queue-body tr')]"
            + ".map(tr => [tr.dataset.jobId, read(tr.querySelector('.ledger'))]))"
        )
        now = time.time()
        for job_id, ledger in source.ledgers.items():
            bar = bars[job_id]
            assert bar["shown"] and bar["width"] > 0, job_id
            for bucket, share in shares(ledger, now).items():
                assert bar["segments"][bucket] / bar["width"] == pytest.approx(share, abs=0.01), (
                    job_id,
                    bucket,
                )
                assert (f"{bucket} " in bar["label"]) == (share > 0), (job_id, bucket)
            assert bar["title"] == bar["label"]
        assert not bars["gpt-nano-char-1123-0955-f00d"]["shown"]  # no ledger: no bar
        done = "convnet-fashion-1123-0700-11aa"  # ended: its shares stay put, to the digit
        for bucket, share in shares(source.ledgers[done], now).items():
            if share > 0:
                assert f"{bucket} {share * 100:.1f}%" in bars[done]["label"]
        assert bars[done]["label"].startswith(
            f"Goodput {source.ledgers[done].goodput(now).time * 100:.1f}%. "
        )

        # the tile: the cluster's time goodput and its factors, from every job's ledger
        tile = browser.find_element("id", "goodput-tile")
        expected = source.goodput(time.time())
        shown = float(tile.find_element("css selector", ".n").text.rstrip("%")) / 100
        assert shown == pytest.approx(expected.time, abs=0.0015)
        factors = dict(re.findall(r"(scheduling|runtime|program \(MFU\)) ([\d.]+)%", tile.text))
        assert float(factors["scheduling"]) / 100 == pytest.approx(expected.scheduling, abs=0.0015)
        assert float(factors["runtime"]) / 100 == pytest.approx(expected.runtime, abs=0.0015)
        assert float(factors["program (MFU)"]) / 100 == pytest.approx(expected.program, abs=0.0015)

        # the job view: a large bar, and a legend with every bucket's seconds and share
        browser.get(url + "#/jobs/" + source.running_id)
        wait_for(lambda: browser.find_element("id", "job-ledger").is_displayed(), what="the job's ledger")
        bar = browser.execute_script(READ_LEDGER_BAR + "return read(document.getElementById('ledger-bar'))")
        legend = browser.execute_script(
            "return [...document.querySelectorAll('#ledger-legend li')]"
            ".map(li => [li.dataset.bucket, li.querySelector('.secs').textContent, li.className])"
        )
        ledger, now = source.ledgers[source.running_id], time.time()
        assert bar["width"] > 1000 and [b for b, _, _ in legend] == list(BUCKETS)
        for bucket, share in shares(ledger, now).items():
            assert bar["segments"][bucket] / bar["width"] == pytest.approx(share, abs=0.002), bucket
        seconds = ledger.buckets(now)
        for bucket, text, faded in legend:
            assert (faded == "none") == (seconds[bucket] == 0), bucket
            if bucket not in ("training", "stalled"):  # those two grow while we look
                assert text == fmt_duration(seconds[bucket]), bucket
        caption = browser.find_element("id", "ledger-caption").text
        assert f"goodput {ledger.goodput(now).time * 100:.1f}%" in caption and "GPU-hours" in caption

        time.sleep(2.5)  # one more poll, so the picture shows settled values
        save_goodput_view(browser, GOODPUT_SCREENSHOT)
        assert page_errors(browser) == []
    finally:
        browser.set_window_size(1400, 900)
        server.stop()


def save_goodput_view(driver, path: Path) -> None:
    """The page from its top to the open job's time ledger: the tiles, the queue's bars, the job's."""
    from PIL import Image

    full = Path(tempfile.mkdtemp()) / "page.png"
    save_full_page(driver, full)
    bottom = driver.execute_script(
        "return document.getElementById('job-ledger').getBoundingClientRect().bottom + window.scrollY"
    )
    image = Image.open(full)
    ratio = image.width / driver.execute_script("return window.innerWidth")
    image.crop((0, 0, image.width, min(image.height, int((bottom + 10) * ratio)))).save(path)
