"""The durable metrics log (core/metrics_log.py) on real local filesystems, its readers in
other processes, `orchestrator metrics` / `orchestrator plot`, and TensorBoard event files."""

import argparse
import csv
import io
import json
import math
import os
import shlex
import subprocess
import sys
import textwrap
import time

import pyarrow.parquet as pq
import pytest

from core.metrics_log import (
    MERGE_FANOUT,
    TEMP_PREFIX,
    MetricsWriter,
    Part,
    metrics_table,
    read_metrics,
    records_table,
    visible_parts,
)
from orchestrator.commands import metrics as metrics_command
from tests.conftest import ROOT
from workers.tensorboard import TensorBoardWriter


def train_record(step: int, attempt: int = 0, **extra) -> dict:
    return {
        "step": step,
        "loss": 2.0 * math.exp(-step / 50) + 0.1 * attempt,
        "lr": 1e-3,
        "samples_per_s": 1000.0 + step,
        "time": 1_700_000_000.0 + step,
        "attempt": attempt,
        **extra,
    }


def eval_record(step: int, attempt: int = 0) -> dict:
    return {"step": step, "eval_loss": 1.0 / step, "eval_accuracy": 0.5 + step / 1000, "attempt": attempt}


def keys(records: list[dict]) -> list[tuple[int, bool]]:
    return [(r["step"], any(k.startswith("eval_") for k in r)) for r in records]


def part_files(run) -> list[str]:
    return sorted(os.listdir(run / "metrics"))


def test_append_buffers_until_flush_then_reads_back(tmp_path):
    run = tmp_path / "job"
    writer = MetricsWriter(str(run), flush_every_s=3600)
    writer.rewind([])
    assert read_metrics(str(run)) == []  # an empty log, not a missing one
    records = [train_record(s) for s in range(1, 6)]
    writer.append(records[:3])
    writer.append(records[3:])
    assert read_metrics(str(run)) == []  # buffered: the flush interval has not passed
    writer.flush()
    assert read_metrics(str(run)) == records
    assert all(Part.parse(name) is not None for name in part_files(run))


def test_append_writes_once_the_interval_has_passed(tmp_path):
    run = tmp_path / "job"
    writer = MetricsWriter(str(run), flush_every_s=0.05)
    writer.rewind([])
    writer.append([train_record(1)])
    time.sleep(0.06)
    writer.append([train_record(2)])
    assert [r["step"] for r in read_metrics(str(run))] == [1, 2]


def test_batches_with_different_fields_read_as_one_table(tmp_path):
    run = tmp_path / "job"
    writer = MetricsWriter(str(run), flush_every_s=0)
    writer.rewind([train_record(1)])
    batches = [
        [train_record(2, tokens_per_s=512_000.0, mfu=0.41)],
        [train_record(3, grad_norm=1)],  # an integer here, floats below: read as floats
        [eval_record(3)],
        [train_record(4, grad_norm=0.5, tflops_per_worker=120.5)],
    ]
    for batch in batches:
        writer.append(batch)
    table = metrics_table(str(run))
    assert table.column_names[0] == "step"
    assert {"tokens_per_s", "mfu", "grad_norm", "tflops_per_worker", "eval_loss"} <= set(table.column_names)
    assert str(table.schema.field("grad_norm").type) == "double"
    assert table.column("mfu").to_pylist() == [None, 0.41, None, None, None]
    expected = [train_record(1)] + [r for batch in batches for r in batch]
    assert read_metrics(str(run)) == expected  # fields a record lacks stay absent


def test_records_are_ordered_by_step_training_before_eval(tmp_path):
    run = tmp_path / "job"
    writer = MetricsWriter(str(run), flush_every_s=0)
    writer.rewind([eval_record(2), train_record(2), train_record(1)])
    writer.append([eval_record(4), train_record(3)])
    writer.append([train_record(4)])
    assert keys(read_metrics(str(run))) == [
        (1, False),
        (2, False),
        (2, True),
        (3, False),
        (4, False),
        (4, True),
    ]


