from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from transformers.activations import ACT2FN
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

from lanner.kernels.ops import geglu, swiglu
from lanner.kernels.ops import glu as glu_module

# float32: float32 math, one rounding; bfloat16: the activation and the product are each rounded to
# bf16 (as HF does), so 1-2 bf16 units (2^-8 each), more where the interpreter truncates.
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}

# (name, kernel, HF activation name, float64 activation)
ACTIVATIONS = [
    ("swiglu", swiglu, "silu", F.silu),
    ("geglu", geglu, "gelu", lambda g: F.gelu(g)),
    ("geglu_tanh", lambda g, u: geglu(g, u, approximate="tanh"), "gelu_pytorch_tanh",
     lambda g: F.gelu(g, approximate="tanh")),
]
SHAPES = [(3, 5, 100), (1, 1, 352), (2, 4100), (7,)]


def _inputs(shape, dtype, device):
    # Scaled so that the activation's curved region and both tails are exercised.
    gate = (torch.randn(shape, device=device) * 3).to(dtype).requires_grad_()
    up = torch.randn(shape, device=device).to(dtype).requires_grad_()
    return gate, up


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("activation", ACTIVATIONS, ids=[a[0] for a in ACTIVATIONS])
def test_glu_matches_hf_and_fp64(dtype, shape, activation, device, assert_close_scaled):
    _, kernel, hf_name, act64 = activation
    gate_leaf, up_leaf = _inputs(shape, dtype, device)
    # Non-leaf copies: backward overwrites the saved gate and up with their gradients.
    gate, up = gate_leaf * 1, up_leaf * 1
    out = kernel(gate, up)
    dout = torch.randn_like(out)
    out.backward(dout)

    out_hf = ACT2FN[hf_name](gate_leaf.detach()) * up_leaf.detach()
    g64 = gate_leaf.detach().double().requires_grad_()
    u64 = up_leaf.detach().double().requires_grad_()
    out64 = act64(g64) * u64
    out64.backward(dout.double())

    tol = TOL[dtype]
    assert out.dtype == dtype and out.shape == shape
    torch.testing.assert_close(out, out_hf, rtol=tol, atol=tol)
    assert_close_scaled(out, out64, tol)
    assert_close_scaled(gate_leaf.grad, g64.grad, tol)
    assert_close_scaled(up_leaf.grad, u64.grad, tol)


