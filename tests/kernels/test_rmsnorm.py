import pytest
import torch
from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from lanner.kernels.ops import rms_norm

# float32: one rounding of a float32 computation; bfloat16: 1-2 units in the last place (2^-8 each;
# Triton's CPU interpreter truncates float32 -> bfloat16 casts where the GPU rounds to nearest).
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}

# (name, offset, cast_before_weight, HF module class)
FORMS = [("llama", 0.0, True, LlamaRMSNorm), ("gemma", 1.0, False, GemmaRMSNorm)]
# (3, 37, 64): per-head norms, many short rows in a program and over several programs, the last one partial
SHAPES = [(4, 576), (2, 3, 96), (1, 2304), (96,), (5, 1, 100), (3, 37, 64)]


def _reference_fp64(x, weight, eps, offset):
    xd = x.double()
    normed = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps)
    return normed * (offset + weight.double())


def _inputs(shape, dtype, device, weight_grad, weight_dtype=None):
    x = (torch.randn(shape, device=device) * 3 + 0.5).to(dtype).requires_grad_()
    weight = (torch.randn(shape[-1], device=device) * 0.5 + 1.0).to(weight_dtype or dtype).requires_grad_(weight_grad)
    return x, weight


def _hf_module(module_cls, weight, eps):
    module = module_cls(weight.shape[0], eps=eps).to(device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        module.weight.copy_(weight)
    module.weight.requires_grad_(weight.requires_grad)
    return module


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("form", FORMS, ids=[f[0] for f in FORMS])
@pytest.mark.parametrize("weight_grad", [True, False], ids=["weight_grad", "weight_frozen"])
def test_rms_norm_matches_hf_and_fp64(dtype, shape, form, weight_grad, device, assert_close_scaled):
    _, offset, cast_before_weight, module_cls = form
    eps = 1e-6
    x, weight = _inputs(shape, dtype, device, weight_grad)
    y = rms_norm(x, weight, eps, offset=offset, cast_before_weight=cast_before_weight)
    dy = torch.randn_like(y)
    y.backward(dy)

    x_hf = x.detach().clone().requires_grad_()
    hf = _hf_module(module_cls, weight.detach(), eps)
    hf.weight.requires_grad_(weight_grad)
    y_hf = hf(x_hf)
    y_hf.backward(dy)

    x64 = x.detach().double().requires_grad_()
    w64 = weight.detach().double().requires_grad_(weight_grad)
    y64 = _reference_fp64(x64, w64, eps, offset)
    y64.backward(dy.double())

    tol = TOL[dtype]
    assert y.dtype == y_hf.dtype and y.shape == x.shape
    torch.testing.assert_close(y, y_hf, rtol=tol, atol=tol)
    assert_close_scaled(y, y64, tol)
    assert_close_scaled(x.grad, x_hf.grad, tol)
    assert_close_scaled(x.grad, x64.grad, tol)
    if weight_grad:
        assert weight.grad.dtype == weight.dtype
        assert_close_scaled(weight.grad, hf.weight.grad, tol)
        assert_close_scaled(weight.grad, w64.grad, tol)
    else:
        assert weight.grad is None


def test_rms_norm_float32_weight_on_bf16_input_promotes_like_hf(device):
    # Llama with a float32 weight on bf16 activations: HF's weight * normed.to(bf16) is float32.
    x, weight = _inputs((3, 160), torch.bfloat16, device, True, weight_dtype=torch.float32)
    y = rms_norm(x, weight, 1e-5)
    hf = _hf_module(LlamaRMSNorm, weight.detach(), 1e-5)
    y_hf = hf(x.detach())
    assert y.dtype == torch.float32
    # The normalised value is rounded to bf16 before the float32 product, so a rounding flip (or the
    # interpreter's truncating bf16 cast) moves the result by one bf16 unit, 2^-8..2^-7 relative.
    torch.testing.assert_close(y, y_hf, rtol=1e-2, atol=1e-2)
    y.sum().backward()
    assert x.grad.dtype == torch.bfloat16 and weight.grad.dtype == torch.float32


def test_rms_norm_non_contiguous_input(device, assert_close_scaled):
    base = torch.randn(96, 6, device=device)
    x = base.t().requires_grad_()  # (6, 96), column stride 6
    weight = torch.randn(96, device=device)
    y = rms_norm(x, weight, 1e-6)
    dy = torch.randn_like(y)
    y.backward(dy)
    x64 = x.detach().double().requires_grad_()
    y64 = _reference_fp64(x64, weight, 1e-6, 0.0)
    y64.backward(dy.double())
    assert_close_scaled(y, y64, 1e-5)
    assert_close_scaled(x.grad, x64.grad, 1e-5)


def test_rms_norm_many_rows_for_weight_grad_partials(device, assert_close_scaled):
    # More rows than programs: each backward program loops over several rows for its dW partial.
    x, weight = _inputs((37, 48), torch.float32, device, True)
    y = rms_norm(x, weight, 1e-6)
    dy = torch.randn_like(y)
    y.backward(dy)
    w64 = weight.detach().double().requires_grad_()
    _reference_fp64(x.detach(), w64, 1e-6, 0.0).backward(dy.double())
    assert_close_scaled(weight.grad, w64.grad, 1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("used", ["both", "normed only", "passed only"])
def test_pass_input_adds_the_passed_views_gradient_into_the_inputs(dtype, used, device, assert_close_scaled):
    """rms_norm(..., pass_input=True) gives (y, a view of x); x's gradient is the norm's plus that view's (the
    residual stream's), added in the norm's backward pass: as autograd's sum of x's two uses."""
    x, weight = _inputs((3, 5, 96), dtype, device, weight_grad=True)
    y, passed = rms_norm(x, weight, 1e-6, pass_input=True)
    assert passed.data_ptr() == x.data_ptr() and torch.equal(y, rms_norm(x, weight, 1e-6))
    dy, dpassed = torch.randn_like(y), torch.randn_like(x)
    outputs = {"both": (y, passed), "normed only": (y,), "passed only": (passed,)}[used]
    grads = {"both": (dy, dpassed), "normed only": (dy,), "passed only": (dpassed,)}[used]
    got = torch.autograd.grad(outputs, (x, weight) if used != "passed only" else (x,), grads)
    x_ref = x.detach().requires_grad_()
    y_ref = rms_norm(x_ref, weight, 1e-6)
    ref_outputs = {"both": (y_ref, x_ref * 1), "normed only": (y_ref,), "passed only": (x_ref * 1,)}[used]
    expected = torch.autograd.grad(ref_outputs, (x_ref, weight) if used != "passed only" else (x_ref,), grads)
    for g, e in zip(got, expected):
        assert_close_scaled(g, e, TOL[dtype])
