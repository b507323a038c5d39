"""Bottleneck ResNet (He et al. 2015; torchvision's v1.5 with the stride on the 3x3 conv),
optionally with squeeze-excitation (Hu et al. 2017) as in timm's seresnet.

`model.blocks` is the flat list of residual blocks; each block carries its own
stride and downsample path, so running them in order is the whole trunk.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .configs.resnet import EXPANSION, PRESETS, Config, validate  # noqa: F401  (the family's API)


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, ratio: float):
        super().__init__()
        hidden = max(1, int(channels * ratio))
        self.fc1 = nn.Conv2d(channels, hidden, 1)
        self.fc2 = nn.Conv2d(hidden, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.mean((2, 3), keepdim=True)
        return x * torch.sigmoid(self.fc2(torch.relu(self.fc1(s))))


class Bottleneck(nn.Module):
    def __init__(self, inplanes: int, width: int, stride: int, se_ratio: float | None):
        super().__init__()
        out = width * EXPANSION
        self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.se = SqueezeExcite(out, se_ratio) if se_ratio else nn.Identity()
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != out:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.se(self.bn3(self.conv3(y)))
        return self.relu(y + identity)


class ResNet(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.config = c = config
        small = c.small_stem if c.small_stem is not None else c.image_size <= 64
        if small:  # CIFAR-style: keep resolution, a 7x7/2 + pool would leave too few pixels
            self.stem = nn.Sequential(
                nn.Conv2d(c.in_channels, c.width, 3, padding=1, bias=False),
                nn.BatchNorm2d(c.width),
                nn.ReLU(inplace=True),
            )
        else:
            self.stem = nn.Sequential(
                nn.Conv2d(c.in_channels, c.width, 7, 2, 3, bias=False),
                nn.BatchNorm2d(c.width),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(3, 2, 1),
            )
        blocks, inplanes = [], c.width
        for stage, n in enumerate(c.layers):
            width = c.width * 2**stage
            for i in range(n):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(Bottleneck(inplanes, width, stride, c.se_ratio if c.se else None))
                inplanes = width * EXPANSION
        self.blocks = nn.ModuleList(blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.drop = nn.Dropout(c.dropout)
        self.fc = nn.Linear(inplanes, c.num_classes)
        self._init_weights()

    def _init_weights(self):
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        bound = 1 / self.fc.in_features**0.5  # nn.Linear's default
        nn.init.uniform_(self.fc.weight, -bound, bound)
        nn.init.uniform_(self.fc.bias, -bound, bound)
        if self.config.zero_init_residual:
            for block in self.blocks:
                nn.init.zeros_(block.bn3.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.fc(self.drop(torch.flatten(self.pool(x), 1)))


Model = ResNet
