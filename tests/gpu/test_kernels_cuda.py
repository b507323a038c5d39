"""The Triton kernels on a CUDA GPU, in bf16 and fp32: forward and every gradient.

Each case runs three times on the same inputs: the Triton kernel and the built-in op in
the test dtype, and the built-in op in float64 on upcast inputs (the reference). The
Triton error against the reference must stay within twice the built-in op's own error
plus a small floor: in bf16 both round the same inputs, in fp32 both are near exact.
Shapes are the models' (ViT-B/16: 197 tokens, dim 768, MLP 3072; GPT-2 small: seq 1024,
vocab 50257) and awkward ones (tails, odd head dims, a single row, S_q != S_k).

    python -m pytest -m gpu tests/gpu          # on a machine with a CUDA GPU
KERNELS_AUTOTUNE=0 runs each kernel's default config (one compile per shape class).
"""

import sys

import pytest
import torch
import torch.nn.functional as F

import kernels

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
# error floor, relative to the reference's largest magnitude
FLOOR = {torch.bfloat16: 1e-2, torch.float32: 1e-5}


@pytest.fixture(autouse=True)
def exact_fp32(monkeypatch):
    # fp32 matmuls in full precision on both sides (TF32 would dominate the error)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def run(fn, inputs, grad_out=None):
    """Output and the gradients of every input that requires grad."""
    out = fn(*inputs)
    if grad_out is None:
        grad_out = torch.randn_like(out) if out.dim() else torch.ones_like(out)
    wrt = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    grads = torch.autograd.grad(out, wrt, grad_out.to(out.dtype))
    return [out, *grads], grad_out


def leaf(t, grad=True):
    return t.detach().clone().requires_grad_(grad)


def check(triton_fn, torch_fn, inputs, dtype):
    """Triton vs the float64 reference, within 2x the built-in op's error in `dtype`."""
    low = [leaf(t, t.requires_grad) if isinstance(t, torch.Tensor) else t for t in inputs]
    got, grad_out = run(triton_fn, low)
    builtin, _ = run(
        torch_fn, [leaf(t, t.requires_grad) if isinstance(t, torch.Tensor) else t for t in inputs], grad_out
    )
    ref, _ = run(
        torch_fn,
        [
            leaf(t.double() if t.is_floating_point() else t, t.requires_grad)
            if isinstance(t, torch.Tensor)
            else t
            for t in inputs
        ],
        grad_out.double(),
    )
    names = ["output"] + [f"grad {i}" for i in range(len(ref) - 1)]
    for name, g, b, r in zip(names, got, builtin, ref):
        assert g.shape == r.shape and g.dtype == b.dtype, (name, g.shape, g.dtype, b.dtype)
        assert torch.isfinite(g).all(), f"{name}: non-finite values"
        scale = r.abs().max().item() or 1.0
        err = (g.double() - r).abs().max().item()
        builtin_err = (b.double() - r).abs().max().item()
        assert err <= 2 * builtin_err + FLOOR[dtype] * scale, (
            f"{name}: triton error {err:.3g}, built-in {builtin_err:.3g}, scale {scale:.3g}"
        )
    return got


def randn(*shape, dtype, scale=1.0, grad=True):
    return (torch.randn(*shape, device="cuda", dtype=torch.float32) * scale).to(dtype).requires_grad_(grad)


# --- LayerNorm ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize(
    "rows,dim", [(64 * 197, 768), (8 * 1024, 768), (37, 1000), (3, 4096), (1, 8192), (129, 20), (2, 1)]
)
def test_layer_norm(rows, dim, dtype):
    torch.manual_seed(rows + dim)
    x = randn(rows, dim, dtype=dtype, scale=3.0)
    w, b = randn(dim, dtype=dtype), randn(dim, dtype=dtype)
    check(
        lambda x, w, b: kernels.layer_norm(x, w, b, 1e-5, impl="triton"),
        lambda x, w, b: F.layer_norm(x, (dim,), w, b, 1e-5),
        (x, w, b),
        dtype,
    )


