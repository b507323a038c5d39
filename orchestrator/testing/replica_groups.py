"""A replica group of a job under torchrun, as docs/cluster.md#replica-groups starts one: its
own `torchrun` of one process, told its group and the lighthouse; and its end by SIGKILL, as a
machine's. For the tests and benchmarks of replica groups (tests/test_replicas.py,
bench/replica_loss.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def torchrun_group(
    group: int, sets: list[str], summary: Path, lighthouse: str, faults: Path, log: Path, procs: int = 1
):
    """`workers.run jobs/convnet.yaml` with `sets`, as group `group` of `procs` processes under
    torchrun; the run reads `faults` (workers/faults.py: paced steps until told to go)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}"]
    command += ["-m", "workers.run", "jobs/convnet.yaml", *[a for s in sets for a in ("--set", s)]]
    command += ["--summary", str(summary)]
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TORCHFT_LIGHTHOUSE": lighthouse,
        "REPLICA_GROUP_ID": str(group),
        "ORCHESTRATOR_TEST_FAULTS": str(faults),
    }
    out = open(log, "a")
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=out)


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL to a torchrun and its workers (torchrun starts them in sessions of their own)."""
    import psutil

    tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    for process in tree:
        process.send_signal(signal.SIGKILL)
    psutil.wait_procs(tree, timeout=30)
    proc.wait()
