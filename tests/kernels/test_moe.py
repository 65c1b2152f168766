"""Mixture-of-experts LoRA: the grouped GEMM, the experts function and the patched MoE families against
eager per-expert references (float64) and plain PEFT."""
import copy
import logging

import pytest
import torch
import torch.nn.functional as F
import transformers as tf
from peft import LoraConfig, get_peft_model

from lanner.kernels import moe
from lanner.kernels.moe import ExpertProjection, lora_moe_experts
from lanner.kernels.ops import _utils, grouped_lora, grouped_mm_lora
from lanner.kernels.ops.moe_combine import moe_combine, moe_weight_grad_
from lanner.kernels.patching import patch_model
from lanner.kernels.patching.moe import lora_experts, moe_experts_blocker
from lora_twins import assert_same_moe_step, lora_grads, max_relative_error, tiny_model, token_batches, twins
from test_convergence import assert_same_training

TOL = 2e-5  # float32 kernels against float64 references, relative to the largest element


@pytest.fixture(autouse=True)
def _small_tiles(monkeypatch):
    # Rows per tile: small, so that experts span several tiles and tiles end mid-tile at tiny sizes (the
    # rank-r accumulate's tiles, which may straddle experts, straddle some and sit inside others). The
    # rank is taken 16 at a time, so that a rank of 40 goes in chunks, as 1,024 does on a GPU at 64.
    monkeypatch.setattr(grouped_lora, "BLOCK_M", 16)
    monkeypatch.setattr(grouped_mm_lora, "ACCUMULATE_BLOCK_M", 16)
    monkeypatch.setattr(_utils, "RANK_CHUNK", 16)


@pytest.fixture
def grouped_mm_calls(monkeypatch):
    """Forces the torch._grouped_mm path wherever torch and the operands allow (the CPU included) and
    counts the real torch._grouped_mm's calls."""
    calls = []
    real = torch._grouped_mm
    assert grouped_mm_lora.grouped_mm_works("cpu")  # the one-time check, before counting

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(grouped_mm_lora, "ENABLED", True)
    monkeypatch.setattr(torch, "_grouped_mm", counted)
    return calls


def _grouped_mm_expected(dtype, device):
    """Where the forced path runs torch._grouped_mm: the CPU (bf16, float32); on CUDA only bf16 on sm90/sm100."""
    if device == "cpu":
        return True
    return dtype == torch.bfloat16 and torch.cuda.get_device_capability()[0] in (9, 10)


def _close(actual, expected, tol=TOL):
    atol = tol * expected.abs().max().item()
    torch.testing.assert_close(actual.double(), expected, rtol=tol, atol=atol)


def _peft_factors(num_experts, rank, out_features, in_features, device):
    """LoRA factors laid out as PEFT's ParamWrapper keeps them: A [E*r, in], B [out, r*E]."""
    A = torch.randn(num_experts * rank, in_features, device=device).requires_grad_()
    B = torch.randn(out_features, rank * num_experts, device=device).requires_grad_()
    return A, B


def _expert_views(A, B, num_experts):
    """The per-expert views the kernels read: A [E, r, in], B [E, out, r]."""
    rank = A.shape[0] // num_experts
    return A.view(num_experts, rank, A.shape[1]), B.view(B.shape[0], rank, num_experts).permute(2, 0, 1)


def _leaves64(*tensors):
    return [t.detach().double().requires_grad_() for t in tensors]


