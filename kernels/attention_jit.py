"""The Triton source of attention.py: its four `@triton.jit` kernels, the forward and the
backward's three (delta = rowsum(o * do), dk/dv, dq); the algorithm is in attention.py's
docstring and NOTES.md.

`jit_kernels()` decorates them when it is called: `attention._triton_kernels(interpret)`
calls it at the first launch, so TRITON_INTERPRET is read then (see _common.py), and wraps
them in attention.py's autotune configs.
"""

from types import SimpleNamespace

from ._common import tl, triton


def jit_kernels() -> SimpleNamespace:
    """The kernels, decorated now (call it at the first launch, never at import)."""

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

    return SimpleNamespace(
        fwd=attn_fwd_kernel, pre=attn_bwd_preprocess_kernel, dkdv=attn_bwd_dkdv_kernel, dq=attn_bwd_dq_kernel
    )
