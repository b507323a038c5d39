"""`orchestrator export CHECKPOINT --out model.onnx`: each model family, trained two steps on
the CPU, exported and run in ONNX Runtime, gives PyTorch's logits for the same inputs (fp32;
tolerance below) at a batch size other than the one traced (the batch dimension is free)."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from core.spec import load_spec
from tests.conftest import run_cli
from tests.dist_suite import GPT, GPT_JOB, VIT, VIT_JOB
from workers import onnx_export
from workers.checkpoint import read_model_state
from workers.checkpoint_files import file_entries, write_manifest
from workers.context import LocalContext
from workers.models import registry
from workers.run import train

# fp32 on both sides; only the kernels' summation order differs (ORT's MLAS against ATen)
ATOL, RTOL = 1e-4, 1e-4

ONE_PROCESS = ["parallel.strategy=none", "resources.num_workers=1", "train.eval_every=null"]
FAMILIES = {
    "convnet": (VIT_JOB, []),
    "resnet": (VIT_JOB, ["model.family=resnet", "model.preset=resnet_tiny"]),
    "vit": (VIT_JOB, VIT),
    "gpt": (GPT_JOB, GPT),
}


def trained_checkpoint(tmp_path, family: str) -> str:
    job, sets = FAMILIES[family]
    spec = load_spec(job, [*sets, *ONE_PROCESS, "train.steps=2", f"checkpoint.storage={tmp_path / 'runs'}"])
    return train(spec, LocalContext(spec))["checkpoint"]


def pytorch_model(checkpoint: str):
    trainer_state = torch.load(f"{checkpoint}/trainer.pt", weights_only=True)
    family, config = onnx_export.config_of(trainer_state)
    model = registry.model_class(family)(config)
    model.load_state_dict(read_model_state(checkpoint), strict=True)
    return family, config, model.eval()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_an_exported_model_gives_pytorchs_logits_in_onnx_runtime(tmp_path, family):
    import onnxruntime

    checkpoint = trained_checkpoint(tmp_path, family)
    out = tmp_path / "model.onnx"
    result = run_cli("export", checkpoint, "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert f"wrote {out}: {family}/" in result.stdout and "note:" not in result.stdout

    family, config, model = pytorch_model(checkpoint)
    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    [given], [taken] = session.get_inputs(), session.get_outputs()
    assert (given.name, taken.name) == ("tokens" if family == "gpt" else "images", "logits")
    assert f"ONNX input '{given.name}'" in result.stdout
    for batch_size in (1, 3):  # traced at 2
        inputs = onnx_export.example_input(family, config, batch_size)
        if inputs.is_floating_point():
            inputs = torch.randn(inputs.shape, generator=torch.Generator().manual_seed(batch_size))
        with torch.no_grad():
            expected = model(inputs).numpy()
        [logits] = session.run(None, {given.name: inputs.numpy()})
        assert logits.shape == expected.shape
        np.testing.assert_allclose(logits, expected, atol=ATOL, rtol=RTOL)


def test_a_checkpoint_that_does_not_say_how_its_model_was_built_is_refused_in_one_line(tmp_path):
    checkpoint = trained_checkpoint(tmp_path, "convnet")
    trainer_file = f"{checkpoint}/trainer.pt"
    state = torch.load(trainer_file, weights_only=True)
    del state["model_config"]  # as written before ONNX export, its manifest matching it
    torch.save(state, trainer_file)
    manifest = json.loads(Path(checkpoint, "manifest.json").read_text())
    files = {**manifest["files"], **file_entries(Path(checkpoint), ["trainer.pt"])}
    write_manifest(Path(checkpoint), manifest["step"], files)
    out = tmp_path / "model.onnx"
    result = run_cli("export", checkpoint, "--out", str(out))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        f"error: {checkpoint}: this checkpoint does not say how its model was built (it predates"
        " ONNX export): export its weights with --out model.safetensors"
    ]
    assert not out.exists()
    safetensors = run_cli("export", checkpoint, "--out", str(tmp_path / "model.safetensors"))
    assert safetensors.returncode == 0, safetensors.stderr  # its weights still export


def test_fused_kernels_are_exported_as_the_built_in_ops_and_named():
    values = {
        **registry.config_class("vit")().__dict__,
        "kernels": {"attention": "triton", "layer_norm": "torch"},
    }
    state = {"model": json.dumps({"family": "vit"}), "model_config": json.dumps(values)}
    family, config = onnx_export.config_of(state)
    assert family == "vit" and set(config.kernels.values()) == {"torch"}
    assert onnx_export.fused_ops(state) == ["attention"]
