"""The command line as a user meets it: exit statuses, messages, no tracebacks."""

import json

import pytest

from tests.conftest import ROOT


def test_validate_all_examples(cli):
    specs = sorted(str(p) for p in (ROOT / "jobs").glob("*.yaml"))
    result = cli("validate", *specs)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count(": ok (") == len(specs)


@pytest.mark.parametrize(
    "text,words",
    [
        ("name: x\ntrain: {stpes: 3}\n", "train.stpes: unknown field; did you mean 'steps'?"),
        ("name: x\ntrain:\n  steps: 3\n   eval_every: 2\n", "YAML syntax error at line 4, column 14"),
        ("name: Bad Name\n", "name: must be lowercase"),
    ],
)
def test_validate_bad_spec_exits_2_without_traceback(cli, tmp_path, text, words):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    result = cli("validate", str(path))
    assert result.returncode == 2
    assert words in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_validate_bad_override_exits_2(cli):
    result = cli("validate", str(ROOT / "jobs/convnet.yaml"), "--set", "train.steps=-1")
    assert result.returncode == 2
    assert "train.steps: Input should be greater than or equal to 1 (got -1)" in result.stderr


def test_run_rejects_unimplemented_settings_loudly(cli):
    result = cli("run", "--local", str(ROOT / "jobs/convnet.yaml"), "--set", "scheduling.priority=5")
    assert result.returncode == 2
    assert "scheduling: priorities and preemption are not implemented yet" in result.stderr
    assert "Traceback" not in result.stderr


def test_models_table_lists_published_presets(cli):
    result = cli("models")
    assert result.returncode == 0, result.stderr
    for preset, params in [
        ("vit_b16", "86,567,656"),
        ("resnet50", "25,557,032"),
        ("gpt2_small", "124,475,904"),
    ]:  # 124,439,808 + 47 padded vocab rows
        line = next(line for line in result.stdout.splitlines() if f" {preset} " in line)
        assert params in line


def test_local_run_writes_summary_and_checkpoint(cli, tmp_path):
    summary = tmp_path / "summary.json"
    result = cli(
        "run",
        "--local",
        str(ROOT / "jobs/convnet.yaml"),
        "--set",
        "train.steps=6",
        "--set",
        f"checkpoint.storage={tmp_path / 'store'}",
        "--set",
        "train.eval_every=3",
        "--summary",
        str(summary),
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(summary.read_text())
    assert data["status"] == "succeeded" and data["steps"] == 6 and data["job"] == "convnet-digits"
    assert data["eval"]["eval_accuracy"] > 0.0 and data["samples_per_s"] > 0
    assert (tmp_path / "store/convnet-digits/checkpoint_00000006/trainer.pt").exists()
    assert "[convnet-digits] step 6/6" in result.stdout
