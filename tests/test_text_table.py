"""`orchestrator queue`'s table: aligned plain text, colour only on a terminal, fast at scale."""

from orchestrator.commands import text_table
from orchestrator.commands.queue import QUEUE_COLUMNS, queue_row


def _job(i: int, state: str = "running", note: str = "") -> dict:
    return {
        "id": f"train-{i:04d}-1127-101010-abcd",
        "name": f"train-{i}",
        "priority": i % 3,
        "state": state,
        "per_worker": {"CPU": 1, "GPU": 1},
        "placement": {"node": 4},
        "workers": 4,
        "waited_s": 62,
        "step": i,
        "total_steps": 1000,
        "note": note,
    }


def test_columns_line_up_and_the_note_is_cut_at_the_width():
    jobs = [_job(7), _job(1234, "queued", note="waits for 4 GPU " * 20)]
    rows = [queue_row(job) for job in jobs]
    lines = text_table.render(QUEUE_COLUMNS, rows, width=140, tty=False).splitlines()
    assert lines[0].split() == list(QUEUE_COLUMNS)
    starts = [lines[0].index(h) for h in ("NAME", "STATE", "STEP", "NOTE")]
    for line, job in zip(lines[1:], jobs):
        assert [line.index(v) for v in (job["name"] + " ", job["state"], f"{job['step']}/1000")] == starts[:3]
    assert lines[2].index("waits for") == starts[3]
    assert len(lines[2]) == 140 and lines[2].endswith("…")
    assert "\033[" not in "\n".join(lines)  # no colour when not on a terminal


def test_on_a_terminal_the_state_is_coloured_and_the_columns_still_line_up():
    rows = [queue_row(_job(1)), queue_row(_job(2, "failed"))]
    plain = text_table.render(QUEUE_COLUMNS, rows, width=200, tty=False).splitlines()
    coloured = text_table.render(QUEUE_COLUMNS, rows, width=200, tty=True).splitlines()
    assert "\033[36mrunning\033[0m" in coloured[1] and "\033[31mfailed\033[0m" in coloured[2]
    unpainted = [line.replace("\033[0m", "").replace("\033[1m", "") for line in coloured]
    unpainted = [line.replace("\033[36m", "").replace("\033[31m", "") for line in unpainted]
    assert unpainted == plain


def test_a_thousand_rows_line_up_in_one_column_each():  # its time: bench/service_scale.py
    rows = [queue_row(_job(i)) for i in range(1050)]
    lines = text_table.render(QUEUE_COLUMNS, rows, width=200, tty=False).splitlines()
    assert len(lines) == 1051 and len({line.index("running") for line in lines[1:]}) == 1
