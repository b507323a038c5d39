"""Training on CPUs where people and the control plane are gives way to them, and only while
they want the CPU: a rank whose device is the CPU, on the cluster's head node (or on a
machine of its own: torchrun, `run --local`, a laptop), trains at normal priority while the
machine is otherwise quiet, and moves its training threads to Linux's SCHED_IDLE class as
soon as something else (a person's shell, the CLI, the service, another job) wants the CPU
for two seconds running, so that it comes first and training takes every cycle it leaves.
Ranks on the other nodes of a cluster, which serve nobody, keep their priority, and with it
their full speed.

Why not nice: the kernel's autogroups (on in most distributions) share the CPU between
sessions first, and a Ray worker stays in the session of the `ray start` that began it, so a
rank's nice value only arbitrates inside Ray's session. On a 2-core head with four ranks
training, a shell's loop waited ~15 times its CPU time with the ranks at nice 0, ~10 times at
nice 19 and ~3 times at SCHED_IDLE (docs/scaling.md). Why not SCHED_IDLE from the start: on a
quiet machine Ray's own processes then preempt a rank at every wake-up, and with the torch
threads of an op waiting for each other that cost the main job a fifth of its speed
(bench/cpu_priority.py).

Who wants the CPU is read from the kernel every second: the CPU time of the processes at
normal priority (nice 0 or below: people, the control plane, Ray; a batch job at nice 19 is
not one of them) but this job's on the node (this rank's, its peers', their children), and
the share of the time some task waited for a CPU (`/proc/pressure/cpu`, PSI): others at
work (0.15 of a core) while something waited 5% of the time (without PSI: others using a
quarter of a core). Ray's own processes at rest neither use that much nor wait. The training
threads are the rank's threads but those that were there before training began (Ray's own:
its RPCs, health checks keep their class), and its children's (data loaders). It gives way
for 30 seconds, then takes its priority back and looks again (a person still at work waits
again at once, and it gives way again), where the kernel allows it: leaving SCHED_IDLE needs
CAP_SYS_NICE or an RLIMIT_NICE that allows nice 0, so elsewhere a rank that gave way keeps
giving way until it ends.
GPU ranks are left alone: their CPU thread feeds the GPU, and a late launch idles it.
`ORCHESTRATOR_CPU_TRAINING` in the ranks' environment (that of `ray start` on a node, or of
torchrun) decides instead: `background` (at once, on every node) or `normal` (never).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

import psutil

log = logging.getLogger("workers")

SETTING = "ORCHESTRATOR_CPU_TRAINING"  # "background", "normal"; unset: give way where shared
CHOICES = ("background", "normal")
LOOK_S = 1.0  # how often the others' demand is read
ENGAGE_LOOKS = 2  # looks running in which others wanted the CPU: give way
WAITING = 0.05  # ... some task waited this share of the time (the kernel's PSI)
WORKING_CORES = 0.15  # ... while the others used this much: a person's command, not Ray's ticks
BUSY_CORES = 0.25  # where the kernel has no PSI: the others using this much
HOLD_LOOKS = 30  # looks giving way before training tries its own priority again
PRESSURE = "/proc/pressure/cpu"


def mode(device_type: str, shared_machine: bool, setting: str | None) -> str:
    """ "background" (at once), "adaptive" (while others want the CPU) or "normal", for a rank on
    `device_type`, on a machine shared with people and the control plane or not."""
    if device_type != "cpu" or setting == "normal":
        return "normal"
    if setting == "background":
        return "background"
    return "adaptive" if shared_machine else "normal"


def setting_from_env() -> str | None:
    setting = os.environ.get(SETTING) or None
    if setting is not None and setting not in CHOICES:
        log.warning("%s=%s is neither 'background' nor 'normal': ignored", SETTING, setting)
        return None
    return setting


def start(
    device_type: str, shared_machine: bool, peers: tuple[int, ...] = (), protected: set[int] | None = None
) -> Governor | None:
    """Call on the training thread as it begins. `peers`: the pids of this job's other ranks on
    this node; `protected`: the threads of this process that are not training (None: those
    there now but this one). Returns the governor watching the others' demand (None: normal
    priority, or SCHED_IDLE set at once). Never raises: where the class does not exist (not
    Linux) or is refused, training goes on as it was."""
    chosen = mode(device_type, shared_machine, setting_from_env())
    if chosen == "normal" or not hasattr(os, "SCHED_IDLE"):
        return None
    training = threading.get_native_id()
    governor = Governor(peers, set(tids(os.getpid())) - {training} if protected is None else protected)
    if chosen == "background":
        governor.give_way()
        return None
    governor.start()
    return governor


class Governor:
    """This rank's training threads: at normal priority, or giving way (SCHED_IDLE)."""

    def __init__(self, peers: tuple[int, ...], protected: set[int]):
        self.me = psutil.Process()
        self.peers = [psutil.Process(pid) for pid in peers if psutil.pid_exists(pid)]
        self.protected = set(protected)  # e.g. Ray's own threads in a Ray Train worker
        self.giving_way = False
        self.can_return = True
        self.done = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._watch, name="cpu-priority", daemon=True)
        self._thread.start()
        self.protected.add(self._thread.native_id)  # the watcher keeps its class

    def stop(self) -> None:
        self.done.set()

    def training_threads(self) -> list[int]:
        own = [t for t in tids(os.getpid()) if t not in self.protected]
        children = [t for child in children_of(self.me) for t in tids(child.pid)]
        return own + children

    def give_way(self) -> None:
        self._set_class(os.SCHED_IDLE)
        self.giving_way = True

    def take_back(self) -> None:
        if self._set_class(os.SCHED_OTHER):
            self.giving_way = False
        else:  # not allowed here: it keeps giving way (the module's docstring)
            self.can_return = False

    def _set_class(self, policy: int) -> bool:
        done = True
        for tid in self.training_threads():
            try:
                os.sched_setscheduler(tid, policy, os.sched_param(0))
            except ProcessLookupError:  # a thread that has just ended
                continue
            except OSError as err:
                log.info("training threads stay in their CPU class: %s", err)
                done = False
                break
        return done

    def _watch(self) -> None:
        demand, decide = OthersDemand([self.me, *self.peers]), Hysteresis()
        while not self.done.wait(LOOK_S):
            cores, waiting = demand.look()
            wanted = decide(cores, waiting)
            if wanted and not self.giving_way:
                self.give_way()
                log.info("training gives way: others used %.2f cores, %s", cores, _waited(waiting))
            elif not wanted and self.giving_way and self.can_return:
                self.take_back()
                log.info("training at normal priority again: the others are quiet")


