"""The Python stacks of a hung job's ranks, and ending their processes.

A stack comes from Ray's dashboard, `GET /worker/traceback?pid=&node_id=` (the dashboard's
"Stack Trace" button: the node's agent runs `py-spy dump` on the process), with the cluster's
auth token. Where the dashboard cannot answer (profiling turned off, an agent that is down),
a task pinned to the rank's node runs `py-spy dump` itself. Either way the result is py-spy's
text, which `where` reads: the innermost frame of the training code. (Ray 2.60 answers 403
unless the head runs with RAY_DASHBOARD_ENABLE_PROFILING=1: then the task does it.)

A hung rank does not answer Ray Train's graceful shutdown, so the service ends the ranks with
SIGKILL, from a task pinned to each node: Ray Train sees its workers die, counts a failure
against `fault_tolerance.max_failures` and restarts the group from its newest checkpoint,
the path any dead worker takes.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.parse
import urllib.request

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

DUMP_TIMEOUT_S = 30.0

# a py-spy frame line: "    name (path/to/file.py:123)"
_FRAME = re.compile(r"^\s+(?P<name>\S.*?) \((?P<file>[^():]+):(?P<line>\d+)\)\s*$")
# the training code: the loop, data, models and kernels (py-spy shortens a file to its package
# path unless told otherwise, so a library's frame is told apart by its package, not its folder)
TRAINING_PACKAGES = ("workers", "kernels")


def from_dashboard(dashboard: str, token: str | None, pid: int, node_id: str) -> str:
    query = urllib.parse.urlencode({"pid": pid, "node_id": node_id, "native": "0"})
    request = urllib.request.Request(f"{dashboard.rstrip('/')}/worker/traceback?{query}")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=DUMP_TIMEOUT_S) as reply:
        return reply.read().decode(errors="replace")


def _py_spy_dump(pid: int) -> str:
    exe = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    done = subprocess.run(
        [exe, "dump", "--full-filenames", "--pid", str(pid)],
        capture_output=True,
        text=True,
        timeout=DUMP_TIMEOUT_S,
    )
    return done.stdout if done.returncode == 0 else f"py-spy failed: {done.stderr.strip()}"


def _signal(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def _on_node(node_id: str, fn):
    options = {"num_cpus": 0, "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)}
    return ray.remote(fn).options(**options)


def stacks(dashboard: str, token: str | None, workers: dict[int, dict]) -> dict[int, str]:
    """Every rank's Python stack (py-spy's text): workers maps rank -> {"pid", "node_id", ...}.
    The ranks the dashboard cannot answer for are dumped by tasks on their nodes, all at once."""
    found, failed = {}, {}
    for rank, w in sorted(workers.items()):
        try:
            found[rank] = from_dashboard(dashboard, token, w["pid"], w["node_id"])
        except Exception as err:  # the dashboard cannot say: ask py-spy on that node directly
            failed[rank] = f"{type(err).__name__}: {err}"
    dumps = {
        rank: _on_node(workers[rank]["node_id"], _py_spy_dump).remote(workers[rank]["pid"]) for rank in failed
    }
    for rank, ref in dumps.items():
        try:
            found[rank] = ray.get(ref, timeout=DUMP_TIMEOUT_S + 15)
        except Exception as err:
            found[rank] = f"no stack: the dashboard said {failed[rank]}; py-spy on the node: {err}"
    return dict(sorted(found.items()))


def kill(workers: dict[int, dict]) -> None:
    """SIGKILL every rank's process, from a task on its node."""
    by_node: dict[str, list[int]] = {}
    for w in workers.values():
        by_node.setdefault(w["node_id"], []).append(int(w["pid"]))
    pending = [_on_node(node, _signal).remote(pids, signal.SIGKILL) for node, pids in by_node.items()]
    ray.get(pending, timeout=60)


def where(text: str) -> str | None:
    """The innermost frame of the training code (`TRAINING_PACKAGES`) in py-spy's dump of a
    worker, as "name (file:line)", in the thread that runs the training loop (the one whose
    frames reach `workers/trainer.py`, else the first thread)."""
    threads: list[list[tuple[str, str, str]]] = []
    for line in text.splitlines():
        if line.startswith("Thread "):
            threads.append([])
            continue
        match = _FRAME.match(line)
        if match and threads:
            threads[-1].append((match["name"], match["file"], match["line"]))
    if not threads:
        return None
    loop = next((t for t in threads if any(f.endswith("workers/trainer.py") for _, f, _ in t)), threads[0])
    for name, file, line in loop:
        if "site-packages" not in file and set(file.split("/")[:-1]) & set(TRAINING_PACKAGES):
            return f"{name} ({file}:{line})"
    return None
