"""The faults the live tests inject into their jobs (workers/faults.py), checked without Ray."""

from types import SimpleNamespace

import torch

from workers import faults


def test_a_paced_job_sleeps_in_each_step_until_the_test_releases_it(tmp_path, monkeypatch):
    monkeypatch.setenv(faults.ENV, str(tmp_path))
    (tmp_path / "held").write_text("paced=0.05\n")
    assert faults.faults_for("held") == {"paced": "0.05"} and faults.faults_for("other") == {}
    slept: list[float] = []  # the hook's sleeps, counted instead of timed
    monkeypatch.setattr(faults, "time", SimpleNamespace(sleep=slept.append))
    model = torch.nn.Linear(2, 2)
    model.register_forward_pre_hook(faults._paced(0.05, tmp_path / "held.go"))

    def sleeps_in(steps: int) -> list[float]:
        slept.clear()
        for _ in range(steps):
            model(torch.zeros(1, 2))
        return list(slept)

    assert sleeps_in(3) == [0.05] * 3  # paced
    (tmp_path / "held.go").touch()
    assert sleeps_in(3) == []  # released: full speed from the next step
    (tmp_path / "held.go").unlink()
    assert sleeps_in(1) == []  # and for good, whatever happens to the file
