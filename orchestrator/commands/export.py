"""`orchestrator export CHECKPOINT --out FILE`: one unsharded model state dict for plain PyTorch.

Reads a checkpoint of any strategy and world size (single process, DDP, FSDP2 shards) and
writes the model weights, with the model's own parameter names, as `.safetensors` or `.pt`:

    model = build(...)  # the same family/preset/overrides as the job
    model.load_state_dict(safetensors.torch.load_file("model.safetensors"), strict=True)

or the model itself, graph and weights, as `.onnx` for ONNX Runtime (`workers/onnx_export.py`).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

FORMATS = (".safetensors", ".pt", ".onnx")


def register(sub) -> None:
    parser = sub.add_parser("export", help="write a checkpoint's model weights as one unsharded file")
    parser.add_argument(
        "checkpoint",
        metavar="CHECKPOINT",
        help="a checkpoint directory: local path or storage URI (s3://, gs://, ...)",
    )
    parser.add_argument(
        "--out",
        required=True,
        metavar="FILE",
        help="output file: .safetensors (safe to load anywhere), .pt (torch.save) or .onnx (the "
        "model for ONNX Runtime)",
    )
    parser.set_defaults(handler=handle)


def _trainer_state(directory: Path) -> dict:
    import torch

    trainer_file = directory / "trainer.pt"
    return torch.load(trainer_file, weights_only=True) if trainer_file.exists() else {}


def _model_info(trainer_state: dict) -> dict:
    """What trainer.pt says about the weights: step and the job's model section."""
    if not trainer_state:
        return {}
    info = {"step": str(trainer_state.get("step", ""))}
    if "model" in trainer_state:
        info["model"] = trainer_state["model"]  # JSON of the job's `model` section
    return info


def export(directory: Path, out: Path) -> tuple[int, int, dict]:
    """Write the weights (or, to .onnx, the model); returns (tensors, parameters, metadata)."""
    import torch

    from workers.checkpoint import read_model_state

    state = read_model_state(directory)
    trainer_state = _trainer_state(directory)
    metadata = _model_info(trainer_state)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".onnx":
        import workers.onnx_export as onnx_export

        metadata["input"] = onnx_export.export(trainer_state, state, out)
        metadata["fused"] = onnx_export.fused_ops(trainer_state)
    elif out.suffix == ".safetensors":
        from safetensors.torch import save_file

        # separate, contiguous tensors: safetensors refuses views of a shared storage
        save_file(
            {k: v.contiguous() for k, v in state.items()}, str(out), metadata={"format": "pt", **metadata}
        )
    else:
        torch.save(state, out)
    return len(state), sum(v.numel() for v in state.values()), metadata


def handle(args) -> int:
    from core import storage
    from orchestrator.errors import UsageError
    from workers.checkpoint import CheckpointError
    from workers.onnx_export import NotExportable

    out = Path(args.out)
    if out.suffix not in FORMATS:
        raise UsageError(f"--out {args.out}: the file name must end in {' or '.join(FORMATS)}")
    uri = args.checkpoint
    if not storage.exists(uri):
        raise UsageError(f"no checkpoint at '{uri}'")
    with tempfile.TemporaryDirectory(prefix="orchestrator-export-") as tmp:
        if storage.is_local(uri):
            directory = Path(storage.resolve(uri)[1])
        else:
            directory = Path(tmp) / "checkpoint"
            storage.download(uri, directory)
        try:
            tensors, params, metadata = export(directory, out)
        except (CheckpointError, NotExportable) as err:
            raise UsageError(f"{uri}: {err}" if isinstance(err, NotExportable) else str(err)) from None
    model = json.loads(metadata["model"]) if "model" in metadata else None
    what = f"{model['family']}/{model['preset']}" if model else "model"
    step = f" at step {metadata['step']}" if metadata.get("step") else ""
    print(f"wrote {out}: {what}{step}, {tensors} tensors, {params:,} parameters")
    if "input" in metadata:
        print(f"ONNX input '{metadata['input']}' (its first dimension, the batch, is free), output 'logits'")
    if metadata.get("fused"):
        fused = ", ".join(metadata["fused"])
        print(f"note: the run used fused kernels for {fused}; the ONNX graph has the built-in ops")
    return 0
