"""CPU training gives way (workers/cpu_priority.py): while something else wants the CPU, the
training threads of a rank on the CPU move to SCHED_IDLE; a GPU rank and the rank's own
protected threads are left alone, and an operator can choose either way for good. The ground
truth is the kernel's: /proc's policy of the threads that did the training."""

import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import ROOT
from tests.proc_threads import busy_thread_policies, someone_else_busy, thread_states
from workers import cpu_priority

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")


def in_a_thread(device_type: str, shared_machine: bool = True) -> tuple[bool, int]:
    """Whether `start` left a governor watching, and the policy the thread then had."""
    seen: list = []

    def body():
        governor = cpu_priority.start(device_type, shared_machine)
        seen.append(governor is not None)
        seen.append(os.sched_getscheduler(0))
        if governor is not None:
            governor.stop()

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    return seen[0], seen[1]


def test_who_gives_way_and_when():
    # unset: CPU ranks where people and the control plane are (the head, a machine of its
    # own) give way while something else wants the CPU
    assert cpu_priority.mode("cpu", shared_machine=True, setting=None) == "adaptive"
    assert cpu_priority.mode("cpu", shared_machine=False, setting=None) == "normal"
    # the operator's word, either way; a GPU rank never
    assert cpu_priority.mode("cpu", shared_machine=False, setting="background") == "background"
    assert cpu_priority.mode("cpu", shared_machine=True, setting="normal") == "normal"
    settings = (None, "background")
    assert {cpu_priority.mode("cuda", shared, s) for shared in (True, False) for s in settings} == {"normal"}


def test_it_gives_way_after_two_looks_of_others_waiting_holds_thirty_then_looks_again():
    decide = cpu_priority.Hysteresis()
    # Ray's ticks, a rank's own threads waiting, a busy process that waits for nothing, a blip
    quiet = ((0.05, 0.0), (0.05, 0.3), (0.3, 0.0), (0.15, 0.1), (0.05, 0.0))
    assert [decide(c, w) for c, w in quiet] == [False] * 5
    # others at work while something waits, two looks running: it gives way for 30 looks
    assert [decide(c, w) for c, w in ((0.2, 0.1), (0.2, 0.1))] == [False, True]
    held = [decide(0.3, 0.0) for _ in range(cpu_priority.HOLD_LOOKS)]
    assert held == [True] * (cpu_priority.HOLD_LOOKS - 1) + [False]  # then its priority back
    assert [decide(c, w) for c, w in ((0.3, 0.2), (0.3, 0.2))] == [False, True]  # still busy: again
    fresh = cpu_priority.Hysteresis()  # where the kernel has no PSI: the others' CPU use alone
    assert [fresh(c, None) for c in (0.2, 0.3, 0.3)] == [False, False, True]


def test_at_once_in_the_background_only_the_training_thread_moves(monkeypatch):
    monkeypatch.setenv(cpu_priority.SETTING, "background")
    before = os.sched_getscheduler(0)
    assert in_a_thread("cpu") == (False, os.SCHED_IDLE)
    assert os.sched_getscheduler(0) == before  # the class is per thread: the caller's is unchanged


def test_a_gpu_rank_a_node_of_its_own_and_the_normal_setting_are_left_alone(monkeypatch, caplog):
    monkeypatch.delenv(cpu_priority.SETTING, raising=False)
    assert in_a_thread("cuda") == (False, os.SCHED_OTHER)
    assert in_a_thread("cpu", shared_machine=False) == (False, os.SCHED_OTHER)
    assert in_a_thread("cpu") == (True, os.SCHED_OTHER)  # watching, at normal priority so far
    monkeypatch.setenv(cpu_priority.SETTING, "normal")
    assert in_a_thread("cpu") == (False, os.SCHED_OTHER)
    monkeypatch.setenv(cpu_priority.SETTING, "lowest")
    with caplog.at_level(logging.WARNING, logger="workers"):
        assert in_a_thread("cpu", shared_machine=False) == (False, os.SCHED_OTHER)
    assert "ORCHESTRATOR_CPU_TRAINING=lowest is neither 'background' nor 'normal': ignored" in caplog.text


