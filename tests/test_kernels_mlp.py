"""bias_gelu / swiglu Triton kernels (CPU interpreter) against torch."""

import pytest
import torch
import torch.nn.functional as F

import kernels
from kernels.testing import assert_matches

# fp32 elementwise math; the only reduction is dbias over rows (different
# order than ATen's sum): observed differences <= 2e-6.
TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(autouse=True)
def triton_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


# (70, 33): 18 row tiles of 4 over 3 persistent programs, columns with a tail;
# (1, 1) a single element; (2, 3, 37) leading dims flattened.
@pytest.mark.parametrize("shape", [(2, 3, 37), (1, 1), (70, 33), (5, 16)])
def test_bias_gelu_matches_torch(shape):
    torch.manual_seed(len(shape) * shape[-1])
    x = (torch.randn(*shape) * 3).requires_grad_()
    b = torch.randn(shape[-1], requires_grad=True)
    assert_matches(
        lambda x, b: kernels.bias_gelu(x, b, impl="triton"),
        lambda x, b: F.gelu(x + b),
        (x, b),
        **TOL,
        grad_fn_name="BiasGeluFunctionBackward",
    )


def test_bias_gelu_is_exact_erf_not_tanh():
    x = torch.linspace(-4, 4, 64).view(4, 16)
    b = torch.zeros(16)
    y = kernels.bias_gelu(x, b, impl="triton")
    torch.testing.assert_close(y, F.gelu(x), **TOL)
    assert (y - F.gelu(x, approximate="tanh")).abs().max() > 1e-4


def test_bias_gelu_promotes_like_add():
    x = torch.randn(3, 8, dtype=torch.float64)
    b = torch.randn(8, dtype=torch.float32)
    y = kernels.bias_gelu(x, b, impl="triton")
    assert y.dtype == torch.float64
    torch.testing.assert_close(y, F.gelu(x + b))


def test_bias_gelu_gradcheck_float64():
    torch.manual_seed(1)
    x = torch.randn(9, 20, dtype=torch.float64, requires_grad=True)
    b = torch.randn(20, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda x, b: kernels.bias_gelu(x, b, impl="triton"), (x, b), fast_mode=True
    )


@pytest.mark.parametrize("shape", [(3, 5, 37), (1,), (130,)])
def test_swiglu_matches_torch(shape):
    torch.manual_seed(shape[-1])
    a = (torch.randn(*shape) * 3).requires_grad_()
    b = torch.randn(*shape, requires_grad=True)
    assert_matches(
        lambda a, b: kernels.swiglu(a, b, impl="triton"),
        lambda a, b: F.silu(a) * b,
        (a, b),
        **TOL,
        grad_fn_name="SwiGLUFunctionBackward",
    )


def test_swiglu_gradcheck_float64():
    torch.manual_seed(2)
    a, b = (torch.randn(4, 33, dtype=torch.float64, requires_grad=True) for _ in range(2))
    assert torch.autograd.gradcheck(lambda a, b: kernels.swiglu(a, b, impl="triton"), (a, b), fast_mode=True)
