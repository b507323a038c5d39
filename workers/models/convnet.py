"""The classic small CNN: (conv3x3 -> [BatchNorm] -> ReLU -> maxpool2) per stage, then an MLP head."""

from __future__ import annotations

import torch
import torch.nn as nn

from .configs.convnet import PRESETS, Config, validate  # noqa: F401  (the family's API)


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