# counts per expert: an expert with no rows, one with all, tiles ending inside an expert.
# A rank of 40: past one tile's rank (16 here), so XA is a GEMM of its own and the rank goes in chunks.
@pytest.mark.parametrize("counts", [[0, 30, 3, 7], [0, 0, 0, 0, 40, 0, 0, 0], [17, 1, 16, 6]])
@pytest.mark.parametrize("adapted, r", [(True, 4), (True, 40), (False, 4)])
@pytest.mark.parametrize("path", ["triton", "grouped_mm"])
def test_grouped_lora_matches_per_expert_reference(counts, adapted, r, path, device, request):
    if path == "grouped_mm":
        calls = request.getfixturevalue("grouped_mm_calls")
    E, d_in, d_out, s = len(counts), 40, 48, 0.5
    rows = sum(counts)
    groups = grouped_lora.expert_groups(_sorted_experts(counts, device), E)
    x = torch.randn(rows, d_in, device=device, requires_grad=True)
    W = torch.randn(E, d_out, d_in, device=device)
    A, B = _peft_factors(E, r, d_out, d_in, device)
    lora = _expert_views(A, B, E) if adapted else (None, None)
    y = grouped_lora.grouped_lora(x, groups, W, *lora, s)
    dy = torch.randn_like(y)
    y.backward(dy)

    x64, A64, B64 = _leaves64(x, A, B)
    A64e, B64e = _expert_views(A64, B64, E)
    ends = torch.tensor(counts).cumsum(0).tolist()
    parts = []
    for e, (start, end) in enumerate(zip([0, *ends[:-1]], ends)):
        xe = x64[start:end]
        ye = xe @ W[e].double().t()
        parts.append(ye + s * (xe @ A64e[e].t()) @ B64e[e].t() if adapted else ye)
    ref = torch.cat(parts)
    ref.backward(dy.double())
    _close(y, ref.detach())
    _close(x.grad, x64.grad)
    if adapted:
        _close(A.grad, A64.grad)
        _close(B.grad, B64.grad)
    if path == "grouped_mm":  # forward and backward: W's GEMM, and X A^T or dY B when adapted
        assert len(calls) == (4 if adapted else 2) * _grouped_mm_expected(x.dtype, device)
    # The row tiles (about twenty small kernels) are made for the Triton kernels only.
    assert ("tiles" in vars(groups)) == (path == "triton" or not _grouped_mm_expected(x.dtype, device))


def _sorted_experts(counts, device):
    """Each sorted row's expert id, for rows sorted by expert with `counts` rows per expert."""
    return torch.repeat_interleave(torch.arange(len(counts), device=device), torch.tensor(counts, device=device))


# One rounding of an exact value to the output dtype: bf16 within one unit in the last place (the GPU
# rounds to nearest, Triton's CPU interpreter truncates), float32 within its accumulation error.
_ONE_ROUNDING = {torch.bfloat16: 2.0 ** -7, torch.float32: 1e-6}


def _assert_rounded_once(actual, expected, dtype):
    """actual (dtype) is the float64 `expected` rounded once, up to float32 accumulation (absolute floor)."""
    assert actual.dtype == dtype
    torch.testing.assert_close(actual.double(), expected, rtol=_ONE_ROUNDING[dtype],
                               atol=1e-6 * expected.abs().max().item())


# Tiles of 16 rows: one over four experts with an empty one inside (5, 0, 3, 9), one inside an expert;
# one expert with every row; 19 one-row experts; empty experts first and last.
@pytest.mark.parametrize("counts", [[5, 0, 3, 9, 20, 1, 2, 0], [0, 0, 37, 0], [1] * 19, [0, 3, 1, 1, 1, 0, 40, 2]])
@pytest.mark.parametrize("dtype, rank, width", [(torch.float32, 4, 4), (torch.bfloat16, 4, 8), (torch.bfloat16, 16, 16),
                                                (torch.float32, 40, 48)])
@pytest.mark.parametrize("layout", ["B", "A"])
def test_rank_accumulate_matches_per_expert_reference(counts, dtype, rank, width, layout, device):
    """out[m] += s * xr[m, :rank] @ F_e^T in place, one rounding, for rows sorted by expert: F as forward
    reads B [E, n, r] and as the input gradient reads A [E, r, n] (transposed strides). xr and F are
    `width` ranks wide, as the padded factors are; the ranks past `rank` must not count."""
    E, n, s = len(counts), 136, 0.5
    experts = _sorted_experts(counts, device)
    groups = grouped_lora.expert_groups(experts, E)
    out = torch.randn(experts.shape[0], n, device=device).to(dtype)
    xr = torch.randn(experts.shape[0], width, device=device).to(dtype)
    shape = (E, n, width) if layout == "B" else (E, width, n)
    factor = torch.randn(shape, device=device).to(dtype)
    factor = factor if layout == "B" else factor.transpose(1, 2)
    product = xr.double()[:, None, :rank] @ factor.double()[experts, :, :rank].transpose(1, 2)
    expected = out.double() + s * product.squeeze(1)
    grouped_mm_lora.rank_accumulate_(out, xr, factor, groups, rank, s)
    _assert_rounded_once(out, expected, dtype)


