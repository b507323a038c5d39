"""Progress output where there is no terminal: periodic plain lines, every event, the last step."""

import io
import json

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


def test_a_step_read_again_is_not_printed_again():
    """`submit --wait` reads from the last step shown (an evaluation of it may come later):
    the same step comes back each poll, and the total comes from the panel, not the call."""
    out = io.StringIO()
    with Display(live=False, stream=out) as display:
        display.plain_every_s = 0.0  # every new step would print
        display.update("job", total=10)
        for step in (5, 5, 5, 10, 10):
            display.progress("job", f"step {step}/10", step=step)
    assert out.getvalue().splitlines() == ["[job] step 5/10", "[job] step 10/10"]


def test_worker_progress_prints_the_first_and_last_step_when_steps_are_fast(capsys):
    progress = ProgressReporter("job", total_steps=50, start_step=0, enabled=True, interactive=False)
    for step in range(1, 51):
        progress.update(step, loss=0.5, samples_per_s=100.0, lr=1e-3)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[2] for line in lines] == ["1/50", "50/50"]


class FinishedJobService:
    """The two reads `submit --wait` makes (a reader: the service's HTTP API or its actor),
    answered as the service does for a finished job."""

    def status(self, job_id):
        summary = {"steps": 30, "eval": {"eval_accuracy": 0.9}, "samples_per_s": 100.0, "checkpoint": "/c"}
        history = [{"time": 0.0, "event": "queued", "priority": 0}, {"time": 1.0, "event": "succeeded"}]
        return {"id": job_id, "state": "succeeded", "history": history, "summary": summary, "total_steps": 30}

    def metrics_since(self, job_id, step):
        return []


def test_submit_wait_ends_with_a_result_line_and_writes_the_summary(tmp_path, capsys):
    from orchestrator.commands.follow_jobs import follow_queued

    summary = tmp_path / "out" / "s.json"
    assert follow_queued(FinishedJobService(), ["job-1"], summary_path=str(summary)) == 0
    out = capsys.readouterr().out
    assert "[job-1] queued (priority 0)" in out
    assert "[job-1] succeeded: 30 steps, eval accuracy 90.00%, 100 samples/s, checkpoint /c" in out
    assert json.loads(summary.read_text())["steps"] == 30
    # a summary that cannot be written: one line, exit 2, the job's result already shown
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert follow_queued(FinishedJobService(), ["job-1"], summary_path=str(blocked / "s.json")) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --summary {blocked / 's.json'}: cannot write it")
    assert len(err.splitlines()) == 1


class TrainingJobService:
    """A job seen running (a checkpoint saved, an evaluation made), then finished."""

    def __init__(self):
        self.calls = 0

    def status(self, job_id):
        self.calls += 1
        view = {
            "id": job_id,
            "history": [],
            "total_steps": 20,
            "last_checkpoint": "/runs/j/checkpoint_00000010",
        }
        if self.calls == 1:
            return {**view, "state": "running"}
        summary = {
            "steps": 20,
            "final_train_loss": 0.25,
            "eval": {"eval_loss": 0.3125, "eval_accuracy": 0.905},
        }
        return {**view, "state": "succeeded", "summary": summary}

    def metrics_since(self, job_id, step):
        train = {"step": 10, "loss": 0.5, "samples_per_s": 100.0}
        return [train, {"step": 10, "eval_loss": 0.3125, "eval_accuracy": 0.905}]


def test_submit_wait_shows_checkpoints_and_evaluations_and_labels_the_losses(capsys):
    from orchestrator.commands.follow_jobs import follow_queued

    assert follow_queued(TrainingJobService(), ["j"], poll_s=0) == 0
    out = capsys.readouterr().out.splitlines()
    assert out.count("[j] checkpoint at step 10: /runs/j/checkpoint_00000010") == 1
    assert out.count("[j] eval at step 10: loss 0.3125, accuracy 90.50%") == 1
    assert out[-1] == (
        "[j] succeeded: 20 steps, train loss 0.2500, eval loss 0.3125, eval accuracy 90.50%, "
        "checkpoint /runs/j/checkpoint_00000010"
    )
