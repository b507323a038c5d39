"""Decoder-only transformer language model in the style of nanoGPT (GPT-2).

Token + learned position embeddings, pre-norm causal blocks, final LayerNorm,
and an lm_head that shares its weight with the token embedding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from .layers import Block, LayerNorm


@dataclass
class Config:
    vocab_size: int = 50257
    block_size: int = 1024
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    bias: bool = True
    dropout: float = 0.0
    # rows of the token embedding / lm_head rounded up to a multiple of this (llm.c and
    # nanoGPT pad GPT-2's 50257 to 50304): matmuls with an aligned width run faster; the
    # extra rows are never an input token, and their logits are sliced off before the loss
    vocab_multiple: int = 64
    kernels: dict[str, str] = field(default_factory=dict)


PRESETS: dict[str, dict] = {
    # byte-level presets for tests and character-level text
    "gpt_nano": dict(vocab_size=256, block_size=128, n_layer=3, n_head=3, n_embd=48),
    "gpt_micro": dict(vocab_size=256, block_size=256, n_layer=4, n_head=4, n_embd=128),
    "gpt_mini": dict(vocab_size=256, block_size=256, n_layer=6, n_head=6, n_embd=192),
    "gpt2_small": dict(n_layer=12, n_head=12, n_embd=768),
    "gpt2_medium": dict(n_layer=24, n_head=16, n_embd=1024),
}


def validate(cfg: Config) -> list[tuple[tuple[str, ...], str]]:
    if cfg.n_embd % cfg.n_head:
        return [(("n_head", "n_embd"), f"n_embd {cfg.n_embd} is not divisible by n_head {cfg.n_head}")]
    if cfg.vocab_multiple < 1:
        return [(("vocab_multiple",), f"must be >= 1, got {cfg.vocab_multiple}")]
    return []


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