def _permutation(tokens, k, device):
    """(order, inverse): a random sorted-row order of the tokens * k assignments and its inverse (int32)."""
    order = torch.randperm(tokens * k, device=device)
    return order, torch.argsort(order).to(torch.int32)


# k = 1; several tokens per program (d = 37); d past one 1024-column block and not a multiple of it.
@pytest.mark.parametrize("tokens, k, d, dtype, weighted", [
    (7, 1, 37, torch.float32, True), (5, 8, 1030, torch.bfloat16, True),
    (6, 2, 1030, torch.float32, False), (9, 4, 20, torch.bfloat16, False),
])
def test_moe_combine_matches_reference(tokens, k, d, dtype, weighted, device):
    """out[t] = sum_j w[t, j] * rows[inverse[t * k + j]] against float64 (weights in the rows' dtype, as
    a bf16 model's router gives them); without weights, the plain per-token sum."""
    _, inverse = _permutation(tokens, k, device)
    rows = torch.randn(tokens * k, d, device=device).to(dtype)
    weights = torch.rand(tokens, k, device=device).to(dtype) if weighted else None
    gathered = rows.double()[inverse.long()].view(tokens, k, d)
    expected = (gathered * weights.double()[..., None]).sum(1) if weighted else gathered.sum(1)
    _assert_rounded_once(moe_combine(rows, inverse, k, weights), expected, dtype)
    _assert_rounded_once(moe_combine(rows, inverse, k, weights, torch.float32), expected, torch.float32)


def test_moe_combine_rounds_the_weighted_sum_once(device):
    """bf16 rows, float32 weights: (1 + 2^-10) * 1 - 1 * 1 is 2^-10, where rounding each product to
    bf16 before the sum (transformers' y * w) gives 0."""
    rows = torch.tensor([[1.0], [-1.0]], device=device, dtype=torch.bfloat16)
    weights = torch.tensor([[1 + 2 ** -10, 1.0]], device=device)
    out = moe_combine(rows, torch.tensor([0, 1], dtype=torch.int32, device=device), 2, weights)
    assert out.dtype == torch.bfloat16 and out.item() == 2 ** -10


# Several rows per program (n = 20); rows longer than one 1024-column block (n = 1030); k = 1.
@pytest.mark.parametrize("tokens, k, n, dtype", [
    (9, 2, 20, torch.float32), (5, 3, 1030, torch.bfloat16), (4, 1, 1030, torch.float32),
])
def test_moe_weight_grad_matches_reference(tokens, k, n, dtype, device):
    """d_w[order[i]] = <dh[i], h[i]> (float32 dot, in the weights' dtype) and dh[i] *= w[order[i]] in place."""
    order, _ = _permutation(tokens, k, device)
    dh, h = torch.randn(tokens * k, n, device=device).to(dtype), torch.randn(tokens * k, n, device=device).to(dtype)
    weights = torch.rand(tokens, k, device=device).to(dtype)
    expected_dw = torch.empty(tokens * k, dtype=torch.float64, device=device)
    expected_dw[order] = (dh.double() * h.double()).sum(-1)
    expected_dh = dh.double() * weights.double().view(-1)[order, None]
    d_weights = moe_weight_grad_(dh, h, order, weights)
    assert d_weights.shape == weights.shape
    _assert_rounded_once(d_weights, expected_dw.view(tokens, k), dtype)
    _assert_rounded_once(dh, expected_dh, dtype)


def _routing(tokens, num_experts, k, skew, device):
    """(top_k_index, top_k_weights) from softmax/top-k of random logits; skew "empty": expert 0 never
    chosen; "all": expert 0 is every token's first choice."""
    logits = torch.randn(tokens, num_experts, device=device)
    if skew == "empty":
        logits[:, 0] = -30.0
    elif skew == "all":
        logits[:, 0] = 30.0
    probs = torch.softmax(logits, dim=-1)
    weights, index = torch.topk(probs, k, dim=-1)
    return index, (weights / weights.sum(-1, keepdim=True)).detach().requires_grad_()


def _eager_experts(x, index, weights, gate_up, down, s, activation):
    """transformers' per-expert loop (Qwen3MoeExperts.forward), with LoRA added to each expert's weights."""
    act = {"silu": F.silu, "gelu_tanh": lambda g: F.gelu(g, approximate="tanh")}[activation]
    out = torch.zeros_like(x)
    for e in range(gate_up[0].shape[0]):
        tokens, slot = torch.where(index == e)
        gu = x[tokens] @ (gate_up[0][e] + s * gate_up[2][e] @ gate_up[1][e]).t()
        gate, up = gu.chunk(2, dim=-1)
        y = (act(gate) * up) @ (down[0][e] + s * down[2][e] @ down[1][e]).t()
        out = out.index_add(0, tokens, y * weights[tokens, slot, None])
    return out


