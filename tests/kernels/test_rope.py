import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from lanner.kernels.ops import apply_rope, rope_cos_sin

# float32: the kernel and HF do the same float32 products (one fma-order difference at most);
# bfloat16: HF rounds each of its three bf16 ops, the kernel once (plus the interpreter's truncating cast).
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}

# (batch, q heads, k heads, seq, head_dim): GQA, odd head counts, T = 1, D = 64 and 128.
CONFIGS = [(2, 4, 2, 5, 64), (1, 3, 1, 1, 128), (2, 5, 5, 3, 64), (1, 7, 3, 4, 128)]


def _rotary(num_heads, head_dim, device, theta=10000.0):
    config = LlamaConfig(
        hidden_size=num_heads * head_dim, num_attention_heads=num_heads, head_dim=head_dim,
        max_position_embeddings=256, rope_theta=theta,
    )
    return LlamaRotaryEmbedding(config).to(device)


def _packed_position_ids(bsz, seq_len, device):
    """Per-row position ids that restart mid-row, as in packed samples; row b restarts at b + 1."""
    rows = []
    for b in range(bsz):
        cut = min(b + 1, seq_len - 1) if seq_len > 1 else 0
        rows.append(torch.cat([torch.arange(cut), torch.arange(seq_len - cut)]))
    return torch.stack(rows).to(device)


def _projection_outputs(bsz, n_heads, seq_len, head_dim, dtype, device):
    """A leaf x (B, T, H*D) and q = (x * 1).view(B, T, H, D).transpose(1, 2): a strided view, as in HF attention."""
    x = torch.randn(bsz, seq_len, n_heads * head_dim, device=device).to(dtype).requires_grad_()
    q = (x * 1).view(bsz, seq_len, n_heads, head_dim).transpose(1, 2)
    return x, q


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "B{}_Hq{}_Hk{}_T{}_D{}".format(*c))
@pytest.mark.parametrize("packed", [False, True], ids=["positions", "packed"])
def test_apply_rope_matches_hf(dtype, config, packed, device, assert_close_scaled):
    bsz, n_q, n_k, seq_len, head_dim = config
    if packed:
        position_ids = _packed_position_ids(bsz, seq_len, device)
    else:
        position_ids = torch.arange(seq_len, device=device)[None]  # batch 1, broadcast over B
    x_probe = torch.empty(1, device=device, dtype=dtype)
    cos, sin = _rotary(n_q, head_dim, device)(x_probe, position_ids)

    xq, q = _projection_outputs(bsz, n_q, seq_len, head_dim, dtype, device)
    xk, k = _projection_outputs(bsz, n_k, seq_len, head_dim, dtype, device)
    q_hf, k_hf = apply_rotary_pos_emb(q.detach().clone(), k.detach().clone(), cos, sin)
    xq64 = xq.detach().double().requires_grad_()
    xk64 = xk.detach().double().requires_grad_()
    q64, k64 = apply_rotary_pos_emb(
        xq64.view(bsz, seq_len, n_q, head_dim).transpose(1, 2),
        xk64.view(bsz, seq_len, n_k, head_dim).transpose(1, 2),
        cos.double(), sin.double(),
    )

    q_out, k_out = apply_rope(q, k, cos, sin)
    tol = TOL[dtype]
    assert q_out.dtype == dtype and q_out.shape == q_hf.shape and k_out.shape == k_hf.shape
    torch.testing.assert_close(q_out, q_hf, rtol=tol, atol=tol)
    torch.testing.assert_close(k_out, k_hf, rtol=tol, atol=tol)
    assert_close_scaled(q_out, q64, tol)
    assert_close_scaled(k_out, k64, tol)

    dq = torch.randn_like(q_out)
    dk = torch.randn_like(k_out)
    torch.autograd.backward((q_out, k_out), (dq.clone(), dk.clone()))
    torch.autograd.backward((q64, k64), (dq.double(), dk.double()))
    assert_close_scaled(xq.grad, xq64.grad, tol)
    assert_close_scaled(xk.grad, xk64.grad, tol)


