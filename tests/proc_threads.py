"""What the kernel says of a process's threads (/proc/PID/task/*/stat): the ground truth for
which of them did the work and under which scheduling class."""

import contextlib
import subprocess
import sys
import time
from pathlib import Path


def thread_states(pid: int) -> dict[int, tuple[int, int]]:
    """Each thread of `pid`: (CPU ticks used so far, scheduling policy)."""
    states = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        # fields after the name start at stat's third: utime is the 14th, stime 15th, policy 41st
        states[int(task.name)] = (int(fields[11]) + int(fields[12]), int(fields[38]))
    return states


def busy_thread_policies(pid: int, seconds: float = 2.0) -> tuple[set[int], dict[int, int]]:
    """The policies of the threads of `pid` that did at least a fifth of the busiest one's work
    over `seconds`, and the ticks each thread used then (for the failure's message)."""
    first = thread_states(pid)
    time.sleep(seconds)
    now = thread_states(pid)
    used = {tid: ticks - first.get(tid, (0, 0))[0] for tid, (ticks, _) in now.items()}
    top = max(used.values())
    return {now[tid][1] for tid, ticks in used.items() if ticks >= 0.2 * top and top > 0}, used


@contextlib.contextmanager
def someone_else_busy(seconds: float = 3.0):
    """A process outside the job burning a core (a person's command at the shell), and time
    for the ranks on this machine to see it (workers/cpu_priority.py looks every second)."""
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(seconds)
        yield burner.pid
    finally:
        burner.kill()
        burner.wait()