@pytest.mark.parametrize("num_experts, k, skew, activation, dtype", [
    (4, 1, "empty", "silu", torch.float32), (4, 2, "all", "silu", torch.float32),
    (8, 2, "empty", "gelu_tanh", torch.float32), (8, 1, "all", "silu", torch.float32),
    (8, 2, "empty", "silu", torch.bfloat16),
])
def test_lora_moe_experts_matches_eager_reference(num_experts, k, skew, activation, dtype, device):
    """bfloat16: a bf16 model (input, routing weights and expert weights) with float32 LoRA factors, as
    PEFT keeps them; the reference is float64 throughout, so the bound is bf16 rounding (3e-2)."""
    T, d, inter, r, s = 24, 32, 20, 4, 2.0
    x = torch.randn(T, d, device=device).to(dtype).requires_grad_()
    index, weights = _routing(T, num_experts, k, skew, device)
    weights = weights.detach().to(dtype).requires_grad_()
    W_gu = (torch.randn(num_experts, 2 * inter, d, device=device) / d ** 0.5).to(dtype)
    W_down = (torch.randn(num_experts, d, inter, device=device) / inter ** 0.5).to(dtype)
    A_gu, B_gu = _peft_factors(num_experts, r, 2 * inter, d, device)
    A_down, B_down = _peft_factors(num_experts, r, d, inter, device)
    gate_up = ExpertProjection(W_gu, *_expert_views(A_gu, B_gu, num_experts), s)
    down = ExpertProjection(W_down, *_expert_views(A_down, B_down, num_experts), s)
    out = lora_moe_experts(x, index, weights, gate_up, down, activation)
    dout = torch.randn_like(out)
    out.backward(dout)

    leaves = (x, weights, A_gu, B_gu, A_down, B_down)
    x64, w64, A_gu64, B_gu64, A_down64, B_down64 = refs = _leaves64(*leaves)
    ref = _eager_experts(x64, index, w64, (W_gu.double(), *_expert_views(A_gu64, B_gu64, num_experts)),
                         (W_down.double(), *_expert_views(A_down64, B_down64, num_experts)), s, activation)
    ref.backward(dout.double())
    tol = TOL if dtype == torch.float32 else 3e-2
    assert out.dtype == dtype
    _close(out, ref.detach(), tol)
    for leaf, ref_leaf in zip(leaves, refs, strict=True):
        assert leaf.grad.dtype == leaf.dtype
        _close(leaf.grad, ref_leaf.grad, tol)


def _moe_case(num_experts, k, skew, dtype, device, d=32, inter=24, r=4, T=24):
    """Inputs and LoRA leaves of lora_moe_experts for a bf16 or float32 model (LoRA factors float32)."""
    x = torch.randn(T, d, device=device).to(dtype).requires_grad_()
    index, weights = _routing(T, num_experts, k, skew, device)
    weights = weights.detach().to(dtype).requires_grad_()
    W_gu = (torch.randn(num_experts, 2 * inter, d, device=device) / d ** 0.5).to(dtype)
    W_down = (torch.randn(num_experts, d, inter, device=device) / inter ** 0.5).to(dtype)
    factors = (*_peft_factors(num_experts, r, 2 * inter, d, device), *_peft_factors(num_experts, r, d, inter, device))
    return x, index, weights, W_gu, W_down, factors


def _run_moe(case, s=2.0, activation="silu"):
    """lora_moe_experts' output and the gradients of (x, routing weights, the four LoRA factors)."""
    x, index, weights, W_gu, W_down, factors = case
    leaves = [t.detach().clone().requires_grad_() for t in (x, weights, *factors)]
    E = W_gu.shape[0]
    gate_up = ExpertProjection(W_gu, *_expert_views(leaves[2], leaves[3], E), s)
    down = ExpertProjection(W_down, *_expert_views(leaves[4], leaves[5], E), s)
    out = lora_moe_experts(leaves[0], index, leaves[1], gate_up, down, activation)
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out))
    return out.detach(), [leaf.grad for leaf in leaves]


