"""The gpt family's configuration: its fields, presets and cross-field rules (no torch:
the CLI checks a spec with it)."""

from __future__ import annotations

from dataclasses import dataclass, field


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
