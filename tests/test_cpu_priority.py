"""CPU training is background work (workers/cpu_priority.py): the training thread of a rank on
the CPU moves to SCHED_IDLE, a GPU rank and a caller's own thread are left alone, and an
operator can turn it off. The ground truth is the kernel's: /proc's policy of the threads
that did the training."""

import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.proc_threads import busy_thread_policies
from workers import cpu_priority

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")


def in_a_thread(device_type: str, shared_machine: bool = True) -> tuple[bool, int]:
    """train_in_background's answer, and the policy the thread then had."""
    seen: list = []

    def body():
        seen.append(cpu_priority.train_in_background(device_type, shared_machine))
        seen.append(os.sched_getscheduler(0))

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    return seen[0], seen[1]


def test_who_trains_in_the_background():
    # unset: CPU ranks where people and the control plane are (the head, a machine of its own)
    assert cpu_priority.wanted("cpu", shared_machine=True, setting=None)
    assert not cpu_priority.wanted("cpu", shared_machine=False, setting=None)
    # the operator's word, either way; a GPU rank never
    assert cpu_priority.wanted("cpu", shared_machine=False, setting="background")
    assert not cpu_priority.wanted("cpu", shared_machine=True, setting="normal")
    settings = (None, "background")
    assert not any(cpu_priority.wanted("cuda", shared, s) for shared in (True, False) for s in settings)


def test_a_cpu_rank_trains_in_the_background_and_only_its_own_thread_moves(monkeypatch):
    monkeypatch.delenv(cpu_priority.SETTING, raising=False)
    before = os.sched_getscheduler(0)
    assert in_a_thread("cpu") == (True, os.SCHED_IDLE)
    assert os.sched_getscheduler(0) == before  # the class is per thread: the caller's is unchanged


def test_a_gpu_rank_a_node_of_its_own_and_the_normal_setting_are_left_alone(monkeypatch, caplog):
    monkeypatch.delenv(cpu_priority.SETTING, raising=False)
    assert in_a_thread("cuda") == (False, os.SCHED_OTHER)
    assert in_a_thread("cpu", shared_machine=False) == (False, os.SCHED_OTHER)
    monkeypatch.setenv(cpu_priority.SETTING, "normal")
    assert in_a_thread("cpu") == (False, os.SCHED_OTHER)
    monkeypatch.setenv(cpu_priority.SETTING, "background")
    assert in_a_thread("cpu", shared_machine=False) == (True, os.SCHED_IDLE)
    monkeypatch.setenv(cpu_priority.SETTING, "lowest")
    with caplog.at_level(logging.WARNING, logger="workers"):
        assert in_a_thread("cpu", shared_machine=False) == (False, os.SCHED_OTHER)
    assert "ORCHESTRATOR_CPU_TRAINING=lowest is neither 'background' nor 'normal': ignored" in caplog.text


def test_the_threads_that_train_under_torchrun_are_background_work(tmp_path):
    """A real 2-process job under torchrun (the loop without Ray), each rank with 2 threads
    for torch: every thread that did much of a rank's work is SCHED_IDLE, whichever thread
    started it (the training thread, torch's intra-op pool, gloo's). Ray's ranks: checked
    in tests/test_ray_run.py."""
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
        for pid in ranks:
            policies, used = busy_thread_policies(pid)
            assert max(used.values()) > 20, f"rank {pid} did not train: {used}"
            assert policies == {os.SCHED_IDLE}, used
    finally:
        job.terminate()
        job.wait(timeout=60)
    assert not [pid for pid in ranks if Path(f"/proc/{pid}").exists()], "a rank outlived torchrun"
