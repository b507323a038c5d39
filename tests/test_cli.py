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
    assert "train.steps: -1 is out of range; allowed: 1 to 1000000000" in result.stderr


def test_validate_checks_the_spec_not_this_machine(monkeypatch, capsys):
    """Without the Fashion-MNIST files here, the example specs are still valid: the data must exist
    where the job runs, and `validate` only notes that it is not here."""
    from orchestrator import cli
    from workers.data import fashion_mnist

    empty = ROOT / "tests" / "no-such-dir"  # never created: the lookup finds nothing
    monkeypatch.setattr(fashion_mnist, "SYSTEM_DIR", empty)
    monkeypatch.setattr(fashion_mnist, "CACHE_DIR", empty)
    specs = sorted(str(p) for p in (ROOT / "jobs").glob("*.yaml"))
    assert cli.main(["validate", *specs]) == 0
    out, err = capsys.readouterr()
    assert out.count(": ok (") == len(specs)
    notes = err.splitlines()
    assert sorted(n.split(":")[1].strip() for n in notes) == [
        str(ROOT / "jobs/resnet.yaml"),
        str(ROOT / "jobs/vit.yaml"),
    ]
    assert all(
        "data.source fashion-mnist: not available on this machine (it must exist where the job runs)" in n
        and n.startswith("note: ")
        for n in notes
    )
    # `run` checks the data where the job runs (here), with the message that says where it looked
    from orchestrator.commands.run import load_runnable
    from workers.run import run_local

    spec = load_runnable(str(ROOT / "jobs/vit.yaml"), ["train.steps=1", "train.epochs=null"])
    assert run_local(spec) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("error: vit-fashion-mnist: data.download: fashion-mnist: dataset not found in")
    assert "apt-get install dataset-fashion-mnist" in line


def test_run_local_checks_data_before_training(cli, tmp_path):
    summary = tmp_path / "summary.json"
    missing = tmp_path / "fashion-mnist"
    args = [str(ROOT / "jobs/resnet.yaml"), "--set", f"data.path={missing}"]
    result = cli("validate", *args)
    assert result.returncode == 0, result.stderr
    assert f"note: {ROOT / 'jobs/resnet.yaml'}: data.source fashion-mnist: not available" in result.stderr
    result = cli("run", "--local", *args, "--summary", str(summary))
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"error: resnet-fashion-mnist: data.path: no such directory '{missing}'"
    ]
    assert "step" not in result.stdout  # nothing trained
    assert json.loads(summary.read_text())["status"] == "failed"


def test_torchrun_entry_point_checks_the_spec_and_the_data(cli, tmp_path):
    args = [str(ROOT / "jobs/convnet.yaml"), "--set", "model.preset=convnet_huge"]
    result = cli(*args, module="workers.run")
    assert result.returncode == 2
    assert "model.preset: unknown preset 'convnet_huge' for family 'convnet'" in result.stderr
    missing = tmp_path / "absent"
    result = cli(str(ROOT / "jobs/resnet.yaml"), "--set", f"data.path={missing}", module="workers.run")
    assert result.returncode == 1 and "data.path: no such directory" in result.stderr
    assert "Traceback" not in result.stderr


def test_run_accepts_scheduling_and_rejects_unsupported_combinations(cli):
    ok = cli(
        "validate",
        str(ROOT / "jobs/convnet.yaml"),
        "--set",
        "scheduling={priority: 5, preemptible: true, queue: batch, preemption_grace_s: 30}",
        "--set",
        "metrics.tensorboard=true",
    )
    assert ok.returncode == 0, ok.stderr
    result = cli("run", "--local", str(ROOT / "jobs/convnet.yaml"), "--set", "parallel.cpu_offload=true")
    assert result.returncode == 2
    assert "parallel.cpu_offload: only applies to parallel.strategy 'fsdp2'" in result.stderr
    assert "Traceback" not in result.stderr
    result = cli("validate", str(ROOT / "jobs/convnet.yaml"), "--set", "metrics.prometheus_port=9100")
    assert result.returncode == 2 and "metrics.prometheus_port: unknown field" in result.stderr


def test_validate_a_sweep(cli, tmp_path):
    path = tmp_path / "sweep.yaml"
    base = (ROOT / "jobs/convnet.yaml").read_text()
    path.write_text(
        base + "sweep:\n  method: grid\n  metric: eval_accuracy\n  parameters:\n"
        "    optimizer.lr: {values: [0.001, 0.003, 0.01]}\n    train.seed: {values: [0, 1]}\n"
    )
    result = cli("validate", str(path))
    assert result.returncode == 0, result.stderr
    assert "a grid sweep of 6 trials by eval_accuracy (max)" in result.stdout
    result = cli("validate", str(path), "--set", "sweep.metric=accuracy")
    assert result.returncode == 2 and "sweep.metric: 'accuracy' is not allowed" in result.stderr


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


