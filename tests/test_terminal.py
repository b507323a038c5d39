"""Progress output where there is no terminal: periodic plain lines, every event, the last step."""

import io

from orchestrator.monitoring.terminal import Display
from workers.progress import ProgressReporter


def test_plain_progress_lines_are_periodic_but_events_and_the_last_step_always_show():
    out = io.StringIO()
    with Display(live=False, stream=out) as display:
        display.event("job", "queued behind 1 job(s)")
        for step in range(1, 101):  # a job logging every step, faster than the print period
            display.progress("job", f"step {step}/100", step=step, total=100, loss=1.0 / step)
        display.event("job", "succeeded")
    lines = out.getvalue().splitlines()
    assert lines == [
        "[job] queued behind 1 job(s)",
        "[job] step 1/100",
        "[job] step 100/100",
        "[job] succeeded",
    ]
    assert display.jobs["job"].step == 100  # the panel's values follow every record


def test_worker_progress_prints_the_first_and_last_step_when_steps_are_fast(capsys):
    progress = ProgressReporter("job", total_steps=50, start_step=0, enabled=True, interactive=False)
    for step in range(1, 51):
        progress.update(step, loss=0.5, samples_per_s=100.0, lr=1e-3)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[2] for line in lines] == ["1/50", "50/50"]
