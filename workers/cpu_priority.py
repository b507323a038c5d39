"""Training on CPUs is background work: a rank whose device is the CPU moves its training
thread to Linux's SCHED_IDLE class, so a person's shell, the CLI, the service and Ray's own
processes on the same machine come first, and training takes every cycle they leave.

Why not nice: the kernel's autogroups (on in most distributions) share the CPU between
sessions first, and a Ray worker stays in the session of the `ray start` that began it, so a
rank's nice value only arbitrates inside Ray's session. On a 2-core head with four ranks
training, a shell's command waited ~10 times its own CPU time with the ranks at nice 0 or 19,
and ~2 times with them at SCHED_IDLE (docs/scaling.md). SCHED_IDLE also yields inside Ray's
session, to the raylet and the service, as Ray's default worker niceness means to.

The class is per thread and inherited: what the training thread starts after this (torch's
intra-op threads, data loader processes, checkpoint uploads) is background work too; Ray's
own threads in the rank (its RPCs, health checks) keep their class. GPU ranks are left alone:
their CPU thread feeds the GPU, and a late launch idles it. `ORCHESTRATOR_CPU_TRAINING=normal`
in the ranks' environment (that of `ray start` on a cluster, or of torchrun) turns this off.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("workers")

SETTING = "ORCHESTRATOR_CPU_TRAINING"  # "background" (the default) or "normal"


def train_in_background(device_type: str) -> bool:
    """Move the calling thread to SCHED_IDLE if it trains on the CPU and the setting allows;
    True if it did. Never raises: where the class does not exist (not Linux) or is refused,
    training goes on at the priority it has."""
    setting = os.environ.get(SETTING, "background")
    if setting not in ("background", "normal"):
        log.warning("%s=%s is neither 'background' nor 'normal': taken as 'background'", SETTING, setting)
    if device_type != "cpu" or setting == "normal" or not hasattr(os, "SCHED_IDLE"):
        return False
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: the calling thread
    except OSError as err:
        log.warning("training stays at normal CPU priority: %s", err)
        return False
    return True