@pytest.mark.parametrize(
    "args, words",
    [
        (["--address", "127.0.0.1:1", "--redis", "127.0.0.1:6380"], "--redis: the cluster at 127.0.0.1:1"),
        (["--node-loss-wait", "-1"], "--node-loss-wait -1: must be 0 or more seconds"),
        (["--grow-after", "-5"], "--grow-after -5: must be 0 or more seconds"),
        (["--move-after", "nan"], "--move-after nan: must be 0 or more seconds"),
        (["--autoscaler-config", "/no/such.yaml"], "--autoscaler-config /no/such.yaml: cannot read it"),
        (["--autoscaler-config", "jobs/vit.yaml"], "jobs/vit.yaml: available_node_types: required"),
    ],
)
def test_up_refuses_options_it_cannot_honour_before_touching_any_cluster(cli, tmp_path, args, words):
    result = cli("up", *args, env={"ORCHESTRATOR_HOME": str(tmp_path), "RAY_ADDRESS": ""})
    assert result.returncode == 2, result.stdout + result.stderr
    assert words in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "cluster.json").exists()


def test_submit_with_no_service_known_says_to_start_one(cli, tmp_path):
    env = {"ORCHESTRATOR_HOME": str(tmp_path / "home"), "RAY_ADDRESS": "", "RAY_API_SERVER_ADDRESS": ""}
    for args in (["jobs/convnet.yaml"], ["jobs/convnet.yaml", "--no-validate"]):
        result = cli("submit", *args, env=env)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith(
            "error: no orchestrator service known here: start one with `orchestrator up`"
        )
        assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1


def test_token_auth_without_a_token_is_one_line_before_ray_is_touched(cli, tmp_path):
    """RAY_AUTH_MODE=token (as the virtualenv sets it) and no token anywhere Ray looks: joining
    a cluster says what to do, where Ray's own client would abort the process."""
    import socket

    env = {k: "" for k in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS", "ORCHESTRATOR_URL")}
    env.update(HOME=str(tmp_path), RAY_AUTH_MODE="token", ORCHESTRATOR_HOME=str(tmp_path / "home"))
    with socket.socket() as listener:  # something answers at the address
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        result = cli("queue", "--address", address, env=env)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith(f"error: the Ray cluster at {address} requires an auth token and none was found")


def test_down_after_its_head_died_forgets_it_at_once(cli, tmp_path):
    """`up` started a local head that has since died (the machine rebooted, its processes were
    killed): `down` does not wait on a GCS that is gone (Ray retries for minutes), stops
    whatever of the head is left and forgets it."""
    from tests.conftest import _free_ports

    home = tmp_path / "home"
    home.mkdir()
    (port,) = _free_ports(1)  # nothing listens there
    temp_dir = tmp_path / "orch-gone"
    temp_dir.mkdir()
    state = {"address": f"127.0.0.1:{port}", "started_head": True, "temp_dir": str(temp_dir)}
    (home / "cluster.json").write_text(json.dumps(state))
    result = cli("down", env={"ORCHESTRATOR_HOME": str(home), "RAY_ADDRESS": ""}, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"cannot connect to the Ray cluster at '127.0.0.1:{port}': nothing answers there" in result.stdout
    assert "stopped the local Ray head (0 processes)" in result.stdout
    assert not (home / "cluster.json").exists() and not temp_dir.exists()


def test_each_command_is_found_in_the_module_that_registers_it():
    """`MODULE_OF` (which module a command's parser lives in) matches what the modules add."""
    import argparse
    import importlib

    from orchestrator.cli import COMMANDS, MODULE_OF

    registered = {}
    for module in COMMANDS:
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(f"orchestrator.commands.{module}").register(sub)
        registered.update(dict.fromkeys(sub.choices, module))
    assert registered == MODULE_OF


def test_queue_and_status_load_neither_the_spec_schema_nor_pydantic(tmp_path):
    """On a head whose cores training fills, every import costs a command seconds
    (docs/scaling.md): the commands that only read the service import only what they use."""
    import subprocess
    import sys

    probe = (
        "import sys; from orchestrator.cli import build_parser\n"
        "for argv in (['queue'], ['status', 'some-job']):\n"
        "    args = build_parser(argv[0]).parse_args(argv)\n"
        "    assert callable(args.handler)\n"
        "heavy = ('pydantic', 'core.spec', 'yaml', 'ray', 'torch', 'asyncio')\n"
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_spec_error_is_one_line_and_exit_2_whichever_command_loads_the_spec(cli):
    done = cli("submit", "jobs/vit.yaml", "--set", "train.steps=-1")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    expected = "error: jobs/vit.yaml: train.steps: -1 is out of range; allowed: 1 to 1000000000"
    assert done.stderr.strip() == expected


def test_the_orders_clients_name_are_the_schemas():
    import typing

    from core.queue_orders import ORDERS
    from core.queues import Order

    assert typing.get_args(Order) == ORDERS


def test_replica_groups_validate_and_the_service_takes_them(cli):
    groups = [str(ROOT / "jobs/convnet.yaml"), "--set", "fault_tolerance.replica_groups=2"]
    assert cli("validate", *groups).returncode == 0
    from core.spec import load_spec
    from orchestrator.service.sent_spec import checked

    spec = checked(load_spec(groups[0], ["fault_tolerance.replica_groups=2"]))  # a submit's check
    assert spec.fault_tolerance.replica_groups == 2
    uneven = cli("validate", groups[0], "--set", "fault_tolerance.replica_groups=3")
    assert uneven.returncode == 2 and "Traceback" not in uneven.stderr
    [line] = uneven.stderr.strip().splitlines()
    assert line.endswith("fault_tolerance.replica_groups: 3 groups do not divide resources.num_workers (2)")
