"""Where a benchmark figure came from: date, command, commit, machine and versions.

Every result file in bench/results/ carries this, so a number can be traced to the code and
the machine that produced it."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def git_commit() -> str:
    """HEAD, with "+uncommitted changes" when the working tree differs from it; BENCH_COMMIT
    when set (a copy of the tree on another machine may carry stale git metadata;
    bench/gpu_session.sh sets it)."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], capture_output=True, text=True, cwd=ROOT
        ).stdout
        return head + ("+uncommitted changes" if dirty.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def provenance() -> dict:
    import ray
    import torch

    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "commit": git_commit(),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (no GPU)",
        },
        "versions": {"torch": torch.__version__, "ray": ray.__version__, "python": platform.python_version()},
    }
