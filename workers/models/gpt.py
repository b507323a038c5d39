"""Decoder-only transformer language model in the style of nanoGPT (GPT-2).

Token + learned position embeddings, pre-norm causal blocks, final LayerNorm,
and an lm_head that shares its weight with the token embedding.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from .configs.gpt import PRESETS, Config, validate  # noqa: F401  (the family's API)
from .layers import Block, LayerNorm


class GPT(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.config = c = config
        rows = -(-c.vocab_size // c.vocab_multiple) * c.vocab_multiple
        self.wte = nn.Embedding(rows, c.n_embd)
        self.wpe = nn.Embedding(c.block_size, c.n_embd)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(
            Block(
                c.n_embd,
                c.n_head,
                4 * c.n_embd,
                bias=c.bias,
                causal=True,
                dropout=c.dropout,
                kernels=c.kernels,
            )
            for _ in range(c.n_layer)
        )
        self.ln_f = LayerNorm(c.n_embd, bias=c.bias, impl=c.kernels.get("layer_norm", "auto"))
        self.lm_head = nn.Linear(c.n_embd, rows, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying
        self._init_weights()

    def _init_weights(self):
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, std=0.02)
        # GPT-2: scale the projections that write into the residual stream by 1/sqrt(2 * n_layer)
        std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for block in self.blocks:
            nn.init.trunc_normal_(block.attn.proj.weight, std=std)
            nn.init.trunc_normal_(block.mlp.fc2.weight, std=std)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        assert T <= self.config.block_size, f"sequence length {T} > block_size {self.config.block_size}"
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if logits.shape[-1] != self.config.vocab_size:  # padded rows: no class of the data
            logits = logits[..., : self.config.vocab_size]
        return logits


Model = GPT
