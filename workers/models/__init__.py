"""The model zoo: one module per family (convnet, resnet, vit, gpt).

Models are plain nn.Modules built from a dataclass `Config`; each exposes its
repeated blocks as `model.blocks` so parallelism, activation checkpointing and
compilation can be applied per block from outside.

    model = build(spec.model, data_info=datasets.info, kernels=spec.kernels.as_dict())

Looking up families and checking a spec against them (`check`, `presets`, `make_config`)
imports no torch: the CLI checks specs in a fraction of a second. The rest loads the
models (and torch) on first use.
"""

from .families import FAMILIES, check, make_config, presets

_BUILDING = ("build", "catalog", "count_flops", "example_input")


def __getattr__(name: str):
    if name in _BUILDING:
        from . import registry

        return getattr(registry, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["FAMILIES", "presets", "check", "make_config", *_BUILDING]
