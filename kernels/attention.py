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
    tl,
    triton,
)

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
    @triton.jit
    def attn_fwd_kernel(
        Q,
        K,
        V,
        OUT,
        LSE,
        s_qb,
        s_qh,
        s_qs,
        s_kb,
        s_kh,
        s_ks,
        s_vb,
        s_vh,
        s_vs,
        s_ob,
        s_oh,
        s_os,
        H,
        S_Q,
        S_K,
        qk_scale,
        HEAD_DIM: tl.constexpr,
        BLOCK_D: tl.constexpr,
        CAUSAL: tl.constexpr,
        PRECISION: tl.constexpr,
        ACC: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
    ):
        start_m = tl.program_id(0) * BLOCK_M
        bh = tl.program_id(1).to(tl.int64)
        b = bh // H
        h = bh % H
        rows = start_m + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < HEAD_DIM
        row_ok = rows < S_Q
        q = tl.load(
            Q + b * s_qb + h * s_qh + rows[:, None] * s_qs + offs_d[None, :],
            mask=row_ok[:, None] & d_ok[None, :],
            other=0.0,
        )
        k_base = K + b * s_kb + h * s_kh
        v_base = V + b * s_vb + h * s_vh

        m_i = tl.full((BLOCK_M,), float("-inf"), ACC)
        l_i = tl.zeros((BLOCK_M,), ACC)
        acc = tl.zeros((BLOCK_M, BLOCK_D), ACC)
        hi = S_K
        if CAUSAL:
            hi = tl.minimum(S_K, start_m + BLOCK_M)
        for start_n in range(0, hi, BLOCK_N):
            cols = start_n + offs_n
            col_ok = cols < S_K
            kt = tl.load(
                k_base + cols[None, :] * s_ks + offs_d[:, None],
                mask=col_ok[None, :] & d_ok[:, None],
                other=0.0,
            )
            s = tl.dot(q, kt, input_precision=PRECISION, out_dtype=ACC) * qk_scale
            # Only tiles on the sequence tail or the causal diagonal pay for the mask.
            needs_mask = start_n + BLOCK_N > S_K
            if CAUSAL:
                needs_mask = needs_mask | (start_n + BLOCK_N > start_m + 1)
            if needs_mask:
                valid = col_ok[None, :]
                if CAUSAL:
                    valid = valid & (cols[None, :] <= rows[:, None])
                s = tl.where(valid, s, float("-inf"))
            # Key 0 is visible to every row, so m_new is finite after tile 0.
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            p = tl.exp2(s - m_new[:, None])
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v = tl.load(
                v_base + cols[:, None] * s_vs + offs_d[None, :],
                mask=col_ok[:, None] & d_ok[None, :],
                other=0.0,
            )
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION, out_dtype=ACC)
            m_i = m_new
        acc = acc / l_i[:, None]
        tl.store(
            OUT + b * s_ob + h * s_oh + rows[:, None] * s_os + offs_d[None, :],
            acc.to(OUT.dtype.element_ty),
            mask=row_ok[:, None] & d_ok[None, :],
        )
        tl.store(LSE + bh * S_Q + rows, m_i + tl.log2(l_i), mask=row_ok)

    @triton.jit
    def attn_bwd_preprocess_kernel(
        OUT,
        DO,
        DELTA,
        s_ob,
        s_oh,
        s_os,
        s_db,
        s_dh,
        s_ds,
        H,
        S_Q,
        HEAD_DIM: tl.constexpr,
        BLOCK_D: tl.constexpr,
        ACC: tl.constexpr,
        BLOCK_M: tl.constexpr,
    ):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        bh = tl.program_id(1).to(tl.int64)
        b = bh // H
        h = bh % H
        offs_d = tl.arange(0, BLOCK_D)
        mask = (rows[:, None] < S_Q) & (offs_d[None, :] < HEAD_DIM)
        o = tl.load(
            OUT + b * s_ob + h * s_oh + rows[:, None] * s_os + offs_d[None, :], mask=mask, other=0.0
        ).to(ACC)
        do = tl.load(
            DO + b * s_db + h * s_dh + rows[:, None] * s_ds + offs_d[None, :], mask=mask, other=0.0
        ).to(ACC)
        tl.store(DELTA + bh * S_Q + rows, tl.sum(o * do, axis=1), mask=rows < S_Q)

    @triton.jit
    def attn_bwd_dkdv_kernel(
        Q,
        K,
        V,
        DO,
        LSE,
        DELTA,
        DK,
        DV,
        s_qb,
        s_qh,
        s_qs,
        s_kb,
        s_kh,
        s_ks,
        s_vb,
        s_vh,
        s_vs,
        s_db,
        s_dh,
        s_ds,
        s_kgb,
        s_kgh,
        s_kgs,
        s_vgb,
        s_vgh,
        s_vgs,
        H,
        S_Q,
        S_K,
        qk_scale,
        sm_scale,
        HEAD_DIM: tl.constexpr,
        BLOCK_D: tl.constexpr,
        CAUSAL: tl.constexpr,
        PRECISION: tl.constexpr,
        ACC: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
    ):
        start_n = tl.program_id(0) * BLOCK_N
        bh = tl.program_id(1).to(tl.int64)
        b = bh // H
        h = bh % H
        cols = start_n + tl.arange(0, BLOCK_N)
        offs_m = tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < HEAD_DIM
        col_ok = cols < S_K
        kv_mask = col_ok[:, None] & d_ok[None, :]
        k = tl.load(K + b * s_kb + h * s_kh + cols[:, None] * s_ks + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(V + b * s_vb + h * s_vh + cols[:, None] * s_vs + offs_d[None, :], mask=kv_mask, other=0.0)
        q_base = Q + b * s_qb + h * s_qh
        do_base = DO + b * s_db + h * s_dh
        dk = tl.zeros((BLOCK_N, BLOCK_D), ACC)
        dv = tl.zeros((BLOCK_N, BLOCK_D), ACC)
        lo = 0
        if CAUSAL:  # query rows above this tile's first key never see it
            lo = (start_n // BLOCK_M) * BLOCK_M
        for start_m in range(lo, S_Q, BLOCK_M):
            rows = start_m + offs_m
            row_ok = rows < S_Q
            qt = tl.load(
                q_base + rows[None, :] * s_qs + offs_d[:, None],
                mask=row_ok[None, :] & d_ok[:, None],
                other=0.0,
            )
            do = tl.load(
                do_base + rows[:, None] * s_ds + offs_d[None, :],
                mask=row_ok[:, None] & d_ok[None, :],
                other=0.0,
            )
            lse = tl.load(LSE + bh * S_Q + rows, mask=row_ok, other=0.0)
            delta = tl.load(DELTA + bh * S_Q + rows, mask=row_ok, other=0.0)
            # Transposed scores: P^T = exp2(K Q^T * scale - lse)
            pt = tl.exp2(tl.dot(k, qt, input_precision=PRECISION, out_dtype=ACC) * qk_scale - lse[None, :])
            needs_mask = (start_m + BLOCK_M > S_Q) | (start_n + BLOCK_N > S_K)
            if CAUSAL:
                needs_mask = needs_mask | (start_n + BLOCK_N > start_m + 1)
            if needs_mask:
                valid = row_ok[None, :] & col_ok[:, None]
                if CAUSAL:
                    valid = valid & (cols[:, None] <= rows[None, :])
                pt = tl.where(valid, pt, 0.0)
            dv += tl.dot(pt.to(do.dtype), do, input_precision=PRECISION, out_dtype=ACC)
            dpt = tl.dot(v, tl.trans(do), input_precision=PRECISION, out_dtype=ACC)
            dst = pt * (dpt - delta[None, :])
            dk += tl.dot(dst.to(qt.dtype), tl.trans(qt), input_precision=PRECISION, out_dtype=ACC)
        dk *= sm_scale
        tl.store(
            DK + b * s_kgb + h * s_kgh + cols[:, None] * s_kgs + offs_d[None, :],
            dk.to(DK.dtype.element_ty),
            mask=kv_mask,
        )
        tl.store(
            DV + b * s_vgb + h * s_vgh + cols[:, None] * s_vgs + offs_d[None, :],
            dv.to(DV.dtype.element_ty),
            mask=kv_mask,
        )

    @triton.jit
    def attn_bwd_dq_kernel(
        Q,
        K,
        V,
        DO,
        LSE,
        DELTA,
        DQ,
        s_qb,
        s_qh,
        s_qs,
        s_kb,
        s_kh,
        s_ks,
        s_vb,
        s_vh,
        s_vs,
        s_db,
        s_dh,
        s_ds,
        s_qgb,
        s_qgh,
        s_qgs,
        H,
        S_Q,
        S_K,
        qk_scale,
        sm_scale,
        HEAD_DIM: tl.constexpr,
        BLOCK_D: tl.constexpr,
        CAUSAL: tl.constexpr,
        PRECISION: tl.constexpr,
        ACC: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
    ):
        start_m = tl.program_id(0) * BLOCK_M
        bh = tl.program_id(1).to(tl.int64)
        b = bh // H
        h = bh % H
        rows = start_m + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < HEAD_DIM
        row_ok = rows < S_Q
        q_mask = row_ok[:, None] & d_ok[None, :]
        q = tl.load(Q + b * s_qb + h * s_qh + rows[:, None] * s_qs + offs_d[None, :], mask=q_mask, other=0.0)
        do = tl.load(
            DO + b * s_db + h * s_dh + rows[:, None] * s_ds + offs_d[None, :], mask=q_mask, other=0.0
        )
        lse = tl.load(LSE + bh * S_Q + rows, mask=row_ok, other=0.0)
        delta = tl.load(DELTA + bh * S_Q + rows, mask=row_ok, other=0.0)
        k_base = K + b * s_kb + h * s_kh
        v_base = V + b * s_vb + h * s_vh
        dq = tl.zeros((BLOCK_M, BLOCK_D), ACC)
        hi = S_K
        if CAUSAL:
            hi = tl.minimum(S_K, start_m + BLOCK_M)
        for start_n in range(0, hi, BLOCK_N):
            cols = start_n + offs_n
            col_ok = cols < S_K
            kt = tl.load(
                k_base + cols[None, :] * s_ks + offs_d[:, None],
                mask=col_ok[None, :] & d_ok[:, None],
                other=0.0,
            )
            vt = tl.load(
                v_base + cols[None, :] * s_vs + offs_d[:, None],
                mask=col_ok[None, :] & d_ok[:, None],
                other=0.0,
            )
            p = tl.exp2(tl.dot(q, kt, input_precision=PRECISION, out_dtype=ACC) * qk_scale - lse[:, None])
            needs_mask = start_n + BLOCK_N > S_K
            if CAUSAL:
                needs_mask = needs_mask | (start_n + BLOCK_N > start_m + 1)
            if needs_mask:
                valid = col_ok[None, :]
                if CAUSAL:
                    valid = valid & (cols[None, :] <= rows[:, None])
                p = tl.where(valid, p, 0.0)
            dp = tl.dot(do, vt, input_precision=PRECISION, out_dtype=ACC)
            ds = p * (dp - delta[:, None])
            dq += tl.dot(ds.to(kt.dtype), tl.trans(kt), input_precision=PRECISION, out_dtype=ACC)
        dq *= sm_scale
        tl.store(
            DQ + b * s_qgb + h * s_qgh + rows[:, None] * s_qgs + offs_d[None, :],
            dq.to(DQ.dtype.element_ty),
            mask=q_mask,
        )

    # Streamed tiles per loop iteration: K and V (forward, dq); Q and dO (dk/dv).
    fits = {"prune_configs_by": {"early_config_prune": _fits(2)}}
    return SimpleNamespace(
        fwd=maybe_autotune(attn_fwd_kernel, _configs(FWD_CONFIGS), _KEY, interpret, **fits),
        pre=maybe_autotune(
            attn_bwd_preprocess_kernel,
            [triton.Config({"BLOCK_M": bm}, num_warps=w) for bm, w in PRE_CONFIGS],
            ["S_Q", "HEAD_DIM"],
            interpret,
        ),
        dkdv=maybe_autotune(attn_bwd_dkdv_kernel, _configs(DKDV_CONFIGS), _KEY, interpret, **fits),
        dq=maybe_autotune(attn_bwd_dq_kernel, _configs(DQ_CONFIGS), _KEY, interpret, **fits),
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