def test_rewind_drops_later_records_including_those_in_a_straddling_part(tmp_path):
    run = tmp_path / "job"
    writer = MetricsWriter(str(run), flush_every_s=0)
    writer.rewind([])
    for steps in ([1, 2, 3, 4], [5, 6, 7, 8], [9, 10]):  # the rewind point 6 falls inside [5..8]
        writer.append([train_record(s) for s in steps])
    history = [train_record(s) for s in range(1, 7)]

    restarted = MetricsWriter(str(run), flush_every_s=0)  # the restarted run's writer
    restarted.rewind(history)
    assert read_metrics(str(run)) == history
    restarted.append([train_record(7, attempt=1)])
    assert read_metrics(str(run)) == history + [train_record(7, attempt=1)]
    # the earlier generation is gone from storage, not just hidden
    assert {Part.parse(n).owner for n in part_files(run)} == {(restarted.generation, restarted.writer)}


def test_a_rewind_that_died_before_deleting_the_older_generation(tmp_path, monkeypatch):
    run = tmp_path / "job"
    writer = MetricsWriter(str(run), flush_every_s=0)
    writer.rewind([])
    for step in range(1, 21):
        writer.append([train_record(step)])
    monkeypatch.setattr(MetricsWriter, "_delete_older_generations", lambda self: None)  # died here
    history = [train_record(s) for s in range(1, 6)]
    MetricsWriter(str(run), flush_every_s=0).rewind(history)
    assert len({Part.parse(n).owner for n in part_files(run)}) == 2
    assert read_metrics(str(run)) == history


def test_rewind_restores_records_a_dead_writer_never_flushed(tmp_path):
    run = tmp_path / "job"
    writer = MetricsWriter(str(run), flush_every_s=3600)
    writer.rewind([])
    writer.append([train_record(s) for s in range(1, 11)])  # never flushed: the process died
    history = [train_record(s) for s in range(1, 9)]  # what the checkpoint at step 8 holds
    MetricsWriter(str(run)).rewind(history)
    assert read_metrics(str(run)) == history


def test_each_step_once_across_two_restarts_a_preemption_and_a_late_writer(tmp_path):
    run = str(tmp_path / "job")
    expected: list[dict] = []  # what the log must hold at the end

    def attempt(number: int, resume_step: int, last_step: int, flushed: bool) -> MetricsWriter:
        """One start of the run: resume from the checkpoint at `resume_step`, log up to `last_step`,
        then die (`flushed=False`: the last buffered records are lost with the process)."""
        nonlocal expected
        expected = [r for r in expected if r["step"] <= resume_step]
        writer = MetricsWriter(run, flush_every_s=0)
        writer.rewind(list(expected))
        for step in range(resume_step + 1, last_step + 1):
            batch = [train_record(step, number)] + ([eval_record(step, number)] if step % 10 == 0 else [])
            expected += batch
            if not flushed and step > last_step - 3:
                writer.flush_every_s = 3600  # the last 3 steps stay in a buffer that dies
            writer.append(batch)
        if flushed:
            writer.flush()
        return writer

    attempt(0, 0, 27, flushed=False)  # crash at step 27, checkpoint at 20
    late = attempt(1, 20, 44, flushed=False)  # crash at step 44, checkpoint at 40
    attempt(2, 40, 50, flushed=True)  # preempted: checkpointed at 50 and stopped cleanly
    late.flush_every_s = 0
    late.append([train_record(45, attempt=1)])  # a writer of an earlier attempt, still alive
    attempt(3, 50, 60, flushed=True)  # resumed after the preemption; finishes

    records = read_metrics(run)
    assert records == expected
    assert len(keys(records)) == len(set(keys(records)))
    assert [r["step"] for r in records if "loss" in r] == list(range(1, 61))
    assert [r["attempt"] for r in records if "loss" in r] == [0] * 20 + [1] * 20 + [2] * 10 + [3] * 10


def test_many_flushes_are_merged_into_few_parts(tmp_path):
    run = tmp_path / "job"
    writer = MetricsWriter(str(run), flush_every_s=0)
    writer.rewind([])
    for step in range(1, 301):
        writer.append([train_record(step)])
    assert [r["step"] for r in read_metrics(str(run))] == list(range(1, 301))
    assert len(part_files(run)) < 2 * MERGE_FANOUT  # 301 batches, not 301 files


