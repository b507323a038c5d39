"""The model zoo: one module per family (convnet, resnet, vit, gpt).

Models are plain nn.Modules built from a dataclass `Config`; each exposes its
repeated blocks as `model.blocks` so parallelism, activation checkpointing and
compilation can be applied per block from outside.

    model = build(spec.model, data_info=datasets.info, kernels=spec.kernels.as_dict())
"""

from .registry import FAMILIES, build, catalog, check, count_flops, example_input, make_config, presets

__all__ = ["FAMILIES", "presets", "check", "make_config", "build", "catalog", "count_flops", "example_input"]
