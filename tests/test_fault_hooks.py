"""The faults the live tests inject into their jobs (workers/faults.py), checked without Ray."""

import time

import torch

from workers import faults


def test_a_paced_job_sleeps_in_each_step_until_the_test_releases_it(tmp_path, monkeypatch):
    monkeypatch.setenv(faults.ENV, str(tmp_path))
    (tmp_path / "held").write_text("paced=0.05\n")
    assert faults.faults_for("held") == {"paced": "0.05"} and faults.faults_for("other") == {}
    model = torch.nn.Linear(2, 2)
    model.register_forward_pre_hook(faults._paced(0.05, tmp_path / "held.go"))

    def step_s() -> float:
        started = time.perf_counter()
        model(torch.zeros(1, 2))
        return time.perf_counter() - started

    assert min(step_s() for _ in range(3)) >= 0.05  # paced
    (tmp_path / "held.go").touch()
    assert max(step_s() for _ in range(3)) < 0.05  # released: full speed from the next step
    (tmp_path / "held.go").unlink()
    assert step_s() < 0.05  # and for good, whatever happens to the file