def test_visible_parts_take_each_batch_once_and_only_the_newest_generation():
    old = [Part(1, "aaaa0000", b, b) for b in range(0, 30)]
    merged = [Part(2, "bbbb0000", 0, 15)] + [Part(2, "bbbb0000", b, b) for b in range(0, 18)]
    not_started = [Part(3, "cccc0000", 1, 1)]  # a newer writer whose batch 0 never landed
    chosen, gap = visible_parts(old + merged + not_started)
    assert chosen == [Part(2, "bbbb0000", 0, 15), Part(2, "bbbb0000", 16, 16), Part(2, "bbbb0000", 17, 17)]
    assert not gap
    _, gap = visible_parts([Part(2, "bbbb0000", 0, 0), Part(2, "bbbb0000", 2, 2)])
    assert gap  # a listing taken mid-merge: the reader lists again


def test_parts_left_by_a_writer_killed_mid_merge_are_read_once(tmp_path):
    run = tmp_path / "job"
    writer = MetricsWriter(str(run), flush_every_s=0)
    writer.rewind([])
    for step in range(1, MERGE_FANOUT + 3):
        writer.append([train_record(step)])
    # the merge committed, but the writer died before deleting what it merged: put one back
    leftover = Part(writer.generation, writer.writer, 3, 3)
    pq.write_table(records_table([train_record(3)]), str(run / "metrics" / leftover.name))
    steps = [r["step"] for r in read_metrics(str(run))]
    assert steps == list(range(1, MERGE_FANOUT + 3))


