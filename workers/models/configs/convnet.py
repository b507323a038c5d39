"""The convnet family's configuration: its fields, presets and cross-field rules (no torch:
the CLI checks a spec with it)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Config:
    image_size: int = 32
    in_channels: int = 3
    num_classes: int = 10
    channels: list[int] = field(default_factory=lambda: [32, 64, 128])
    hidden: int = 256
    batch_norm: bool = False
    dropout: float = 0.0


PRESETS: dict[str, dict] = {
    "convnet_small": dict(channels=[16, 32, 64], hidden=128),
    "convnet": dict(channels=[32, 64, 128], hidden=256),
    "convnet_bn": dict(channels=[32, 64, 128], hidden=256, batch_norm=True),
}


def validate(cfg: Config) -> list[tuple[tuple[str, ...], str]]:
    if cfg.image_size < 2 ** len(cfg.channels):
        return [
            (
                ("image_size", "channels"),
                f"image_size {cfg.image_size} is too small for {len(cfg.channels)} 2x poolings;"
                f" needs >= {2 ** len(cfg.channels)}",
            )
        ]
    return []
