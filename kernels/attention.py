"""FlashAttention-2 style attention for (batch, heads, seq, head_dim) inputs.

Forward: one program per (BLOCK_M query rows, batch*head); it streams K/V in
BLOCK_N tiles with an online softmax in the exp2 domain and saves the
log-sum-exp (base 2) per row, so the backward recomputes P instead of storing
the seq x seq matrix.
Backward: delta = rowsum(o * do) (preprocess kernel), then one kernel that owns
a K/V tile and loops over query tiles (dk, dv) and one that owns a Q tile and
loops over K/V tiles (dq), so no atomics are needed.

Causal masking is top-left aligned (query i sees keys 0..i), the same as
F.scaled_dot_product_attention(is_causal=True).  Sequence tails and head dims
that are not powers of two are handled with masks; head_dim <= 128.

The four kernels' Triton source is in attention_jit.py; this file holds the rest, top to
bottom: reference, configs, jit factory, custom ops with their fakes, autograd function.
"""

import functools
import math
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import Tensor

from ._common import (
    NAMESPACE,
    acc_dtype,
    dot_precision,
    interpreting,
    launch,
    maybe_autotune,
    next_power_of_2,
    triton,
)
from .attention_jit import jit_kernels

LOG2E = 1.4426950408889634
MAX_HEAD_DIM = 128  # larger heads need smaller tiles than the autotune lists hold
MAX_GRID_Y = 65535  # batch * heads is the grid's second axis

# Under the interpreter: small, deliberately unequal tiles so that multi-tile
# loops, sequence tails and the causal diagonal are all exercised by small tests.
INTERPRET_META = {
    "fwd": {"BLOCK_M": 16, "BLOCK_N": 32},
    "pre": {"BLOCK_M": 16},
    "dkdv": {"BLOCK_M": 32, "BLOCK_N": 16},
    "dq": {"BLOCK_M": 16, "BLOCK_N": 32},
}