@pytest.mark.parametrize("num_experts, k, skew, dtype, rank", [
    (4, 1, "empty", torch.float32, 4), (8, 2, "all", torch.float32, 4),
    (8, 2, "empty", torch.bfloat16, 4), (16, 4, "all", torch.bfloat16, 16),
])
def test_grouped_mm_path_matches_triton_path(num_experts, k, skew, dtype, rank, grouped_mm_calls, device):
    """The torch._grouped_mm path against the Triton path on the same inputs (the Triton path is held to
    the eager reference above, both paths below): outputs, dx, routing-weight and LoRA-factor gradients.
    bf16 with rank 4 pads the factors to 8 ranks (16 bytes)."""
    case = _moe_case(num_experts, k, skew, dtype, device, r=rank)
    grouped_mm_lora.ENABLED = False
    triton_out, triton_grads = _run_moe(case)
    assert not grouped_mm_calls
    grouped_mm_lora.ENABLED = True
    out, grads = _run_moe(case)
    assert len(grouped_mm_calls) == 8 * _grouped_mm_expected(dtype, device)  # 2 per projection, fwd and bwd
    tol = TOL if dtype == torch.float32 else 3e-2
    _close(out, triton_out.double(), tol)
    for grad, triton_grad in zip(grads, triton_grads, strict=True):
        assert grad.dtype == triton_grad.dtype
        _close(grad, triton_grad.double(), tol)


def test_grouped_mm_factors_are_cast_once_and_padded_only_when_unaligned(grouped_mm_calls, monkeypatch, device):
    """r = 16 in bf16 (32 bytes) is cast, not padded, and a bf16 factor that already suits is used as it is;
    r = 4 (8 bytes) is padded with zero ranks to 8. An experts call casts each projection's factors once,
    in forward, and backward reuses them."""
    A, B = _expert_views(*_peft_factors(3, 16, 48, 32, device), 3)
    a, b = grouped_mm_lora.grouped_mm_factors(A, B, torch.bfloat16)
    assert a.shape == A.shape and b.shape == B.shape and b.is_contiguous()
    assert torch.equal(a, A.detach().bfloat16()) and torch.equal(b, B.detach().bfloat16())
    assert grouped_mm_lora.grouped_mm_factors(a, b, torch.bfloat16) == (a, b)
    a4, b4 = grouped_mm_lora.grouped_mm_factors(*_expert_views(*_peft_factors(3, 4, 48, 32, device), 3), torch.bfloat16)
    assert a4.shape == (3, 8, 32) and b4.shape == (3, 48, 8)
    assert not a4[:, 4:].any() and not b4[:, :, 4:].any()

    casts = []
    real = moe.grouped_mm_factors
    monkeypatch.setattr(moe, "grouped_mm_factors", lambda *args: casts.append(args) or real(*args))
    _run_moe(_moe_case(4, 2, "empty", torch.bfloat16, device, r=16))
    assert len(casts) == 2 * _grouped_mm_expected(torch.bfloat16, device)


@pytest.mark.parametrize("path", ["triton", "grouped_mm"])
def test_lora_moe_experts_grouped_mm_matches_eager_reference(path, grouped_mm_calls, device):
    """The eager float64 reference on both paths, bf16, skewed to one expert taking every token."""
    grouped_mm_lora.ENABLED = path == "grouped_mm"
    case = x, index, weights, W_gu, W_down, factors = _moe_case(8, 2, "all", torch.bfloat16, device)
    out, grads = _run_moe(case)
    assert bool(grouped_mm_calls) == (path == "grouped_mm" and _grouped_mm_expected(torch.bfloat16, device))
    x64, w64, *f64 = _leaves64(x, weights, *factors)
    ref = _eager_experts(x64, index, w64, (W_gu.double(), *_expert_views(f64[0], f64[1], 8)),
                         (W_down.double(), *_expert_views(f64[2], f64[3], 8)), 2.0, "silu")
    ref.backward(torch.randn(ref.shape, generator=torch.Generator().manual_seed(1)).to(out).double())
    _close(out, ref.detach(), 3e-2)
    for grad, ref_leaf in zip(grads, (x64, w64, *f64), strict=True):
        _close(grad, ref_leaf.grad, 3e-2)


