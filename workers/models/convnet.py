"""The classic small CNN: (conv3x3 -> [BatchNorm] -> ReLU -> maxpool2) per stage, then an MLP head."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn


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


class ConvNet(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.config = c = config
        stages, prev = [], c.in_channels
        for ch in c.channels:
            stages.append(
                nn.Sequential(
                    nn.Conv2d(prev, ch, 3, padding=1, bias=not c.batch_norm),  # BN has its own shift
                    nn.BatchNorm2d(ch) if c.batch_norm else nn.Identity(),
                    nn.ReLU(inplace=True),
                    nn.MaxPool2d(2),
                )
            )
            prev = ch
        self.blocks = nn.ModuleList(stages)
        side = c.image_size // 2 ** len(c.channels)
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Linear(prev * side * side, c.hidden),
            nn.ReLU(inplace=True),
            nn.Dropout(c.dropout),
            nn.Linear(c.hidden, c.num_classes),
        )
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        # the classifier feeds no ReLU: the ReLU gain would only inflate the initial loss
        classifier = self.head[-1]
        bound = 1 / classifier.in_features**0.5
        nn.init.uniform_(classifier.weight, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for stage in self.blocks:
            x = stage(x)
        return self.head(x)


Model = ConvNet
