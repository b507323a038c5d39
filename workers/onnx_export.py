"""A checkpoint's model as ONNX (`orchestrator export CHECKPOINT --out model.onnx`), for ONNX
Runtime and the serving stacks that take ONNX.

The model is rebuilt from the configuration its checkpoint carries (`model_config` in
trainer.pt: the family's `Config` as the run built it, input shape and classes included),
loaded with the checkpoint's weights, put in eval mode and exported by torch.onnx's dynamo
exporter (`torch.export`, then ONNX), with the batch dimension dynamic. Its input is
`images` (N, C, H, W) float32 or `tokens` (N, T) int64 with T = block_size; its output
`logits`.

Fused kernels (Triton) are a training path on a GPU: the exported graph uses the built-in
ops, whatever the run used (`kernels` of the config set to "torch"), and `export` says so
when that changed anything.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
from pathlib import Path

import torch

import kernels
from workers.models import registry

BUILT_IN = "torch"


class NotExportable(Exception):
    """A checkpoint ONNX export cannot rebuild the model of (one line, for the CLI)."""


def config_of(trainer_state: dict):
    """The family and `Config` the run built its model from; kernels set to the built-in ops."""
    if "model_config" not in trainer_state or "model" not in trainer_state:
        raise NotExportable(
            "this checkpoint does not say how its model was built (it predates ONNX export): "
            "export its weights with --out model.safetensors"
        )
    family = json.loads(trainer_state["model"])["family"]
    values = json.loads(trainer_state["model_config"])
    config_class = registry.config_class(family)
    names = {f.name for f in dataclasses.fields(config_class)}
    config = config_class(**{k: v for k, v in values.items() if k in names})
    if hasattr(config, "kernels"):
        config.kernels = {op: BUILT_IN for op in kernels.OPS}
    return family, config


def fused_ops(trainer_state: dict) -> list[str]:
    """The ops the run asked for another kernel than the built-in one."""
    values = json.loads(trainer_state.get("model_config", "{}"))
    return sorted(op for op, impl in (values.get("kernels") or {}).items() if impl not in (BUILT_IN, "auto"))


def example_input(family: str, config, batch_size: int) -> torch.Tensor:
    example = registry.example_input(config, batch_size)
    if example.dtype == torch.long:  # token ids: in range, not all 0
        return torch.randint(0, config.vocab_size, example.shape, generator=torch.Generator().manual_seed(0))
    return example


def export(trainer_state: dict, model_state: dict, out: Path) -> str:
    """Write the ONNX file; returns its input's name."""
    family, config = config_of(trainer_state)
    model = registry.model_class(family)(config)
    model.load_state_dict(model_state, strict=True)
    model.eval()
    example = example_input(family, config, batch_size=2)
    input_name = "tokens" if example.dtype == torch.long else "images"
    batch = torch.export.Dim("batch", min=1, max=65536)
    with _quiet():
        program = torch.onnx.export(
            model,
            (example,),
            dynamo=True,
            dynamic_shapes=({0: batch},),
            input_names=[input_name],
            output_names=["logits"],
            verbose=False,
        )
    program.save(str(out))
    return input_name


@contextlib.contextmanager
def _quiet():
    """torch.onnx prints its progress and warns of optional packages (torchvision's ops)."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        logger.setLevel(level)