def test_unaligned_or_unsupported_operands_fall_back_to_triton(grouped_mm_calls, device):
    """Feature dims that break torch._grouped_mm's 16-byte stride rule (36 bf16 = 72 bytes), float16 and
    float32 weights under a bf16 input run on the Triton kernels, with the eager reference's results."""
    unaligned = _moe_case(4, 2, "empty", torch.bfloat16, device, d=36)
    assert not grouped_mm_lora.use_grouped_mm(unaligned[0], unaligned[3], unaligned[4])
    out, _ = _run_moe(unaligned)
    assert not grouped_mm_calls and torch.isfinite(out).all()
    x, _, _, W_gu, W_down, _ = _moe_case(4, 2, "empty", torch.bfloat16, device)
    assert grouped_mm_lora.use_grouped_mm(x, W_gu, W_down) == _grouped_mm_expected(torch.bfloat16, device)
    assert not grouped_mm_lora.use_grouped_mm(x.half(), W_gu.half(), W_down.half())
    assert not grouped_mm_lora.use_grouped_mm(x, W_gu.float(), W_down)
    assert not grouped_mm_lora.use_grouped_mm(x, W_gu[:, :, 1:33], W_down)  # an unaligned data pointer


def test_a_grouped_mm_that_fails_its_check_leaves_the_experts_on_triton(monkeypatch, caplog):
    """A torch build whose grouped GEMM raises or miscomputes: the one-time check says no, in words."""
    check = grouped_mm_lora.grouped_mm_works.__wrapped__
    assert check("cpu")

    def refuses(*args, **kwargs):
        raise RuntimeError("grouped gemm is not supported here")

    with caplog.at_level(logging.WARNING, logger="lanner.kernels"):
        monkeypatch.setattr(torch, "_grouped_mm", refuses)
        assert not check("cpu")
        monkeypatch.setattr(torch, "_grouped_mm", lambda a, b, offs: a @ b[0])  # ignores the groups
        assert not check("cpu")
    assert "grouped gemm is not supported here" in caplog.text and "wrong results" in caplog.text


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "gpt_oss"])
def test_tiny_moe_model_matches_plain_peft(family, caplog, device):
    with caplog.at_level(logging.INFO, logger="lanner.kernels"):
        plain, fast = twins(family, device=device)
    assert "'attention': 2, 'moe_experts': 2" in caplog.text  # gpt-oss's too: its sinks on our attention path
    assert_same_moe_step(plain, fast, token_batches(1, 2, 8, plain.config.vocab_size, device=device)[0])


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_tiny_moe_model_trains_like_plain_peft(family, device):
    plain, fast = twins(family, device=device, gradient_checkpointing=True)
    # One batch three times (the interpreter is slow): the loss still falls by more than 0.05.
    batches = token_batches(1, 1, 6, plain.config.vocab_size, device=device) * 3
    assert_same_training(plain, fast, batches, lr=1e-2)


def _gpt_oss_experts(dtype, device, limit=1.0, trained_biases=False):
    """A PEFT-adapted GptOssExperts (transformers' module, its eager loop the reference) with random biases
    and its LoRA B nonzero; limit 1 clamps about a third of its gate_up values."""
    config = tf.GptOssConfig(hidden_size=32, intermediate_size=24, num_local_experts=8, num_experts_per_tok=2,
                             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                             swiglu_limit=limit)
    config._experts_implementation = "eager"
    torch.manual_seed(0)
    experts = tf.models.gpt_oss.modeling_gpt_oss.GptOssExperts(config)
    with torch.no_grad():
        for param in experts.parameters():
            param.normal_(std=0.3)

    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.experts = experts

    holder = get_peft_model(Holder(), LoraConfig(r=4, lora_alpha=8, target_parameters=[
        "experts.gate_up_proj", "experts.down_proj"])).to(device=device, dtype=dtype)
    with torch.no_grad():
        for name, param in holder.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn_like(param) * 0.1)
            if name.endswith("_bias"):
                param.requires_grad_(trained_biases)
    return holder.base_model.model.experts


# bf16 with a limit no value reaches: a value that bf16 rounding moves across the clamp changes its gradient
# by a whole term (the clamps are held to float32 here, and to float64 in test_glu.py).
@pytest.mark.parametrize("dtype, path, limit", [(torch.float32, "triton", 1.0), (torch.float32, "grouped_mm", 1.0),
                                                (torch.bfloat16, "grouped_mm", 100.0)])