def _waited(waiting: float | None) -> str:
    return "the kernel keeps no PSI" if waiting is None else f"some task waited {waiting:.0%} of the time"


class Hysteresis:
    """Whether to give way, from each look at the others: the cores they used and the share of
    the time some task waited for a CPU (None where the kernel has no PSI). Yes after
    ENGAGE_LOOKS looks running in which others worked while something waited (without PSI:
    others used BUSY_CORES); then for HOLD_LOOKS looks, after which training takes its
    priority back and looks again (while it gives way nothing waits, so nothing would say when
    the others are done; a person still at work waits again at once, and it gives way again)."""

    def __init__(self):
        self.wanting = self.held = 0

    def __call__(self, cores: float, waiting: float | None) -> bool:
        if self.held:
            self.held -= 1
            return self.held > 0
        if waiting is None:
            wanted = cores > BUSY_CORES
        else:
            wanted = cores > WORKING_CORES and waiting > WAITING
        self.wanting = self.wanting + 1 if wanted else 0
        if self.wanting >= ENGAGE_LOOKS:
            self.wanting, self.held = 0, HOLD_LOOKS
            return True
        return False


class OthersDemand:
    """Since the last look: the cores used by the processes of this machine at normal priority
    (nice 0 or below, SCHED_OTHER: people, the control plane, Ray; not a batch job at nice 19
    nor another rank that gives way) but `ours` (processes and their children), and the share
    of the time some task waited for a CPU (PSI)."""

    def __init__(self, ours: list[psutil.Process]):
        self.ours = ours
        self.last = self._now()

    def look(self) -> tuple[float, float | None]:
        now = self._now()
        (wall, used, stalled), (wall0, used0, stalled0) = now, self.last
        self.last = now
        elapsed = max(wall - wall0, 1e-6)
        waiting = None if stalled is None or stalled0 is None else (stalled - stalled0) / elapsed
        # a process new since the last look counts from its start: a command just typed
        others = sum(seconds - used0.get(pid, 0.0) for pid, seconds in used.items())
        return max(others, 0.0) / elapsed, waiting

    def cores(self) -> float:
        return self.look()[0]

    def _now(self) -> tuple[float, dict[int, float], float | None]:
        ours = {p.pid for p in self.ours} | {c.pid for p in self.ours for c in children_of(p)}
        used = {pid: seconds for pid, seconds in normal_priority_cpu().items() if pid not in ours}
        return time.monotonic(), used, stalled_seconds()


def normal_priority_cpu() -> dict[int, float]:
    """CPU seconds so far of each process at normal priority (its main thread's nice value 0
    or below, SCHED_OTHER), by pid, from /proc/<pid>/stat."""
    tick = os.sysconf("SC_CLK_TCK")
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:  # it ended meanwhile
            continue
        # after the name: the parent is stat's 4th field, utime and stime the 14th and 15th,
        # nice the 19th, policy the 41st; the kernel's own threads (children of kthreadd, 2) aside
        kernel = fields[1] in (b"0", b"2")
        if not kernel and int(fields[16]) <= 0 and int(fields[38]) == os.SCHED_OTHER:
            found[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    return found


def stalled_seconds() -> float | None:
    """The kernel's running total of time some task waited for a CPU (PSI), None without it."""
    try:
        with open(PRESSURE) as pressure:
            return int(pressure.readline().rsplit("total=", 1)[1]) / 1e6
    except (OSError, ValueError, IndexError):
        return None


def children_of(process: psutil.Process) -> list[psutil.Process]:
    try:
        return process.children(recursive=True)
    except psutil.Error:
        return []


def tids(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def local_peer_pids() -> tuple[int, ...]:
    """The pids of this job's other ranks on this machine, from one gather over the job's
    process group (every rank calls it, or none); () without one."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
        return ()
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (socket.gethostname(), os.getpid()))
    return tuple(pid for host, pid in everyone if host == socket.gethostname() and pid != os.getpid())
