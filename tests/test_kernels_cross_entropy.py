"""Cross-entropy and fused linear cross-entropy Triton kernels (CPU
interpreter) against F.cross_entropy."""

import math

import pytest
import torch
import torch.nn.functional as F

import kernels
from kernels.testing import assert_matches

# fp32: per-row log-sum-exp in 16-wide interpreter chunks vs ATen's order;
# observed differences <= 2e-6 (loss) and <= 2e-7 (gradients of a mean).
TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(autouse=True)
def triton_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _targets(n, v, ignore_index=-100, every=3):
    t = torch.randint(0, v, (n,))
    t[::every] = ignore_index
    return t


def _check(logits, target, ls, ii=-100):
    assert_matches(
        lambda x: kernels.cross_entropy(x, target, label_smoothing=ls, ignore_index=ii, impl="triton"),
        lambda x: F.cross_entropy(
            x.reshape(-1, x.shape[-1]), target.reshape(-1), label_smoothing=ls, ignore_index=ii
        ),
        (logits,),
        **TOL,
        grad_fn_name="CrossEntropyFunctionBackward",
    )


@pytest.mark.parametrize("ls", [0.0, 0.1])
@pytest.mark.parametrize("n,v", [(9, 37), (4, 100), (7, 16), (2, 5), (3, 1)])
def test_matches_torch(n, v, ls):
    # V=37/100 span several 16-wide chunks with a masked tail; V=5 is one
    # partial chunk; V=1 is the degenerate single class.
    torch.manual_seed(n * v)
    _check((torch.randn(n, v) * 4).requires_grad_(), _targets(n, v), ls)


@pytest.mark.parametrize("ls", [0.0, 0.1])
def test_all_rows_ignored(ls):
    # Mean over zero rows: F.cross_entropy gives nan loss and zero gradients.
    torch.manual_seed(1)
    logits = torch.randn(5, 23, requires_grad=True)
    target = torch.full((5,), -100)
    out, (grad,) = assert_matches(
        lambda x: kernels.cross_entropy(x, target, ls, impl="triton"),
        lambda x: F.cross_entropy(x, target, label_smoothing=ls),
        (logits,),
        **TOL,
    )
    assert math.isnan(out.item()) and not grad.any()


def test_custom_ignore_index_that_is_a_class():
    torch.manual_seed(2)
    target = torch.tensor([3, 0, 3, 5, 1, 3])
    _check(torch.randn(6, 7, requires_grad=True), target, 0.1, ii=3)


def test_batch_time_vocab_input():
    torch.manual_seed(3)
    logits = torch.randn(2, 5, 29, requires_grad=True)
    _check(logits, _targets(10, 29).view(2, 5), 0.1)


def test_logits_are_not_modified():
    torch.manual_seed(4)
    logits = torch.randn(6, 40, requires_grad=True)
    before = logits.detach().clone()
    loss = kernels.cross_entropy(logits, _targets(6, 40), 0.1, impl="triton")
    loss.backward()
    assert torch.equal(logits.detach(), before)


def test_gradcheck_float64():
    torch.manual_seed(5)
    logits = torch.randn(6, 23, dtype=torch.float64, requires_grad=True)
    target = _targets(6, 23)
    assert torch.autograd.gradcheck(
        lambda x: kernels.cross_entropy(x, target, 0.1, impl="triton"), (logits,), fast_mode=True
    )


# --- fused linear + cross-entropy -------------------------------------------


def _flce_inputs(n, h, v, bias, dtype=torch.float32):
    hidden = torch.randn(n, h, dtype=dtype, requires_grad=True)
    weight = (torch.randn(v, h, dtype=dtype) / math.sqrt(h)).requires_grad_()
    b = torch.randn(v, dtype=dtype, requires_grad=True) if bias else None
    return hidden, weight, b


@pytest.mark.parametrize("chunk", [1, 7, 64])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("ls", [0.0, 0.1])
def test_fused_linear_matches_torch(ls, bias, chunk):
    # 20 rows in chunks of 1 / 7 (ragged last chunk) / 64 (a single chunk).
    torch.manual_seed(chunk)
    hidden, weight, b = _flce_inputs(20, 16, 37, bias)
    target = _targets(20, 37)
    inputs = (hidden, weight) + ((b,) if bias else ())

    def fused(h, w, *bb):
        return (
            kernels.fused_linear_cross_entropy(
                h, w, target, bb[0] if bb else None, ls, impl="triton", chunk_size=chunk
            )
            * 3.0
        )

    def ref(h, w, *bb):
        return F.cross_entropy(F.linear(h, w, bb[0] if bb else None), target, label_smoothing=ls) * 3.0

    assert_matches(fused, ref, inputs, **TOL)


def test_fused_linear_all_ignored_and_3d_hidden():
    torch.manual_seed(6)
    hidden, weight, b = _flce_inputs(6, 16, 11, bias=True)
    target = torch.full((2, 3), -100)
    out, grads = assert_matches(
        lambda h, w, b: kernels.fused_linear_cross_entropy(h.view(2, 3, 16), w, target, b, impl="triton"),
        lambda h, w, b: F.cross_entropy(F.linear(h, w, b), target.view(-1)),
        (hidden, weight, b),
        **TOL,
    )
    assert math.isnan(out.item()) and not any(g.any() for g in grads)


def test_fused_linear_gradcheck_float64():
    torch.manual_seed(7)
    hidden, weight, b = _flce_inputs(6, 16, 23, bias=True, dtype=torch.float64)
    target = _targets(6, 23)
    assert torch.autograd.gradcheck(
        lambda h, w, b: kernels.fused_linear_cross_entropy(h, w, target, b, 0.1, impl="triton", chunk_size=4),
        (hidden, weight, b),
        fast_mode=True,
    )


@pytest.mark.parametrize("inplace", [False, True], ids=["recompute", "inplace"])
def test_padding_columns_are_no_class_and_get_zero_gradient(inplace):
    # A vocabulary padded to a multiple of 64: the loss sees only the first `classes`
    # columns, and the padding columns' gradient is exactly zero.
    torch.manual_seed(11)
    base = torch.randn(9, 30, requires_grad=True)
    target = torch.tensor([0, 24, 3, -100, 7, 24, 1, 2, 11])
    logits = base * 1  # owned by the loss (the in-place variant writes into it)
    loss = kernels.cross_entropy(logits, target, 0.1, impl="triton", inplace_backward=inplace, classes=25)
    (grad,) = torch.autograd.grad(loss, base)
    ref = F.cross_entropy(base[:, :25], target, label_smoothing=0.1)
    (ref_grad,) = torch.autograd.grad(ref, base)
    torch.testing.assert_close(loss, ref, **TOL)
    torch.testing.assert_close(grad, ref_grad, **TOL)
    assert not grad[:, 25:].any()
    torch.testing.assert_close(kernels.cross_entropy(base, target, 0.1, impl="torch", classes=25), ref)


def test_training_loop_takes_the_loss_on_the_padded_buffer():
    from workers.loss import padded_logits

    buffer = torch.randn(2, 5, 64, requires_grad=True) * 1
    logits = buffer[..., :50]  # what a model with a padded vocabulary returns
    base, classes = padded_logits(logits)
    assert base is buffer and classes == 50
    plain = torch.randn(2, 5, 50)
    assert padded_logits(plain) == (plain, 50)
    assert padded_logits(buffer[:1])[0] is not buffer  # other views are left alone