def test_gpt_oss_experts_match_transformers(dtype, path, limit, grouped_mm_calls, device):
    """gpt-oss's experts (weights [E, in, out], gate/up interleaved, biases, clamped SwiGLU) on the grouped
    kernels against transformers' own eager loop with PEFT's LoRA, skewed to one expert taking every token:
    outputs and the gradients of the input, the routing weights and the LoRA factors."""
    grouped_mm_lora.ENABLED = path == "grouped_mm"
    module = _gpt_oss_experts(dtype, device, limit)
    assert moe_experts_blocker(module) is None
    index, weights = _routing(24, 8, 2, "all", device)
    x = torch.randn(24, 32, device=device).to(dtype)
    dout = torch.randn(24, 32, device=device).to(dtype)
    lora = [p for p in module.parameters() if p.requires_grad]

    def run(forward):
        leaves = [x.clone().requires_grad_(), weights.detach().to(dtype).requires_grad_()]
        for p in lora:
            p.grad = None
        out = forward(module, *leaves[:1], index, leaves[1])
        out.backward(dout)
        return out.detach(), [leaf.grad for leaf in leaves] + [p.grad.clone() for p in lora]

    expected, expected_grads = run(lambda m, h, i, w: m(h, i, w))
    out, grads = run(lora_experts)
    assert bool(grouped_mm_calls) == (path == "grouped_mm" and _grouped_mm_expected(dtype, device))
    tol = TOL if dtype == torch.float32 else 3e-2
    _close(out, expected.double(), tol)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        _close(grad, expected_grad.double(), tol)


def test_gpt_oss_experts_with_trained_biases_fall_back_in_words(device):
    module = _gpt_oss_experts(torch.float32, device, trained_biases=True)
    assert moe_experts_blocker(module) == "GptOssExperts has trained expert biases"


def test_unadapted_experts_stay_on_transformers_with_a_log_line(caplog, device):
    plain, _ = twins("qwen3_moe", device=device, target_modules=["q_proj", "v_proj"])
    with caplog.at_level(logging.INFO, logger="lanner.kernels"):
        report = patch_model(copy.deepcopy(plain))
    assert report.active and "moe_experts" not in report.patched
    assert "Qwen3MoeExperts is not LoRA-adapted" in caplog.text


def test_disabled_adapter_runs_the_base_experts(device):
    plain, fast = twins("qwen3_moe", device=device)
    ids = token_batches(1, 1, 8, plain.config.vocab_size, device=device)[0]
    fast.eval()
    plain.eval()
    with fast.disable_adapter(), plain.disable_adapter(), torch.no_grad():
        torch.testing.assert_close(fast(input_ids=ids).logits, plain(input_ids=ids).logits)


def test_mixtral_router_jitter_trains_like_plain_peft(device):
    """Mixtral's router jitter multiplies the normed hidden states in place in training: the patched RMSNorm's
    output must be one autograd allows to change in place (it was a view of the kernel's 2D buffer, which raised)."""
    plain, fast = twins("mixtral", device=device)
    for model in (plain, fast):
        for layer in model.get_base_model().model.layers:
            layer.mlp.jitter_noise = 0.1
    ids = token_batches(1, 2, 8, plain.config.vocab_size, device=device)[0]
    torch.manual_seed(3)  # the same jitter for both
    out_plain = plain(input_ids=ids, labels=ids)
    torch.manual_seed(3)
    out_fast = fast(input_ids=ids, labels=ids)
    torch.testing.assert_close(out_fast.loss, out_plain.loss, rtol=1e-5, atol=0)
    out_plain.loss.backward()
    out_fast.loss.backward()
    assert max_relative_error(lora_grads(fast), lora_grads(plain)) < 1e-4


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_the_stacked_weights_own_name_targets_it(family, device):
    """gate_up_proj, the stacked weight's name in transformers, adapts it (PEFT matched no module by that name: the
    experts' gate and up went unadapted without a word when another target matched)."""
    from lanner.kernels import get_lora_model

    for targets, adapted in ((["q_proj", "gate_up_proj", "down_proj"], 2), (["gate_up_proj"], 1)):
        model = get_lora_model(tiny_model(family, device=device), r=2, target_modules=targets)
        experts = model.get_base_model().model.layers[0].mlp.experts
        assert sum(1 for name, _ in experts.named_parameters() if "lora_A" in name) == adapted, targets
