"""bench/cpu_by_process.py: a command's CPU by kind of process, read from the kernel's counters."""

import json
import os
import subprocess
import sys

from bench.cpu_by_process import kind_of
from tests.conftest import ROOT


def test_processes_are_named_by_what_they_are():
    assert kind_of("ray::RayTrainWorker", "ray::RayTrainWorker.execute") == "ray::RayTrainWorker"
    assert kind_of("python", "ray::AttemptController") == "ray::AttemptController"
    boot = "python /x/ray/_private/workers/default_worker.py --raylet-name=/tmp/ray/raylet"
    assert kind_of("python", boot) == "ray:default_worker"  # not the raylet its arguments name
    assert kind_of("raylet", "/x/ray/core/src/ray/raylet/raylet --node-ip-address=1") == "ray:raylet"
    assert kind_of("python", "python -m torch.distributed.run --nproc_per_node=2 x.py") == "torchrun"
    assert kind_of("python", "python -m orchestrator submit jobs/convnet.yaml") == "orchestrator (the CLI)"
    assert kind_of("python", "/v/bin/python -m pytest -q") == "pytest"
    xdist = "/v/bin/python -u -c import sys;exec(eval(sys.stdin.readline()))"
    assert kind_of("python", xdist) == "pytest"
    rank = "/v/bin/python -u /r/tests/dist_suite.py /tmp/pytest-of-root/pytest-1/plan.json"
    assert kind_of("python", rank) == "torchrun"  # not pytest, whose temporary folder it names
    assert kind_of("sleep", "sleep 5") == "sleep"


def test_a_commands_cpu_is_counted_under_its_kind(tmp_path):
    """A command that burns 3 CPU seconds under a name of its own is found with about that much
    (sampled each second: the last second before it ends may be missed)."""
    busy = tmp_path / "busy-child"  # the kernel names the process after the file it ran
    busy.symlink_to(os.path.realpath(sys.executable))
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 3: pass"
    out = tmp_path / "cpu.json"
    script = [sys.executable, str(ROOT / "bench/cpu_by_process.py"), "--out", str(out), "--pace-s", "0.2"]
    done = subprocess.run([*script, "--", str(busy), "-c", burn], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    assert figures["exit"] == 0 and figures["wall_s"] >= 3
    assert 1.5 <= figures["cpu_s"]["busy-child"] <= 3.5, figures
    assert "CPU s (" in done.stdout and "busy-child" in done.stdout
    assert figures["pace"]["before"] > 0 and figures["pace"]["after"] > 0