# --- attention ------------------------------------------------------------------

ATTENTION_SHAPES = [  # (batch, heads, s_q, s_k, head_dim, causal)
    (4, 12, 197, 197, 64, False),  # ViT-B/16
    (2, 12, 1024, 1024, 64, True),  # GPT-2 small
    (1, 4, 2048, 2048, 128, True),
    (2, 3, 37, 37, 40, False),
    (2, 3, 37, 37, 40, True),  # tails, head dim not a power of 2
    (1, 2, 1, 1, 64, True),  # one query, one key
    (1, 2, 100, 100, 17, False),
    (1, 2, 40, 77, 64, True),
    (1, 2, 77, 40, 64, False),  # S_q != S_k
]


# fp32 at head dim 128 fits only the smallest tiles: bf16 covers that shape
ATTENTION_CASES = [
    pytest.param(*shape, dtype, id=f"{name}-{'-'.join(map(str, shape))}")
    for name, dtype in DTYPES.items()
    for shape in ATTENTION_SHAPES
    if not (dtype == torch.float32 and shape[4] == 128)
]


@pytest.mark.parametrize("b,h,s_q,s_k,d,causal,dtype", ATTENTION_CASES)
def test_attention(b, h, s_q, s_k, d, causal, dtype):
    torch.manual_seed(s_q * d)
    q, k, v = (
        randn(b, h, s_q, d, dtype=dtype),
        randn(b, h, s_k, d, dtype=dtype),
        randn(b, h, s_k, d, dtype=dtype),
    )
    check(
        lambda q, k, v: kernels.attention(q, k, v, causal, impl="triton"),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
        (q, k, v),
        dtype,
    )


def test_attention_on_strided_qkv_views():
    # How the models call it: q, k, v are permuted views of one fused qkv projection.
    torch.manual_seed(3)
    B, T, H, D = 2, 197, 12, 64
    qkv = randn(B, T, 3 * H * D, dtype=torch.bfloat16)

    def split(fn):
        def attend(qkv):
            q, k, v = qkv.view(B, T, 3, H, D).permute(2, 0, 3, 1, 4)
            return fn(q, k, v)

        return attend

    check(
        split(lambda q, k, v: kernels.attention(q, k, v, False, impl="triton")),
        split(lambda q, k, v: F.scaled_dot_product_attention(q, k, v)),
        (qkv,),
        torch.bfloat16,
    )


# --- cross-entropy ---------------------------------------------------------------

CE_SHAPES = [(4096, 50257, 0.0), (1024, 50257, 0.1), (256, 1000, 0.1), (7, 3, 0.0), (1, 50257, 0.0)]


def _targets(rows, vocab, ignore_every=5):
    t = torch.randint(0, vocab, (rows,), device="cuda")
    t[::ignore_every] = -100
    if rows == 1:
        t[0] = vocab - 1
    return t


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("rows,vocab,smoothing", CE_SHAPES)
@pytest.mark.parametrize("inplace", [False, True], ids=["recompute", "inplace"])
def test_cross_entropy(rows, vocab, smoothing, dtype, inplace):
    torch.manual_seed(rows)
    logits = randn(rows, vocab, dtype=dtype, scale=2.0)
    target = _targets(rows, vocab)

    def triton_ce(x, t):
        # the in-place variant overwrites its input: give it a copy it owns
        return kernels.cross_entropy(
            x * 1 if inplace else x, t, smoothing, impl="triton", inplace_backward=inplace
        )

    check(
        triton_ce, lambda x, t: kernels.cross_entropy(x, t, smoothing, impl="torch"), (logits, target), dtype
    )