def test_giving_way_moves_the_training_threads_and_their_children_not_the_protected_ones():
    protected_ready, stop = threading.Event(), threading.Event()
    seen: dict = {}

    def protected_body():
        seen["protected"] = threading.get_native_id()
        protected_ready.set()
        stop.wait()

    def training_body():
        protected_ready.wait()
        governor = cpu_priority.Governor((), protected={seen["protected"]})
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])  # a data loader
        try:
            governor.give_way()
            seen["gave_way"] = (os.sched_getscheduler(0), os.sched_getscheduler(child.pid))
            governor.take_back()
            seen["took_back"] = (os.sched_getscheduler(0), governor.can_return)
        finally:
            child.kill()
            child.wait()

    protected = threading.Thread(target=protected_body)
    protected.start()
    training = threading.Thread(target=training_body)
    training.start()
    training.join()
    seen["protected_policy"] = os.sched_getscheduler(seen["protected"])
    stop.set()
    protected.join()
    assert seen["gave_way"] == (os.SCHED_IDLE, os.SCHED_IDLE)
    assert seen["protected_policy"] == os.SCHED_OTHER
    # back to normal where the kernel allows leaving SCHED_IDLE; elsewhere it says it cannot
    assert seen["took_back"] in ((os.SCHED_OTHER, True), (os.SCHED_IDLE, False))


def burner(nice: int = 0) -> psutil.Process:
    """A process spinning a core, outside this one's tree (through a shell that exits: a child
    of this process would count as its own)."""
    spawn = f"nice -n {nice} {sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"
    return psutil.Process(int(subprocess.run(["sh", "-c", spawn], capture_output=True, text=True).stdout))


def test_the_others_demand_leaves_out_this_jobs_own_processes_and_batch_work():
    """A busy process outside the job is demand; the same process among the job's is not, nor
    a busy process at nice 19 (batch work gives way itself)."""
    busy, batch = burner(), burner(nice=19)
    try:
        me = psutil.Process()
        outside, inside = cpu_priority.OthersDemand([me]), cpu_priority.OthersDemand([me, busy])
        time.sleep(2.0)
        (seen_outside, waiting), seen_inside = outside.look(), inside.cores()
        used = busy.cpu_times()
        counted = cpu_priority.normal_priority_cpu()
    finally:
        busy.kill()
        batch.kill()
    # the difference between the two views is the busy process's CPU over the same 2 s
    assert seen_outside - seen_inside == pytest.approx((used.user + used.system) / 2.0, abs=0.15)
    assert busy.pid in counted and batch.pid not in counted  # batch work is nobody's demand
    assert waiting is None or 0.0 <= waiting <= 1.0  # a share of the time (PSI), where the kernel has it


def test_the_threads_that_train_under_torchrun_give_way_to_a_busy_shell(tmp_path):
    """A real 2-process job under torchrun (the loop without Ray), each rank with 2 threads
    for torch: once something else wants the CPU, every thread that did much of a rank's
    work is SCHED_IDLE, whichever thread started it (the training thread, torch's intra-op
    pool, gloo's). Ray's ranks: checked in tests/test_ray_run.py."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "2"}
    env.pop(cpu_priority.SETTING, None)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    command += ["-m", "workers.run", str(ROOT / "jobs/convnet.yaml")]
    for override in (f"checkpoint.storage={tmp_path}", "train.steps=100000", "train.eval_every=null"):
        command += ["--set", override]
    job = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        for line in job.stdout:  # rank 0's first progress line: both ranks are training
            if b"] step " in line:
                break
        ranks = [int(c) for c in Path(f"/proc/{job.pid}/task/{job.pid}/children").read_text().split()]
        assert len(ranks) == 2, ranks
        training = {}  # each rank's threads that do its work, found while nothing else is busy
        for pid in ranks:
            _, used = busy_thread_policies(pid)
            assert max(used.values()) > 5, f"rank {pid} did not train: {used}"
            training[pid] = {tid for tid, ticks in used.items() if ticks >= 0.2 * max(used.values())}
        with someone_else_busy():
            for pid in ranks:
                states = thread_states(pid)
                policies = {states[tid][1] for tid in training[pid] if tid in states}
                assert policies == {os.SCHED_IDLE}, (training[pid], states)
    finally:
        job.terminate()
        job.wait(timeout=60)
    assert not [pid for pid in ranks if Path(f"/proc/{pid}").exists()], "a rank outlived torchrun"
