"""FlashAttention-2 style Triton kernels (CPU interpreter) against SDPA."""

import math
import sys

import pytest
import torch
import torch.nn.functional as F

import kernels
from kernels.testing import assert_matches

attention_mod = sys.modules["kernels.attention"]  # the module; kernels.attention is the function

# fp32: online softmax and tiled dot products sum in a different order than
# the math SDPA path; observed differences <= 2e-6 on O(1) values.
TOL = dict(rtol=1e-5, atol=2e-5)


@pytest.fixture(autouse=True)
def triton_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _qkv(b, h, s_q, s_k, d, dtype=torch.float32):
    return (
        torch.randn(b, h, s_q, d, dtype=dtype, requires_grad=True),
        torch.randn(b, h, s_k, d, dtype=dtype, requires_grad=True),
        torch.randn(b, h, s_k, d, dtype=dtype, requires_grad=True),
    )


def _check(q, k, v, causal, scale=None):
    assert_matches(
        lambda q, k, v: kernels.attention(q, k, v, causal, scale, impl="triton"),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale),
        (q, k, v),
        **TOL,
        grad_fn_name="AttentionFunctionBackward",
    )


# Interpreter tiles are 16/32 wide, so seq 37/50 leave masked tails and span
# several tiles; seq 1 is a single query and key.
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("b,h,s,d", [(1, 2, 37, 32), (2, 1, 50, 64), (1, 1, 33, 128), (2, 2, 1, 64)])
def test_matches_sdpa(b, h, s, d, causal):
    torch.manual_seed(s + d)
    _check(*_qkv(b, h, s, s, d), causal)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("s_q,s_k", [(40, 17), (9, 45)])
def test_different_query_and_key_lengths(s_q, s_k, causal):
    # Causal masking is top-left aligned, as in SDPA(is_causal=True).
    torch.manual_seed(s_q)
    _check(*_qkv(1, 2, s_q, s_k, 16), causal)


@pytest.mark.parametrize("d", [16, 24])
def test_small_and_non_power_of_two_head_dims(d):
    torch.manual_seed(d)
    _check(*_qkv(1, 1, 20, 20, d), causal=True)


def test_explicit_scale():
    torch.manual_seed(7)
    _check(*_qkv(1, 1, 19, 19, 32), causal=False, scale=0.3)


def test_non_contiguous_inputs():
    # (batch, seq, heads, dim) projections transposed to (batch, heads, seq, dim).
    torch.manual_seed(8)
    qkv = torch.randn(2, 21, 3, 2, 32, requires_grad=True)
    assert_matches(
        lambda t: kernels.attention(*t.permute(2, 0, 3, 1, 4).unbind(0), causal=True, impl="triton"),
        lambda t: F.scaled_dot_product_attention(*t.permute(2, 0, 3, 1, 4).unbind(0), is_causal=True),
        (qkv,),
        **TOL,
    )


def test_equal_tiles(monkeypatch):
    # The default interpreter tiles are deliberately unequal; cover BLOCK_M == BLOCK_N too.
    meta = {name: {k: 16 for k in blocks} for name, blocks in attention_mod.INTERPRET_META.items()}
    monkeypatch.setattr(attention_mod, "INTERPRET_META", meta)
    torch.manual_seed(9)
    _check(*_qkv(1, 1, 35, 35, 32), causal=True)


def test_default_scale_is_inverse_sqrt_head_dim():
    torch.manual_seed(10)
    q, k, v = (t.detach() for t in _qkv(1, 1, 8, 8, 64))
    out = kernels.attention(q, k, v, impl="triton")
    ref = F.scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(64))
    torch.testing.assert_close(out, ref, **TOL)
    assert not torch.allclose(out, F.scaled_dot_product_attention(q, k, v, scale=1.0), atol=1e-3)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gradcheck_float64(causal):
    torch.manual_seed(11)
    q, k, v = _qkv(1, 2, 19, 19, 16, dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda *a: kernels.attention(*a, causal=causal, impl="triton"), (q, k, v), fast_mode=True
    )


def test_rejects_bad_shapes():
    q = torch.randn(1, 2, 4, 16)
    with pytest.raises(ValueError, match="incompatible"):
        kernels.attention(q, torch.randn(1, 3, 4, 16), torch.randn(1, 3, 4, 16), impl="triton")
    with pytest.raises(ValueError, match="batch, heads, seq, head_dim"):
        kernels.attention(q[0], q[0], q[0], impl="triton")
