"""Training on CPUs where people and the control plane are is background work: a rank whose
device is the CPU, on the cluster's head node (or on a machine of its own: torchrun, `run
--local`, a laptop), moves its training thread to Linux's SCHED_IDLE class, so a person's
shell, the CLI, the service and Ray's own processes there come first, and training takes
every cycle they leave. Ranks on the other nodes of a cluster, which serve nobody, keep their
priority, and with it their full speed.

Why not nice: the kernel's autogroups (on in most distributions) share the CPU between
sessions first, and a Ray worker stays in the session of the `ray start` that began it, so a
rank's nice value only arbitrates inside Ray's session. On a 2-core head with four ranks
training, a shell's loop waited ~15 times its CPU time with the ranks at nice 0, ~10 times at
nice 19 and ~3 times at SCHED_IDLE (docs/scaling.md). The price, on a quiet machine, is Ray's
processes preempting a rank at once when they wake: x0.94 samples/s for the main job.

The class is per thread and inherited: what the training thread starts after this (torch's
intra-op threads, data loader processes, checkpoint uploads) is background work too; Ray's
own threads in the rank (its RPCs, health checks) keep their class. GPU ranks are left alone:
their CPU thread feeds the GPU, and a late launch idles it. `ORCHESTRATOR_CPU_TRAINING` in
the ranks' environment (that of `ray start` on a node, or of torchrun) decides instead:
`background` on every node, `normal` on none.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("workers")

SETTING = "ORCHESTRATOR_CPU_TRAINING"  # "background", "normal"; unset: background where shared
CHOICES = ("background", "normal")


def wanted(device_type: str, shared_machine: bool, setting: str | None) -> bool:
    """Whether a rank on `device_type` trains in the background, on a machine shared with
    people and the control plane (`shared_machine`) or not, under the operator's `setting`."""
    if device_type != "cpu" or setting == "normal":
        return False
    return setting == "background" or shared_machine


def train_in_background(device_type: str, shared_machine: bool) -> bool:
    """Move the calling thread to SCHED_IDLE if `wanted`; True if it did. Never raises: where
    the class does not exist (not Linux) or is refused, training goes on as it was."""
    setting = os.environ.get(SETTING) or None
    if setting is not None and setting not in CHOICES:
        log.warning("%s=%s is neither 'background' nor 'normal': ignored", SETTING, setting)
        setting = None
    if not wanted(device_type, shared_machine, setting) or not hasattr(os, "SCHED_IDLE"):
        return False
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: the calling thread
    except OSError as err:
        log.warning("training stays at normal CPU priority: %s", err)
        return False
    return True
