"""With SUITE_CPU_LOG=FILE: one JSON line per test with its wall time, the whole machine's busy
CPU seconds and the processes started meanwhile (from /proc/stat), to find which tests cost the
cores and which only wait. Fixtures' set-up counts toward the first test that needs them."""

from __future__ import annotations

import json
import os
import time

import pytest

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def machine_counters() -> tuple[float, int]:
    """(busy CPU seconds since boot, processes forked since boot)."""
    busy, forks = 0.0, 0
    with open("/proc/stat") as stat:
        for line in stat:
            if line.startswith("cpu "):
                user, nice, system, idle, iowait, irq, softirq, steal = map(int, line.split()[1:9])
                busy = (user + nice + system + irq + softirq) / TICKS
            elif line.startswith("processes "):
                forks = int(line.split()[1])
    return busy, forks


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    path = os.environ.get("SUITE_CPU_LOG")
    if not path:
        yield
        return
    start, (busy, forks) = time.monotonic(), machine_counters()
    yield
    end_busy, end_forks = machine_counters()
    row = {
        "test": item.nodeid,
        "wall_s": round(time.monotonic() - start, 2),
        "cpu_s": round(end_busy - busy, 2),
        "forks": end_forks - forks,
    }
    with open(path, "a") as out:
        out.write(json.dumps(row) + "\n")