def test_rope_cos_sin_matches_hf_rotary_module_with_packed_positions(device):
    bsz, seq_len, head_dim = 3, 9, 64
    rotary = _rotary(4, head_dim, device, theta=500000.0)
    position_ids = _packed_position_ids(bsz, seq_len, device)
    for dtype in (torch.float32, torch.bfloat16):
        cos_hf, sin_hf = rotary(torch.empty(1, device=device, dtype=dtype), position_ids)
        cos, sin = rope_cos_sin(rotary.inv_freq, position_ids, rotary.attention_scaling, dtype)
        assert cos.shape == (bsz, seq_len, head_dim) and cos.dtype == dtype
        torch.testing.assert_close(cos, cos_hf, rtol=0, atol=0)
        torch.testing.assert_close(sin, sin_hf, rtol=0, atol=0)


def test_packed_positions_equal_separate_samples(device):
    # A row holding two packed samples is rotated exactly as the two samples would be on their own.
    head_dim, n_heads = 64, 2
    rotary = _rotary(n_heads, head_dim, device)
    lengths = (5, 3)
    position_ids = torch.cat([torch.arange(n) for n in lengths])[None].to(device)
    cos, sin = rope_cos_sin(rotary.inv_freq, position_ids)
    q = torch.randn(1, n_heads, sum(lengths), head_dim, device=device)
    k = torch.randn(1, n_heads, sum(lengths), head_dim, device=device)
    q_ref, k_ref = q.clone(), k.clone()
    q_out, k_out = apply_rope(q, k, cos, sin)
    start = 0
    for n in lengths:
        cos_n, sin_n = rotary(q_ref, torch.arange(n, device=device)[None])
        q_n, k_n = apply_rotary_pos_emb(q_ref[:, :, start:start + n], k_ref[:, :, start:start + n], cos_n, sin_n)
        torch.testing.assert_close(q_out[:, :, start:start + n], q_n, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(k_out[:, :, start:start + n], k_n, rtol=1e-5, atol=1e-5)
        start += n


def test_attention_scaling_and_contiguous_layout(device):
    bsz, n_q, n_k, seq_len, head_dim = 2, 3, 1, 4, 64
    rotary = _rotary(n_q, head_dim, device)
    position_ids = torch.arange(seq_len, device=device)[None].expand(bsz, -1)
    cos, sin = rope_cos_sin(rotary.inv_freq, position_ids, attention_scaling=0.5)
    q = torch.randn(bsz, n_q, seq_len, head_dim, device=device)  # contiguous (B, H, T, D)
    k = torch.randn(bsz, n_k, seq_len, head_dim, device=device)
    q_hf, k_hf = apply_rotary_pos_emb(q, k, cos, sin)
    q_out, k_out = apply_rope(q.clone(), k.clone(), cos, sin)
    torch.testing.assert_close(q_out, q_hf, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k_out, k_hf, rtol=1e-5, atol=1e-5)


def test_rope_is_in_place_and_expanded_gradients_work(device):
    bsz, n_q, n_k, seq_len, head_dim = 1, 2, 2, 3, 64
    rotary = _rotary(n_q, head_dim, device)
    cos, sin = rotary(torch.empty(1, device=device), torch.arange(seq_len, device=device)[None])
    xq, q = _projection_outputs(bsz, n_q, seq_len, head_dim, torch.float32, device)
    xk, k = _projection_outputs(bsz, n_k, seq_len, head_dim, torch.float32, device)
    q_out, k_out = apply_rope(q, k, cos, sin)
    assert q_out.data_ptr() == q.data_ptr() and k_out.data_ptr() == k.data_ptr()
    # .sum() hands backward an expanded (stride 0) gradient, which cannot be rotated in place.
    (q_out.sum() + 2 * k_out.sum()).backward()
    xq64 = xq.detach().double().requires_grad_()
    xk64 = xk.detach().double().requires_grad_()
    q64, k64 = apply_rotary_pos_emb(
        xq64.view(bsz, seq_len, n_q, head_dim).transpose(1, 2),
        xk64.view(bsz, seq_len, n_k, head_dim).transpose(1, 2), cos.double(), sin.double(),
    )
    (q64.sum() + 2 * k64.sum()).backward()
    torch.testing.assert_close(xq.grad.double(), xq64.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xk.grad.double(), xk64.grad, rtol=1e-5, atol=1e-5)


def test_saved_unrotated_tensor_fails_loudly(device):
    # Another node that saved q before the in-place rotation must not silently see rotated values.
    _, q = _projection_outputs(1, 2, 3, 64, torch.float32, device)
    _, k = _projection_outputs(1, 1, 3, 64, torch.float32, device)
    cos, sin = rope_cos_sin(torch.rand(32, device=device), torch.arange(3, device=device)[None])
    uses_q = (q * q).sum()
    q_out, k_out = apply_rope(q, k, cos, sin)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        (uses_q + q_out.sum() + k_out.sum()).backward()


def test_q_and_k_gradients_sharing_memory(device):
    # (q_out + k_out) * g hands the same gradient tensor to q and k; each must be rotated once.
    bsz, n_heads, seq_len, head_dim = 1, 2, 3, 64
    cos, sin = rope_cos_sin(torch.rand(head_dim // 2, device=device), torch.arange(seq_len, device=device)[None])
    xq, q = _projection_outputs(bsz, n_heads, seq_len, head_dim, torch.float32, device)
    xk, k = _projection_outputs(bsz, n_heads, seq_len, head_dim, torch.float32, device)
    g = torch.randn(bsz, n_heads, seq_len, head_dim, device=device)
    q_out, k_out = apply_rope(q, k, cos, sin)
    ((q_out + k_out) * g).sum().backward()
    xq64 = xq.detach().double().requires_grad_()
    xk64 = xk.detach().double().requires_grad_()
    q64, k64 = apply_rotary_pos_emb(
        xq64.view(bsz, seq_len, n_heads, head_dim).transpose(1, 2),
        xk64.view(bsz, seq_len, n_heads, head_dim).transpose(1, 2), cos.double(), sin.double(),
    )
    ((q64 + k64) * g.double()).sum().backward()
    torch.testing.assert_close(xq.grad.double(), xq64.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xk.grad.double(), xk64.grad, rtol=1e-5, atol=1e-5)


def test_leaf_requiring_grad_is_refused(device):
    q = torch.randn(1, 2, 3, 64, device=device, requires_grad=True)
    k = torch.randn(1, 1, 3, 64, device=device)
    cos, sin = rope_cos_sin(torch.rand(32, device=device), torch.arange(3, device=device)[None])
    with pytest.raises(RuntimeError, match="in place"):
        apply_rope(q, k, cos, sin)


def test_partial_rotary_matches_phi3(device):
    """Phi-4-mini's partial rotary: cos/sin cover the first R < D dims; the rest of each head passes through."""
    from transformers.models.phi3.modeling_phi3 import apply_rotary_pos_emb as phi3_rope

    bsz, n_q, n_k, seq_len, head_dim, rotary_dim = 2, 4, 2, 5, 16, 12
    angles = torch.randn(1, seq_len, rotary_dim // 2, device=device).repeat(1, 1, 2)
    cos, sin = angles.cos(), angles.sin()
    xq, q = _projection_outputs(bsz, n_q, seq_len, head_dim, torch.float32, device)
    xk, k = _projection_outputs(bsz, n_k, seq_len, head_dim, torch.float32, device)
    q_ref, k_ref = phi3_rope(q.detach().clone().requires_grad_(), k.detach().clone().requires_grad_(), cos, sin)
    q_out, k_out = apply_rope(q, k, cos, sin)
    torch.testing.assert_close(q_out, q_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k_out, k_ref, rtol=1e-5, atol=1e-5)

    grad_q, grad_k = torch.randn_like(q_ref), torch.randn_like(k_ref)
    ref_q, ref_k = (torch.autograd.grad(t, x, g)[0] for t, x, g in (
        (phi3_rope(xq.view(bsz, seq_len, n_q, head_dim).transpose(1, 2), k.detach(), cos, sin)[0], xq, grad_q),
        (phi3_rope(q.detach(), xk.view(bsz, seq_len, n_k, head_dim).transpose(1, 2), cos, sin)[1], xk, grad_k)))
    got_q, got_k = torch.autograd.grad((q_out, k_out), (xq, xk), (grad_q.clone(), grad_k.clone()))
    torch.testing.assert_close(got_q, ref_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_k, ref_k, rtol=1e-5, atol=1e-5)


# (batch, q heads, k heads, seq, head_dim, rank): tokens past one program's (64 of a 64-wide head, 16 of a 256-wide
# one), a rank past RANK_CHUNK's 16 here, a head_dim not a power of two
@pytest.mark.parametrize("config", [(2, 4, 2, 40, 64, 8), (1, 3, 1, 37, 32, 20), (1, 2, 1, 20, 256, 4),
                                    (2, 2, 2, 9, 80, 16)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("terms", ["both", "q only"])
def test_rank_r_terms_are_added_before_the_rotation_as_an_addmm(config, dtype, terms, device, monkeypatch,
                                                                assert_close_scaled):
    """apply_rope with q's (and k's) rank-r term: the projection's output plus left @ right, rounded once to its
    dtype (an addmm_ onto it), then rotated; backward takes the gradient to the projection's output as without."""
    from lanner.kernels.ops import _utils

    monkeypatch.setattr(_utils, "RANK_CHUNK", 16)
    bsz, n_q, n_k, seq_len, head_dim, rank = config
    position_ids = _packed_position_ids(bsz, seq_len, device)
    cos, sin = _rotary(n_q, head_dim, device)(torch.empty(1, device=device, dtype=dtype), position_ids)
    g = torch.Generator().manual_seed(5)

    def term(heads):
        left = torch.randn(bsz * seq_len, rank, generator=g).to(device=device, dtype=dtype)
        right = (torch.randn(heads * head_dim, rank, generator=g) * 0.3).to(device=device, dtype=dtype).t()
        return left, right  # right: a transposed view, as B^T is

    q_term, k_term = term(n_q), (term(n_k) if terms == "both" else None)
    xq, q = _projection_outputs(bsz, n_q, seq_len, head_dim, dtype, device)
    xk, k = _projection_outputs(bsz, n_k, seq_len, head_dim, dtype, device)
    full = []
    for x, t in ((xq, q_term), (xk, k_term)):
        rows = x.detach().reshape(bsz * seq_len, -1)
        rows = rows.clone() if t is None else torch.addmm(rows, *t)  # one rounding, as the kernel
        full.append(rows.view(bsz, seq_len, -1, head_dim).transpose(1, 2).requires_grad_())
    q_ref, k_ref = apply_rotary_pos_emb(*full, cos, sin)

    q_out, k_out = apply_rope(q, k, cos, sin, q_term, k_term)
    # Scaled to the largest element: on the GPU cuBLAS's addmm may round an element's term the other way, and a
    # large element's one bf16 step, rotated onto its partner, is many steps of a small one.
    tol = TOL[dtype]
    assert_close_scaled(q_out, q_ref, tol)
    assert_close_scaled(k_out, k_ref, tol)
    dq, dk = torch.randn_like(q_out), torch.randn_like(k_out)
    torch.autograd.backward((q_out, k_out), (dq.clone(), dk.clone()))
    torch.autograd.backward((q_ref, k_ref), (dq, dk))
    assert_close_scaled(xq.grad, full[0].grad.transpose(1, 2).reshape(xq.shape), tol)
    assert_close_scaled(xk.grad, full[1].grad.transpose(1, 2).reshape(xk.shape), tol)


def test_a_rank_r_term_needs_fully_rotary_heads_and_its_shapes(device):
    q, k = torch.zeros(1, 2, 3, 16, device=device), torch.zeros(1, 1, 3, 16, device=device)
    cos = sin = torch.ones(1, 3, 16, device=device)
    with pytest.raises(ValueError, match="q's rank-r term"):
        apply_rope(q, k, cos, sin, q_term=(torch.zeros(3, 4, device=device), torch.zeros(4, 16, device=device)))
    with pytest.raises(ValueError, match="fully rotary"):
        apply_rope(q, k, cos[..., :8], sin[..., :8],
                   q_term=(torch.zeros(3, 4, device=device), torch.zeros(4, 32, device=device)))
