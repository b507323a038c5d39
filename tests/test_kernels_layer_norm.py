"""LayerNorm Triton kernels (CPU interpreter) against F.layer_norm."""

import pytest
import torch
import torch.nn.functional as F

import kernels
from kernels.testing import assert_matches

# fp32 tolerance: the kernel reduces a row in a different order than ATen, so
# results differ by a few ulps of the row's magnitude (observed <= 2e-6).
TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(autouse=True)
def triton_interpreter(monkeypatch):
    # kernels decide interpreter vs GPU at first launch, so setting it per test
    # works whatever was imported before, and does not leak into other modules.
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _inputs(shape, dtype=torch.float32, affine=True):
    n = shape[-1]
    x = torch.randn(*shape, dtype=dtype).mul_(3).add_(1).requires_grad_()
    if not affine:
        return x, None, None
    return x, torch.randn(n, dtype=dtype, requires_grad=True), torch.randn(n, dtype=dtype, requires_grad=True)


@pytest.mark.parametrize("shape", [(5, 37), (2, 3, 64), (1, 7), (19, 100), (4, 129)])
def test_matches_torch(shape):
    torch.manual_seed(0)
    x, w, b = _inputs(shape)
    assert_matches(
        lambda x, w, b: kernels.layer_norm(x, w, b, impl="triton"),
        lambda x, w, b: F.layer_norm(x, (shape[-1],), w, b),
        (x, w, b),
        **TOL,
        grad_fn_name="LayerNormFunctionBackward",
    )


def test_eps_and_no_affine():
    torch.manual_seed(1)
    x, _, _ = _inputs((6, 33), affine=False)
    assert_matches(
        lambda x: kernels.layer_norm(x, None, None, eps=0.1, impl="triton"),
        lambda x: F.layer_norm(x, (33,), eps=0.1),
        (x,),
        **TOL,
    )


def test_non_contiguous_input():
    torch.manual_seed(2)
    base = torch.randn(24, 10, requires_grad=True)
    w, b = torch.randn(24, requires_grad=True), torch.randn(24, requires_grad=True)
    assert_matches(
        lambda t, w, b: kernels.layer_norm(t.t(), w, b, impl="triton"),
        lambda t, w, b: F.layer_norm(t.t(), (24,), w, b),
        (base, w, b),
        **TOL,
    )


def test_partial_sums_cover_every_row():
    # 17 rows over 3 interpreter programs: uneven slices (6, 6, 5) must all
    # land in dw/db.
    torch.manual_seed(3)
    x, w, b = _inputs((17, 20))
    y = kernels.layer_norm(x, w, b, impl="triton")
    dw, db = torch.autograd.grad(y.sum(), (w, b))
    xhat = F.layer_norm(x, (20,)).detach()
    torch.testing.assert_close(db, torch.full((20,), 17.0), **TOL)
    torch.testing.assert_close(dw, xhat.sum(0), **TOL)


def test_single_feature_rows_are_exact():
    # N=1: x - mean is exactly 0, so y == bias, dx == dw == 0, db == sum(dy).
    # (ATen's backward leaves a ~1e-4 rounding residue in dw here, amplified
    # by rstd = 1/sqrt(eps), so compare with the exact values instead.)
    torch.manual_seed(5)
    x, w, b = _inputs((3, 1))
    y = kernels.layer_norm(x, w, b, impl="triton")
    dy = torch.randn_like(y)
    dx, dw, db = torch.autograd.grad(y, (x, w, b), dy)
    torch.testing.assert_close(y, b.expand(3, 1), rtol=0, atol=0)
    assert not dx.any() and not dw.any()
    torch.testing.assert_close(db, dy.sum(0), **TOL)


def test_gradcheck_float64():
    torch.manual_seed(4)
    x, w, b = _inputs((5, 20), dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda *a: kernels.layer_norm(*a, impl="triton"), (x, w, b), fast_mode=True
    )


def test_rejects_rows_too_large_for_one_block():
    x = torch.randn(2, 20000)
    with pytest.raises(ValueError, match="rows up to"):
        kernels.layer_norm(x, torch.ones(20000), torch.zeros(20000), impl="triton")