def test_leftover_temporary_files_of_a_killed_writer_are_ignored_then_removed(tmp_path):
    run = tmp_path / "job"
    writer = MetricsWriter(str(run), flush_every_s=0)
    writer.rewind([train_record(1)])
    writer.append([train_record(2)])
    # a writer killed mid-write: half a Parquet file under its temporary name, for a batch of
    # this generation and for the batch 0 of a newer generation that never landed
    whole = (run / "metrics" / part_files(run)[0]).read_bytes()
    names = [
        TEMP_PREFIX + Part(writer.generation, writer.writer, 2, 2).name,
        TEMP_PREFIX + Part(writer.generation + 1, "deadbeef", 0, 0).name,
    ]
    for name in names:
        (run / "metrics" / name).write_bytes(whole[: len(whole) // 2])
    assert [r["step"] for r in read_metrics(str(run))] == [1, 2]

    restarted = MetricsWriter(str(run), flush_every_s=0)
    restarted.rewind([train_record(1)])
    assert restarted.generation > writer.generation + 1  # past every generation in the folder
    assert read_metrics(str(run)) == [train_record(1)]
    assert not [n for n in part_files(run) if n.startswith(TEMP_PREFIX)]


def test_an_unreadable_part_is_skipped_not_fatal(tmp_path):
    run = tmp_path / "job"
    writer = MetricsWriter(str(run), flush_every_s=0)
    writer.rewind([train_record(1)])
    writer.append([train_record(2)])
    writer.append([train_record(3)])
    (run / "metrics" / Part(writer.generation, writer.writer, 1, 1).name).write_bytes(b"")  # crashed disk
    assert [r["step"] for r in read_metrics(str(run))] == [1, 3]


def test_append_needs_a_rewind_and_records_need_a_step(tmp_path):
    writer = MetricsWriter(str(tmp_path / "job"))
    with pytest.raises(RuntimeError, match="rewind"):
        writer.append([train_record(1)])
    writer.rewind([])
    for record in ({"loss": 1.0}, {"step": 1.5, "loss": 1.0}):
        with pytest.raises(ValueError, match="integer 'step'"):
            writer.append([record])
    writer.append([train_record(1, note="text")])  # any other value is kept
    writer.flush()
    assert read_metrics(str(tmp_path / "job")) == [train_record(1, note="text")]


def test_a_missing_log_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing logged"):
        read_metrics(str(tmp_path / "nope"))


def test_runs_logged_as_jsonl_still_read(tmp_path):
    run = tmp_path / "old"
    run.mkdir()
    lines = [json.dumps(train_record(1)), json.dumps(eval_record(1)), '{"step": 2, "lo']  # cut short
    (run / "metrics.jsonl").write_text("\n".join(lines))
    assert read_metrics(str(run)) == [train_record(1), eval_record(1)]


WRITER_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    from core.metrics_log import MetricsWriter

    run, out = sys.argv[1], sys.argv[2]
    expected = []
    # three starts of the run: each resumes from a checkpoint, so each rewinds the log
    for attempt, (resume, last) in enumerate([(0, 120), (100, 230), (200, 330)]):
        expected = [r for r in expected if r["step"] <= resume]
        writer = MetricsWriter(run, flush_every_s=0)
        writer.rewind(expected)
        for step in range(resume + 1, last + 1):
            batch = [{"step": step, "loss": 1.0 / step, "attempt": attempt}]
            if step % 20 == 0:
                batch.append({"step": step, "eval_loss": 2.0 / step, "attempt": attempt})
            expected += batch
            writer.append(batch)
            time.sleep(0.003)  # a pace the reader can interleave with
        writer.flush()
    json.dump(expected, open(out, "w"))
    """
)


def test_a_reader_in_another_process_never_sees_a_step_twice(tmp_path):
    run, out = tmp_path / "job", tmp_path / "expected.json"
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER_SCRIPT, str(run), str(out)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    sizes = set()
    try:
        while writer.poll() is None:
            try:
                records = read_metrics(str(run))
            except FileNotFoundError:  # only before the writer's first part
                assert not sizes
                time.sleep(0.005)
                continue
            seen = keys(records)
            assert len(seen) == len(set(seen)), "a step read twice"
            assert seen == sorted(seen)
            steps = [step for step, is_eval in seen if not is_eval]
            assert steps == list(range(1, len(steps) + 1)), "a consistent state has no holes"
            for r in records:  # every record whole, as one attempt wrote it
                assert r["loss" if "loss" in r else "eval_loss"] == pytest.approx(
                    (1 if "loss" in r else 2) / r["step"]
                )
            sizes.add(len(records))
    finally:
        writer.wait(timeout=60)
    assert writer.returncode == 0
    assert len(sizes) >= 4, "the reader should have read while the writer wrote"
    assert read_metrics(str(run)) == json.loads(out.read_text())


# -- the commands -------------------------------------------------------------------------------


def command(*argv: str):
    parser = argparse.ArgumentParser(prog="orchestrator")
    metrics_command.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    return args.handler(args)


@pytest.fixture
def logged_run(tmp_path):
    """A run `demo` under tmp_path/runs with 40 training records and 4 evals."""
    storage = tmp_path / "runs"
    writer = MetricsWriter(str(storage / "demo"), flush_every_s=0)
    writer.rewind([])
    for step in range(10, 410, 10):
        record = train_record(step, tokens_per_s=128_000.0 + step, mfu=0.4 + step / 10_000)
        writer.append([record] + ([eval_record(step)] if step % 100 == 0 else []))
    return storage


def test_metrics_prints_a_table(logged_run, capsys):
    assert command("metrics", "demo", "--storage", str(logged_run)) == 0
    out = capsys.readouterr().out
    assert "demo: 44 records, steps 10-400" in out
    for header in ("step", "loss", "samples/s", "tokens/s", "MFU", "eval loss", "eval accuracy"):
        assert header in out
    assert "90.00%" in out  # eval accuracy at step 400, as a percentage
    assert "Traceback" not in out


def test_metrics_piped_into_head_ends_quietly(tmp_path):
    """`orchestrator metrics --csv RUN | head`: the reader leaves early, and no traceback follows
    (every command: the CLI's entry point handles it)."""
    writer = MetricsWriter(str(tmp_path / "long"), flush_every_s=0)
    writer.rewind([])
    writer.append([train_record(step) for step in range(1, 20_001)])  # far more than a pipe holds
    argv = [sys.executable, "-m", "orchestrator", "metrics", str(tmp_path / "long"), "--csv"]
    pipeline = f"{shlex.join(argv)} | head -n 2; echo status=${{PIPESTATUS[0]}} >&2"
    done = subprocess.run(
        ["bash", "-c", pipeline], cwd=ROOT, capture_output=True, text=True, timeout=120, env=os.environ
    )
    assert len(done.stdout.splitlines()) == 2
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert "status=141" in done.stderr  # as a command killed by SIGPIPE, e.g. cat


def test_metrics_tail_and_run_folder_path(logged_run, capsys):
    assert command("metrics", str(logged_run / "demo"), "--tail", "3") == 0
    out = capsys.readouterr().out
    assert "last 3 of 44 records, steps 390-400" in out
    rows = [line for line in out.splitlines() if line.startswith("│")]
    assert [row.split("│")[1].strip() for row in rows] == ["390", "400", "400"]


def test_metrics_csv_has_every_field_at_full_precision(logged_run, capsys):
    assert command("metrics", "demo", "--storage", str(logged_run), "--csv", "--tail", "2") == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["step"] for r in rows] == ["400", "400"]
    assert float(rows[0]["loss"]) == train_record(400)["loss"]
    assert rows[0]["eval_loss"] == "" and float(rows[1]["eval_accuracy"]) == eval_record(400)["eval_accuracy"]
    assert list(rows[0])[:2] == ["step", "loss"] and list(rows[0])[-1] == "time"


def test_metrics_of_a_missing_run_is_one_line_and_exit_2(tmp_path, capsys):
    assert command("metrics", "nope", "--storage", str(tmp_path)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: no metrics for 'nope' under {tmp_path}: ")
    assert err.count("\n") == 1
    (tmp_path / "empty").mkdir()
    assert command("metrics", "empty", "--storage", str(tmp_path)) == 2
    assert "nothing logged in" in capsys.readouterr().err


def test_metrics_rejects_a_bad_tail(logged_run, capsys):
    with pytest.raises(SystemExit) as exit_:
        command("metrics", "demo", "--tail", "0")
    assert exit_.value.code == 2


def test_plot_writes_a_png(logged_run, tmp_path, capsys):
    out = tmp_path / "plots" / "curves.png"
    assert command("plot", "demo", "--storage", str(logged_run), "--out", str(out)) == 0
    assert f"wrote {out}: loss, eval accuracy, learning rate, tokens/s, MFU" in capsys.readouterr().out
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 50_000


def test_plot_errors_are_one_line_and_exit_2(logged_run, tmp_path, capsys):
    assert command("plot", "demo", "--storage", str(logged_run), "--out", str(tmp_path / "x.txt")) == 2
    assert "must end in .png, .svg or .pdf" in capsys.readouterr().err
    assert command("plot", "nope", "--storage", str(logged_run), "--out", str(tmp_path / "x.png")) == 2
    assert "error: no metrics for 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


# -- TensorBoard --------------------------------------------------------------------------------


def scalars(log_dir, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def test_tensorboard_event_files_hold_train_and_eval_scalars(tmp_path):
    log_dir = tmp_path / "job" / "tensorboard"
    board = TensorBoardWriter(log_dir)
    board.write([train_record(10, mfu=0.25), eval_record(10), train_record(20)])
    board.close()
    assert any(p.name.startswith("events.out.tfevents") for p in log_dir.iterdir())
    assert scalars(log_dir, "train/loss") == [
        (10, pytest.approx(train_record(10)["loss"])),
        (20, pytest.approx(train_record(20)["loss"])),
    ]
    assert scalars(log_dir, "train/mfu") == [(10, pytest.approx(0.25))]
    assert scalars(log_dir, "eval/accuracy") == [(10, pytest.approx(eval_record(10)["eval_accuracy"]))]


def test_tensorboard_rewind_hides_what_came_after_the_checkpoint(tmp_path):
    log_dir = tmp_path / "tensorboard"
    first = TensorBoardWriter(log_dir)
    first.write([train_record(s) for s in range(1, 11)])
    first.close()
    restarted = TensorBoardWriter(log_dir)
    restarted.rewind([train_record(s) for s in range(1, 6)])
    restarted.write([train_record(s, attempt=1) for s in range(6, 8)])
    restarted.close()
    assert scalars(log_dir, "train/attempt") == [(s, 0.0) for s in range(1, 6)] + [(6, 1.0), (7, 1.0)]


def test_tensorboard_refuses_remote_directories():
    with pytest.raises(ValueError, match="local directory"):
        TensorBoardWriter("s3://bucket/runs/job/tensorboard")