def attention_torch(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, scale=None) -> Tensor:
    """Reference path: the built-in SDPA (it picks flash/cuDNN/efficient/math)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


def _config(bm, bn, stages, warps):
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_stages=stages, num_warps=warps)


# Hopper candidates (BLOCK_M, BLOCK_N, stages, warps), after FA2 and Triton's
# fused-attention tutorial, pruned to the configs the autotuner chose on an H100
# (kernels/NOTES.md, "Autotuning"); the first config that fits is the default when
# autotuning is off, and the last, smallest one is what fp32 at head dim 128 fits.
# The forward holds a BLOCK_M query tile and streams BLOCK_N keys; dk/dv owns a
# BLOCK_N key tile and streams narrower query tiles; dq is its mirror image.
FWD_CONFIGS = [(128, 64, 4, 8), (64, 64, 4, 4), (64, 32, 3, 4), (64, 32, 2, 4)]
DKDV_CONFIGS = [(32, 64, 3, 4), (32, 128, 4, 4), (32, 128, 3, 4), (16, 64, 2, 4)]
DQ_CONFIGS = [(128, 64, 3, 8), (64, 64, 3, 4), (64, 32, 3, 4), (32, 32, 2, 4)]
PRE_CONFIGS = [(64, 4), (128, 8)]  # (BLOCK_M, warps) of the delta = rowsum(o * do) pass
SMEM_BUDGET = 160 * 1024  # estimated bytes; the H100 allows 227 KiB per block


def _fits(streamed_tiles: int):
    """Pruning for the autotuner: drop configs whose tiles would not fit in shared
    memory (roughly: the resident tile plus `stages` copies of each streamed tile)."""

    def prune(configs, nargs, **kwargs):
        elem = nargs["Q"].element_size()
        d = kwargs["BLOCK_D"]
        return [
            c
            for c in configs
            if elem
            * d
            * (
                max(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"])
                + c.num_stages * streamed_tiles * min(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"])
            )
            <= SMEM_BUDGET
        ]

    return prune


def _configs(table):
    return [_config(*c) for c in table]


_KEY = ["S_Q", "S_K", "HEAD_DIM", "CAUSAL"]


@functools.cache
def _triton_kernels(interpret: bool):
    jit = jit_kernels()  # decorated here, at the first launch (attention_jit.py)
    # Streamed tiles per loop iteration: K and V (forward, dq); Q and dO (dk/dv).
    fits = {"prune_configs_by": {"early_config_prune": _fits(2)}}
    return SimpleNamespace(
        fwd=maybe_autotune(jit.fwd, _configs(FWD_CONFIGS), _KEY, interpret, **fits),
        pre=maybe_autotune(
            jit.pre,
            [triton.Config({"BLOCK_M": bm}, num_warps=w) for bm, w in PRE_CONFIGS],
            ["S_Q", "HEAD_DIM"],
            interpret,
        ),
        dkdv=maybe_autotune(jit.dkdv, _configs(DKDV_CONFIGS), _KEY, interpret, **fits),
        dq=maybe_autotune(jit.dq, _configs(DQ_CONFIGS), _KEY, interpret, **fits),
    )


def _strides(t: Tensor):
    return t.stride(0), t.stride(1), t.stride(2)


def _statics(q: Tensor, causal: bool) -> dict:
    d = q.shape[-1]
    return dict(
        HEAD_DIM=d,
        BLOCK_D=max(16, next_power_of_2(d)),
        CAUSAL=causal,
        PRECISION=dot_precision(q.dtype),
        ACC=acc_dtype(q.dtype),
    )


def _lse_dtype(q: Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else torch.float32


# --- custom ops: opaque to torch.compile, shapes given by the fake kernels ---


@torch.library.custom_op(f"{NAMESPACE}::attention_fwd", mutates_args=())
def attention_fwd(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
    bsz, heads, s_q, _ = q.shape
    s_k = k.shape[2]
    o = q.new_empty(q.shape)
    lse = q.new_empty((bsz, heads, s_q), dtype=_lse_dtype(q))
    if o.numel() == 0:
        return o, lse
    kern = _triton_kernels(interpreting())
    grid = lambda meta: (triton.cdiv(s_q, meta["BLOCK_M"]), bsz * heads)  # noqa: E731
    launch(
        kern.fwd,
        grid,
        q,
        k,
        v,
        o,
        lse,
        *_strides(q),
        *_strides(k),
        *_strides(v),
        *_strides(o),
        heads,
        s_q,
        s_k,
        scale * LOG2E,
        interp_meta=INTERPRET_META["fwd"],
        **_statics(q, causal),
    )
    return o, lse


@attention_fwd.register_fake
def _(q, k, v, causal, scale):
    return q.new_empty(q.shape), q.new_empty(q.shape[:3], dtype=_lse_dtype(q))


@torch.library.custom_op(f"{NAMESPACE}::attention_bwd", mutates_args=())
def attention_bwd(
    do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, causal: bool, scale: float
) -> tuple[Tensor, Tensor, Tensor]:
    bsz, heads, s_q, _ = q.shape
    s_k = k.shape[2]
    dq, dk, dv = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
    if q.numel() == 0 or k.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    kern = _triton_kernels(interpreting())
    statics = _statics(q, causal)
    delta = torch.empty_like(lse)
    launch(
        kern.pre,
        lambda meta: (triton.cdiv(s_q, meta["BLOCK_M"]), bsz * heads),
        o,
        do,
        delta,
        *_strides(o),
        *_strides(do),
        heads,
        s_q,
        HEAD_DIM=statics["HEAD_DIM"],
        BLOCK_D=statics["BLOCK_D"],
        ACC=statics["ACC"],
        interp_meta=INTERPRET_META["pre"],
    )
    common = (*_strides(q), *_strides(k), *_strides(v), *_strides(do))
    launch(
        kern.dkdv,
        lambda meta: (triton.cdiv(s_k, meta["BLOCK_N"]), bsz * heads),
        q,
        k,
        v,
        do,
        lse,
        delta,
        dk,
        dv,
        *common,
        *_strides(dk),
        *_strides(dv),
        heads,
        s_q,
        s_k,
        scale * LOG2E,
        scale,
        interp_meta=INTERPRET_META["dkdv"],
        **statics,
    )
    launch(
        kern.dq,
        lambda meta: (triton.cdiv(s_q, meta["BLOCK_M"]), bsz * heads),
        q,
        k,
        v,
        do,
        lse,
        delta,
        dq,
        *common,
        *_strides(dq),
        heads,
        s_q,
        s_k,
        scale * LOG2E,
        scale,
        interp_meta=INTERPRET_META["dq"],
        **statics,
    )
    return dq, dk, dv


@attention_bwd.register_fake
def _(do, q, k, v, o, lse, causal, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _last_dim_contiguous(t: Tensor) -> Tensor:
    # Kernels take (batch, head, seq) strides but assume unit stride in head_dim.
    return t if t.stride(-1) == 1 else t.contiguous()


class AttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale):
        q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
        o, lse = attention_fwd(q, k, v, causal, scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale = causal, scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = attention_bwd(_last_dim_contiguous(do), q, k, v, o, lse, ctx.causal, ctx.scale)
        return dq, dk, dv, None, None


def attention_triton(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, scale=None) -> Tensor:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("kernels.attention: q, k, v must be (batch, heads, seq, head_dim)")
    if k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(
            f"kernels.attention: incompatible shapes q={tuple(q.shape)} k={tuple(k.shape)} v={tuple(v.shape)}"
        )
    if q.shape[-1] > MAX_HEAD_DIM:
        raise ValueError(f"kernels.attention: head_dim must be <= {MAX_HEAD_DIM}")
    if q.shape[0] * q.shape[1] > MAX_GRID_Y:
        raise ValueError(f"kernels.attention: batch * heads must be <= {MAX_GRID_Y}")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    return AttentionFunction.apply(q, k, v, bool(causal), float(scale))
