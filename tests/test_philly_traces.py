"""The Philly job log converter (bench/philly.py): small hand-written inputs in its two formats."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from philly import (  # noqa: E402
    cluster_nodes,
    from_log,
    from_pcs,
    job_from_log,
    load_vcs,
    offered_load,
    pcs_speedups,
    write_vcs,
)
from traces import TraceJob  # noqa: E402


def attempt(start, end, *servers):
    return {
        "start_time": start,
        "end_time": end,
        "detail": [{"ip": ip, "gpus": gpus} for ip, gpus in servers],
    }


def entry(vc, jobid, submitted, *attempts, status="Pass"):
    return {"status": status, "vc": vc, "jobid": jobid, "submitted_time": submitted, "user": "u1",
            "attempts": list(attempts)}  # fmt: skip


def test_a_job_runs_for_the_sum_of_its_complete_attempts_on_its_most_gpus():
    job = entry(
        "vc1",
        "a",
        "2017-10-07 01:11:39",
        attempt("2017-10-07 01:12:09", "2017-10-07 01:13:23", ("m1", ["gpu0", "gpu1"])),
        attempt(
            "2017-10-07 01:13:30",
            "2017-10-07 02:13:30",
            ("m2", ["gpu0", "gpu1", "gpu2", "gpu3"]),
            ("m3", ["gpu0"]),
        ),
        attempt("2017-10-07 03:00:00", None, ("m4", ["gpu0"])),  # no end: not counted
    )
    _, gpus, run_s = job_from_log(job)
    assert (gpus, run_s) == (5, 74 + 3600)


def test_jobs_that_never_ran_are_left_out_and_counted(tmp_path):
    log = tmp_path / "cluster_job_log"
    jobs = [
        entry(
            "vc1",
            "a",
            "2017-11-05 00:30:00",
            attempt("2017-11-05 00:31:00", "2017-11-05 00:41:00", ("m1", ["gpu0"])),
        ),
        # after the end of daylight saving time (01:59:59 PDT -> 01:00:00 PST): 4 hours later, not 3
        entry(
            "vc1",
            "b",
            "2017-11-05 03:30:00",
            attempt("2017-11-05 03:30:00", "2017-11-05 03:31:00", ("m1", ["gpu0"])),
        ),
        entry("vc1", "c", "2017-11-05 04:00:00"),  # no attempt
        entry("vc2", "d", "2017-11-06 00:00:00", attempt("None", "2017-11-06 01:00:00", ("m1", ["gpu0"]))),
        entry(
            "vc2",
            "e",
            "2017-11-06 00:00:00",
            attempt("2017-11-06 00:00:00", "2017-11-06 01:00:00", ("m1", [])),
        ),
        entry(
            "vc2",
            "f",
            "2017-11-06 00:05:00",
            attempt("2017-11-06 00:06:00", "2017-11-06 00:07:00", ("m1", ["gpu0"])),
            status="Killed",
        ),
    ]
    log.write_text(json.dumps(jobs))
    per_vc, skipped = from_log(log)
    assert skipped == {"vc1": 1, "vc2": 2}
    assert [(j.id, j.submit, j.gpus, j.duration, j.user) for j in per_vc["vc1"]] == [
        ("a", 0.0, 1, 600.0, "u1"),
        ("b", 4 * 3600.0, 1, 60.0, "u1"),
    ]
    assert [(j.id, j.submit) for j in per_vc["vc2"]] == [("f", 0.0)]  # a killed job ran too


MODELS = """
class Model(object):
    def __init__(self, name, total_iter, times_per_iter):
        pass

class A(Model):
    def __init__(self):
        super(A, self).__init__('AModel', 100 // 2, [400, 200, 160, 100])

class Toy(Model):
    def __init__(self):
        super(Toy, self).__init__('ToyModel', 10, [1.0 / (i + 1) for i in range(4)])
"""


def test_pcs_traces_are_divided_back_into_run_times(tmp_path):
    (tmp_path / "simulation" / "traces").mkdir(parents=True)
    (tmp_path / "simulation" / "models.py").write_text(MODELS)
    speedups = pcs_speedups(tmp_path / "simulation" / "models.py")
    assert speedups == {"AModel": [1.0, 2.0, 2.5, 4.0]}  # the computed toy list is skipped
    trace = tmp_path / "simulation" / "traces" / "trace_vc1.csv"
    trace.write_text(
        "app_id,submit_time,service,num_jobs,sleep_time,model_name\n"
        "0,0.0,120.0,1,0.0,AModel\n1,6.0,250.0,3,6.0,AModel\n"
    )
    jobs = from_pcs(tmp_path, "vc1", speedups)
    assert [(j.id, j.submit, j.gpus, j.duration) for j in jobs] == [
        ("vc1-00000", 0, 1, 120),
        ("vc1-00001", 6, 3, 100),
    ]
    trace.write_text("app_id,submit_time,service,num_jobs,sleep_time,model_name\n0,0.0,251.0,3,0.0,AModel\n")
    with pytest.raises(ValueError, match="not whole seconds"):
        from_pcs(tmp_path, "vc1", speedups)


def test_the_cluster_holds_the_largest_job_at_an_offered_load_of_at_most_0_8():
    jobs = [TraceJob("a", 0, 1, 100.0), TraceJob("b", 1000, 24, 10.0)]
    assert cluster_nodes(jobs) == 3  # 24 GPUs: 3 nodes, though the load alone needs one
    busy = [TraceJob(str(i), i * 100.0, 8, 3200.0) for i in range(11)]  # 35,200 GPU-s a 100 s
    nodes = cluster_nodes(busy)
    assert offered_load(busy, nodes) <= 0.8 < offered_load(busy, nodes - 1)


def test_converted_vcs_round_trip_and_small_ones_are_left_out(tmp_path):
    per_vc = {
        "big": [TraceJob(f"j{i}", float(i), 1, 10.0) for i in range(5)],
        "small": [TraceJob("x", 0, 2, 5.0)],
    }
    write_vcs(per_vc, tmp_path, "from a test ({vc})", "a command")
    assert (
        (tmp_path / "philly-vc-big.csv")
        .read_text()
        .startswith("# Microsoft Philly job log, VC big: 5 jobs; from a test (big)\n")
    )
    loaded = load_vcs(tmp_path, min_jobs=2)
    assert list(loaded) == ["big"] and [j.submit for j in loaded["big"]] == [0, 1, 2, 3, 4]
