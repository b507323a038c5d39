"""Vision Transformer (Dosovitskiy et al. 2020), timm's ViT with pre-norm blocks.

Patches are cut with einops and embedded by one Linear, which has the same
parameters as timm's stride-p Conv2d patch embedding. `stem="conv"` embeds them with a few
stride-2 3x3 convolutions instead (Xiao et al. 2021, "Early convolutions help transformers
see better"): the same token grid, much faster training for a few percent more FLOPs.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from einops.layers.torch import Rearrange

from .configs.vit import PRESETS, Config, conv_steps, grid_size, validate  # noqa: F401  (the family's API)
from .layers import Block, LayerNorm


def conv_stem(c: Config) -> nn.Sequential:
    """Xiao et al.'s stem: stride-2 3x3 convolutions with BatchNorm and ReLU (channels doubling
    up to dim) down to the token grid, then a 1x1 projection; each token is one grid cell."""
    layers: list[nn.Module] = []
    channels, steps = c.in_channels, conv_steps(c)
    for i in range(steps):
        out = c.dim >> (steps - 1 - i)
        layers += [
            nn.Conv2d(channels, out, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(out),
            nn.ReLU(),
        ]
        channels = out
    layers += [nn.Conv2d(channels, c.dim, 1), Rearrange("b c h w -> b (h w) c")]
    return nn.Sequential(*layers)


class ViT(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.config = c = config
        p = c.patch_size
        num_patches = grid_size(c) ** 2
        if c.stem == "conv":
            self.patch_embed = conv_stem(c)
        else:
            self.patch_embed = nn.Sequential(
                Rearrange("b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=p, p2=p),
                nn.Linear(p * p * c.in_channels, c.dim),
            )
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.dim)) if c.pool == "cls" else None
        num_tokens = num_patches + (c.pool == "cls")
        self.pos_embed = nn.Parameter(torch.zeros(1, num_tokens, c.dim))
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(
            Block(
                c.dim,
                c.heads,
                int(c.dim * c.mlp_ratio),
                bias=c.qkv_bias,
                dropout=c.dropout,
                eps=1e-6,
                kernels=c.kernels,
            )
            for _ in range(c.depth)
        )
        self.norm = LayerNorm(c.dim, eps=1e-6, impl=c.kernels.get("layer_norm", "auto"))
        self.head = nn.Linear(c.dim, c.num_classes)
        self._init_weights()

    def _init_weights(self):
        # timm's scheme: trunc-normal(0.02) linears and position embedding, zero biases
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.trunc_normal_(self.cls_token, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.drop(x + self.pos_embed)
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        x = x[:, 0] if self.cls_token is not None else x.mean(dim=1)
        return self.head(x)


Model = ViT