@pytest.mark.parametrize("activation", ACTIVATIONS, ids=[a[0] for a in ACTIVATIONS])
def test_backward_writes_gradients_into_saved_gate_and_up(activation, device):
    _, kernel, _, act64 = activation
    gate_leaf, up_leaf = _inputs((4, 33), torch.float32, device)
    gate, up = gate_leaf * 1, up_leaf * 1
    gate_ptr, up_ptr = gate.data_ptr(), up.data_ptr()
    out = kernel(gate, up)
    dout = torch.randn_like(out)
    d_gate, d_up = torch.autograd.grad(out, (gate, up), dout)
    assert d_gate.data_ptr() == gate_ptr and d_up.data_ptr() == up_ptr
    g64 = gate_leaf.detach().double().requires_grad_()
    u64 = up_leaf.detach().double().requires_grad_()
    ref_g, ref_u = torch.autograd.grad(act64(g64) * u64, (g64, u64), dout.double())
    torch.testing.assert_close(d_gate.double(), ref_g, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(d_up.double(), ref_u, rtol=1e-5, atol=1e-5)


def test_fused_gate_up_chunks_are_used_without_copies(device):
    # Phi-3 style: gate and up are the two halves of one gate_up projection (non-contiguous views).
    leaf = (torch.randn(2, 3, 2 * 70, device=device) * 2).requires_grad_()
    fused = leaf * 1
    gate, up = fused.chunk(2, dim=-1)
    out = swiglu(gate, up)
    dout = torch.randn_like(out)
    d_gate, d_up = torch.autograd.grad(out, (gate, up), dout)
    assert d_gate.data_ptr() == gate.data_ptr() and d_up.data_ptr() == up.data_ptr()
    leaf64 = leaf.detach().double().requires_grad_()
    g64, u64 = leaf64.chunk(2, dim=-1)
    torch.testing.assert_close(out.double(), F.silu(g64) * u64, rtol=1e-5, atol=1e-5)
    ref_g, ref_u = torch.autograd.grad(F.silu(g64) * u64, (g64, u64), dout.double())
    torch.testing.assert_close(d_gate.double(), ref_g, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(d_up.double(), ref_u, rtol=1e-5, atol=1e-5)


def test_column_blocks_cover_wide_rows(monkeypatch, device):
    # Rows wider than one block are split over several programs along the columns.
    monkeypatch.setattr(glu_module, "_MAX_BLOCK", 64)
    gate, up = _inputs((3, 200), torch.float32, device)
    out = swiglu(gate * 1, up * 1)
    torch.testing.assert_close(out, F.silu(gate.detach()) * up.detach(), rtol=1e-5, atol=1e-5)


def test_geglu_rejects_unknown_approximation(device):
    gate, up = _inputs((2, 8), torch.float32, device)
    with pytest.raises(ValueError):
        geglu(gate, up, approximate="sigmoid")


@pytest.mark.parametrize("activation", ["silu", "gelu", "gelu_tanh"])
def test_backward_in_place_gives_the_output_and_gradients_in_the_callers_buffers(activation, device):
    # The LoRA MLP's backward: h over dh, d_gate over gate, d_up over up, nothing allocated.
    kernel = {"silu": swiglu, "gelu": geglu, "gelu_tanh": lambda g, u: geglu(g, u, approximate="tanh")}[activation]
    gate_leaf, up_leaf = _inputs((6, 130), torch.bfloat16, device)
    gate, up = gate_leaf * 1, up_leaf * 1
    out = kernel(gate, up)
    dout = torch.randn_like(out)
    ref_gate, ref_up = torch.autograd.grad(out, (gate, up), dout)

    dh, gate2, up2 = dout.clone(), (gate_leaf * 1).detach(), (up_leaf * 1).detach()
    pointers = [t.data_ptr() for t in (dh, gate2, up2)]
    h, d_gate, d_up = glu_module.glu_backward_in_place(dh, gate2, up2, activation)
    assert [t.data_ptr() for t in (h, d_gate, d_up)] == pointers
    torch.testing.assert_close(h, out.detach(), rtol=0, atol=0)
    torch.testing.assert_close(d_gate, ref_gate, rtol=0, atol=0)
    torch.testing.assert_close(d_up, ref_up, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_clamped_swiglu_on_interleaved_columns_matches_gpt_oss(dtype, device, assert_close_scaled):
    """gpt-oss's GLU (GptOssExperts._apply_gate, the reference, in float64) with gate and up the even and
    odd columns of one buffer, values on both sides of the clamps; autograd and the in-place backward,
    which writes d_gate and d_up back into those columns."""
    activation = glu_module.ClampedSwiGLU(alpha=1.702, limit=2.0)
    leaf = (torch.randn(5, 2 * 37, device=device) * 3).to(dtype).requires_grad_()
    gate_up = leaf * 1
    out = glu_module.glu(gate_up[:, ::2], gate_up[:, 1::2], activation)
    dout = torch.randn_like(out)
    out.backward(dout)
    leaf64 = leaf.detach().double().requires_grad_()
    ref = GptOssExperts._apply_gate(SimpleNamespace(alpha=activation.alpha, limit=activation.limit), leaf64)
    ref.backward(dout.double())
    assert (leaf64.grad == 0).any() and (leaf64.grad != 0).any()  # some values clamped, some not
    tol = TOL[dtype]
    assert_close_scaled(out, ref, tol)
    assert_close_scaled(leaf.grad, leaf64.grad, tol)

    dh, buffer = dout.clone(), leaf.detach().clone()
    glu_module.glu_backward_in_place(dh, buffer[:, ::2], buffer[:, 1::2], activation)
    assert_close_scaled(dh, ref, tol)
    assert_close_scaled(buffer, leaf64.grad, tol)


# (12: below a dot's 16; 80: the rank in two chunks, the second ragged), silu / gelu_tanh, float32 / bf16
@pytest.mark.parametrize("dtype, activation, rank", [(torch.float32, "silu", 12), (torch.bfloat16, "silu", 12),
                                                     (torch.bfloat16, "gelu_tanh", 12), (torch.float32, "gelu_tanh", 80)])
def test_rank_r_terms_inside_the_kernel_equal_addmm_then_glu(dtype, activation, rank, device, assert_close_scaled):
    # FP8's LoRA MLP: gate and up come without their rank-r terms (and the incoming gradient without the down
    # projection's); the kernel adds them, rounded once, as addmm_ onto each and then the plain kernels would.
    torch.manual_seed(0)
    rows, cols = 37, 300  # ragged tiles
    gate, up = (_inputs((rows, cols), dtype, device)[i].detach() for i in (0, 1))
    terms = [((torch.randn(rows, rank, device=device) / 4).to(dtype),
              (torch.randn(cols, rank, device=device) / 4).to(dtype).t()) for _ in range(3)]
    gate_term, up_term, dout_term = terms
    full_gate = gate.clone().addmm_(*gate_term)
    full_up = up.clone().addmm_(*up_term)
    expected = glu_module.glu(full_gate.clone(), full_up.clone(), activation)
    rtol = TOL[dtype]
    assert_close_scaled(glu_module.glu_rank_r(gate, up, activation, gate_term, up_term), expected, rtol)
    # only up's term (gate's already in gate)
    assert_close_scaled(glu_module.glu_rank_r(full_gate, up, activation, None, up_term), expected, rtol)

    dh = torch.randn(rows, cols, device=device).to(dtype)
    ref = [dh.clone().addmm_(*dout_term), full_gate.clone(), full_up.clone()]
    glu_module.glu_backward_in_place(*ref, activation)
    got = [dh.clone(), gate.clone(), up.clone()]
    glu_module.glu_backward_in_place(*got, activation, gate_term, up_term, dout_term)
    for g, r in zip(got, ref):  # h, d_gate, d_up
        assert_close_scaled(g, r, rtol)


def _tile_maxima(magnitude):
    # each row's largest magnitude in each column tile of the backward kernel's (the last one ragged)
    width = glu_module._RANK_R_TILES["backward"][1]
    parts = glu_module.glu_row_amax_parts(magnitude.shape[1])
    return F.pad(magnitude, (0, parts * width - magnitude.shape[1])).view(magnitude.shape[0], parts, width).amax(-1)


@pytest.mark.parametrize("with_terms", [True, False])
def test_the_backward_gives_the_row_maxima_of_the_gradients_it_writes_tile_by_tile(with_terms, device):
    # For FP8's quantiser of gate's and up's joined input gradient (quantize_joined_rows(row_amax=)): the maxima of
    # d_gate and d_up times gate's and up's column scales, as stored. The outputs are those without maxima.
    torch.manual_seed(1)
    rows, cols, rank = 37, 300, 8  # ragged tiles both ways
    gate, up = (_inputs((rows, cols), torch.bfloat16, device)[i].detach() for i in (0, 1))
    terms = [((torch.randn(rows, rank, device=device) / 4).bfloat16(),
              (torch.randn(cols, rank, device=device) / 4).bfloat16().t()) if with_terms else None for _ in range(3)]
    scales = [torch.rand(cols, device=device) + 0.5 for _ in range(2)]
    dh = torch.randn(rows, cols, device=device).bfloat16()
    plain = [dh.clone(), gate.clone(), up.clone()]
    glu_module.glu_backward_in_place(*plain, "silu", *terms)
    got = [dh.clone(), gate.clone(), up.clone()]
    amax = torch.full((rows + 3, glu_module.glu_row_amax_parts(cols)), -1.0, device=device)[3:]  # as a dh tile's
    glu_module.glu_backward_in_place(*got, "silu", *terms, row_amax=amax, column_scales=scales)
    for g, p in zip(got, plain):
        assert torch.equal(g, p)
    magnitude = torch.maximum(got[1].float().abs() * scales[0], got[2].float().abs() * scales[1])
    assert torch.equal(amax, _tile_maxima(magnitude))
    with pytest.raises(ValueError, match="column scales"):
        glu_module.glu_backward_in_place(*got, "silu", *terms, row_amax=amax)
