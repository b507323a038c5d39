"""The status page in headless Chromium: waiting for it, loading it on a clean console, reading
its charts and errors, and screenshots (tests/test_status_page*.py)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path


def wait_for(predicate, timeout: float = 20.0, what: str = "the page"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def clean_console(browser) -> None:
    """No page open and an empty console: the page a test before left open polls a server
    since stopped, and a poll refused between clearing and the next page would be counted."""
    browser.get("about:blank")
    browser.get_log("browser")


def load(browser, url: str, rows: str, count: int | None = None, what: str = "the rows"):
    """Open the page on a clean console and wait for `count` elements of `rows` (any, if None)."""
    clean_console(browser)
    browser.get(url)
    found = lambda: browser.find_elements("css selector", rows)  # noqa: E731
    wait_for(lambda: found() if count is None else len(found()) == count, what=what)


def points(driver, chart: str) -> int:
    return int(driver.execute_script(f"return document.getElementById('chart-{chart}').dataset.points"))


def page_errors(driver) -> list[str]:
    """Console errors, CSP violations included (the favicon and everything else is local)."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def save_full_page(driver, path: Path) -> None:
    """The whole page in one image: the window grows to the document's height."""
    chrome = driver.execute_script("return window.outerHeight - window.innerHeight")
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1400, min(height + chrome, 4000))
    driver.execute_script("window.scrollTo(0, 0)")
    time.sleep(0.6)  # the charts follow the new size
    path.parent.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(path))


def assert_scrolled_job_view_is_whole(browser) -> None:
    """The job view, scrolled to: its title just below the sticky top bar (not under it), and
    nothing but the bar above it, in a screenshot of the scrolled page."""
    geometry = (
        "const b = document.querySelector('.topbar').getBoundingClientRect();"
        "const t = document.getElementById('job-name').getBoundingClientRect();"
        "return [b.top, b.bottom, t.top, window.scrollY]"
    )

    def settled():
        first = browser.execute_script(geometry)
        time.sleep(0.3)  # a smooth scroll has ended when two looks agree
        return first[3] > 0 and first == browser.execute_script(geometry) and first

    bar_top, bar_bottom, title_top, _ = wait_for(settled, what="the scroll to the job view to end")
    assert bar_top == 0 and bar_bottom <= title_top <= bar_bottom + 40, (bar_top, bar_bottom, title_top)
    from PIL import Image

    shot = Path(tempfile.mkdtemp()) / "scrolled.png"
    assert browser.save_screenshot(str(shot))
    image = Image.open(shot).convert("RGB")
    ratio = image.width / browser.execute_script("return window.innerWidth")
    bar = image.getpixel((int(6 * ratio), int((bar_bottom - 6) * ratio)))  # the bar's own background
    top_rows = {image.getpixel((int(x * ratio), y)) for x in (6, 400, 900) for y in range(3)}
    assert top_rows == {bar}, f"above the top bar: {top_rows - {bar}}"
