"""The resnet family's configuration: its fields, presets and cross-field rules (no torch:
the CLI checks a spec with it)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Config:
    image_size: int = 224
    in_channels: int = 3
    num_classes: int = 1000
    layers: list[int] = field(default_factory=lambda: [3, 4, 6, 3])  # blocks per stage
    width: int = 64  # stem channels; stage i's bottleneck width is width * 2**i
    se: bool = False
    se_ratio: float = 0.0625  # SE bottleneck = channels * ratio (1/16 as in SENet)
    small_stem: bool | None = None  # None: a 3x3/1 stem without maxpool when image_size <= 64
    zero_init_residual: bool = True  # last BN of each block starts at 0: blocks start as identity
    dropout: float = 0.0


PRESETS: dict[str, dict] = {
    "resnet_tiny": dict(layers=[1, 1, 1, 1], width=16, image_size=32, num_classes=10),
    "resnet26": dict(layers=[2, 2, 2, 2]),
    "resnet50": dict(layers=[3, 4, 6, 3]),
    "resnet101": dict(layers=[3, 4, 23, 3]),
    "seresnet50": dict(layers=[3, 4, 6, 3], se=True),
}

EXPANSION = 4


def validate(cfg: Config) -> list[tuple[tuple[str, ...], str]]:
    if not 0.0 < cfg.se_ratio <= 1.0:
        return [(("se_ratio",), f"must be in (0, 1], got {cfg.se_ratio}")]
    return []
