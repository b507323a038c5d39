"""The vit family's configuration: its fields, presets and cross-field rules (no torch:
the CLI checks a spec with it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class Config:
    image_size: int = 224
    in_channels: int = 3
    num_classes: int = 1000
    patch_size: int = 16
    stem: Literal["patch", "conv"] = "patch"
    dim: int = 768
    depth: int = 12
    heads: int = 12
    mlp_ratio: float = 4.0
    pool: Literal["cls", "mean"] = "cls"
    qkv_bias: bool = True
    dropout: float = 0.0
    kernels: dict[str, str] = field(default_factory=dict)


PRESETS: dict[str, dict] = {
    # 28x28 Fashion-MNIST on a CPU: 7x7 = 49 patches of 4x4
    "vit_micro": dict(
        image_size=28, in_channels=1, num_classes=10, patch_size=4, dim=128, depth=4, heads=4, mlp_ratio=2.0
    ),
    "vit_tiny": dict(dim=192, depth=12, heads=3),
    "vit_small": dict(dim=384, depth=12, heads=6),
    "vit_b16": dict(dim=768, depth=12, heads=12),  # ViT-Base, patch 16 (timm vit_base_patch16_224)
    "vit_large": dict(dim=1024, depth=24, heads=16),
    "vit_huge": dict(dim=1280, depth=32, heads=16, patch_size=14),
}


def conv_steps(cfg: Config) -> int:
    """How many stride-2 convolutions a conv stem has: log2 of the patch size."""
    return cfg.patch_size.bit_length() - 1


def grid_size(cfg: Config) -> int:
    """Tokens per side: image_size / patch_size (a conv stem pads, so it rounds up)."""
    if cfg.stem == "patch":
        return cfg.image_size // cfg.patch_size
    size = cfg.image_size
    for _ in range(conv_steps(cfg)):
        size = (size + 1) // 2
    return size


def validate(cfg: Config) -> list[tuple[tuple[str, ...], str]]:
    """Cross-field constraints: (fields involved, message)."""
    problems = []
    if cfg.stem == "conv":
        steps = conv_steps(cfg)
        if cfg.patch_size < 2 or cfg.patch_size != 1 << steps:
            problems.append(
                (("stem", "patch_size"), f"a conv stem needs a power-of-two patch_size, not {cfg.patch_size}")
            )
        elif cfg.dim % (1 << (steps - 1)):
            problems.append(
                (
                    ("stem", "dim"),
                    f"a conv stem with patch_size {cfg.patch_size} needs dim divisible by "
                    f"{cfg.patch_size // 2}",
                )
            )
    elif cfg.image_size % cfg.patch_size:
        problems.append(
            (
                ("image_size", "patch_size"),
                f"image_size {cfg.image_size} is not divisible by patch_size {cfg.patch_size}",
            )
        )
    if cfg.dim % cfg.heads:
        problems.append((("heads", "dim"), f"dim {cfg.dim} is not divisible by heads {cfg.heads}"))
    return problems