@pytest.mark.parametrize("inplace", [False, True], ids=["recompute", "inplace"])
def test_cross_entropy_on_a_padded_vocabulary(inplace):
    # GPT-2's 50257 classes in a buffer padded to 50304 columns, as the training loop passes it
    torch.manual_seed(2)
    logits = randn(2048, 50304, dtype=torch.bfloat16, scale=2.0)
    target = _targets(2048, 50257)
    got = check(
        lambda x, t: kernels.cross_entropy(
            x * 1 if inplace else x, t, 0.1, impl="triton", inplace_backward=inplace, classes=50257
        ),
        lambda x, t: kernels.cross_entropy(x, t, 0.1, impl="torch", classes=50257),
        (logits, target),
        torch.bfloat16,
    )
    assert not got[1][:, 50257:].any()  # padding columns: no gradient


def test_cross_entropy_inplace_overwrites_only_its_input_and_allocates_no_logits():
    torch.manual_seed(0)
    rows, vocab = 8192, 50257
    base = randn(rows, vocab, dtype=torch.bfloat16, scale=2.0)
    target = _targets(rows, vocab)
    logits = base * 1  # a non-leaf the loss owns, as in the training loop
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    loss = kernels.cross_entropy(logits, target, impl="triton", inplace_backward=True)
    (grad,) = torch.autograd.grad(loss, base)
    torch.cuda.synchronize()
    logits_bytes = rows * vocab * 2
    # the gradient of `base` is the only (rows, vocab) tensor that may appear
    assert torch.cuda.max_memory_allocated() - before <= 1.05 * logits_bytes
    expected = torch.autograd.grad(kernels.cross_entropy(base, target, impl="torch"), base)[0]
    assert (grad.float() - expected.float()).abs().max().item() < 1e-3 * expected.abs().max().item() + 1e-6


def test_fused_linear_cross_entropy_gpt2_head():
    torch.manual_seed(1)
    rows, hidden, vocab = 2048, 768, 50257
    h = randn(rows, hidden, dtype=torch.bfloat16)
    w = randn(vocab, hidden, dtype=torch.bfloat16, scale=hidden**-0.5)
    target = _targets(rows, vocab)
    check(
        lambda h, w, t: kernels.fused_linear_cross_entropy(h, w, t, impl="triton"),
        lambda h, w, t: kernels.fused_linear_cross_entropy(h, w, t, impl="torch"),
        (h, w, target),
        torch.bfloat16,
    )


# --- bias + GELU ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("rows,dim", [(64 * 197, 3072), (8 * 1024, 3072), (37, 1000), (5, 8192), (1, 7)])
def test_bias_gelu(rows, dim, dtype):
    torch.manual_seed(rows + dim)
    x, b = randn(rows, dim, dtype=dtype, scale=2.0), randn(dim, dtype=dtype)
    check(lambda x, b: kernels.bias_gelu(x, b, impl="triton"), lambda x, b: F.gelu(x + b), (x, b), dtype)


# --- autotuned configs ---------------------------------------------------------


def test_every_attention_config_is_correct_at_the_gpt2_shape(monkeypatch):
    # The autotuner may pick any candidate: each one must compute the same function.
    attention = sys.modules["kernels.attention"]
    torch.manual_seed(5)
    q, k, v = (randn(2, 12, 1024, 64, dtype=torch.bfloat16) for _ in range(3))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    grad = torch.randn_like(ref)
    ref_grads = torch.autograd.grad(ref, (q, k, v), grad)
    names = {"FWD_CONFIGS": "fwd", "DKDV_CONFIGS": "dkdv", "DQ_CONFIGS": "dq"}
    for table, _ in names.items():
        for config in getattr(attention, table):
            # the config under test first: it is the one a fixed launch uses
            monkeypatch.setattr(attention, table, [config])
            monkeypatch.setenv("KERNELS_AUTOTUNE", "0")
            attention._triton_kernels.cache_clear()
            out = kernels.attention(q, k, v, True, impl="triton")
            grads = torch.autograd.grad(out, (q, k, v), grad)
            for got, want in zip((out, *grads), (ref, *ref_grads)):
                err = (got.float() - want.float()).abs().max().item()
                assert err <= 2e-2 * want.abs().max().item(), (table, config, err)
    attention._triton_kernels.cache_clear()
