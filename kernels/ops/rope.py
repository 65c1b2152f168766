"""Rotary position embedding on q and k, in place, in one launch (Hugging Face's rotate_half form).

For i < D/2, with x1 = x[i] and x2 = x[i + D/2]:
    y[i]       = x1 * cos[i]       - x2 * sin[i]
    y[i + D/2] = x2 * cos[i + D/2] + x1 * sin[i + D/2]
which is exactly q * cos + rotate_half(q) * sin. With partial rotary (Phi-4-mini's
partial_rotary_factor), cos/sin cover only the first R < D dims of a head: those are rotated with D
replaced by R and the rest is left as it is, as HF's apply_rotary_pos_emb does with q[..., :R]. Backward applies the transpose of that map to the
incoming gradients (rotation by -theta when both halves of cos/sin agree, as they do for HF's
rotary modules), also in place. The arithmetic is in float32 with one rounding to q's dtype, where
HF rounds each of its three bf16 operations; the two agree within bf16 rounding. With a rank-r term for q
or k (a LoRA term, left (tokens, r) @ right (r, heads * D)), the kernel adds it to the projection's output
first, rounded once to its dtype as the `addmm_` onto the projection would (an FP8 base's GEMM cannot add
it in its epilogue): one pass over q and k instead of two. The results keep
q's and k's dtypes (HF would promote to a wider cos/sin dtype; its rotary module returns cos/sin in
the activations' dtype, so this does not arise there).
"""
import torch
import triton
import triton.language as tl

from ._utils import dot_precision, has_internal_overlap, num_warps_for, plus_rank_r, rank_block


@triton.jit
def _rotate_heads(
    base, stride_h, stride_d, n_heads, d, d_mask, cos1, cos2, sin1, sin2,
    HALF, INVERSE: tl.constexpr, BLOCK_H: tl.constexpr,
):
    h = tl.arange(0, BLOCK_H)
    mask = (h < n_heads)[:, None] & d_mask[None, :]
    ptr1 = base + h[:, None] * stride_h + d[None, :] * stride_d
    ptr2 = ptr1 + HALF * stride_d
    x1 = tl.load(ptr1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptr2, mask=mask, other=0.0).to(tl.float32)
    if INVERSE:
        y1 = x1 * cos1 + x2 * sin2
        y2 = x2 * cos2 - x1 * sin1
    else:
        y1 = x1 * cos1 - x2 * sin1
        y2 = x2 * cos2 + x1 * sin2
    tl.store(ptr1, y1.to(base.dtype.element_ty), mask=mask)
    tl.store(ptr2, y2.to(base.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kernel(
    Q, K, COS, SIN,
    stride_qb, stride_qh, stride_qt, stride_qd,
    stride_kb, stride_kh, stride_kt, stride_kd,
    stride_cb, stride_ct, stride_cd,
    stride_sb, stride_st, stride_sd,
    seq_len, n_q_heads, n_k_heads, HALF,
    INVERSE: tl.constexpr,
    BLOCK_QH: tl.constexpr,
    BLOCK_KH: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # One program per (batch, position): cos/sin are loaded once and applied to every head of q and k.
    pid = tl.program_id(0).to(tl.int64)
    b = pid // seq_len
    t = pid % seq_len
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HALF

    cos_row = COS + b * stride_cb + t * stride_ct
    sin_row = SIN + b * stride_sb + t * stride_st
    cos1 = tl.load(cos_row + d * stride_cd, mask=d_mask, other=0.0).to(tl.float32)[None, :]
    cos2 = tl.load(cos_row + (d + HALF) * stride_cd, mask=d_mask, other=0.0).to(tl.float32)[None, :]
    sin1 = tl.load(sin_row + d * stride_sd, mask=d_mask, other=0.0).to(tl.float32)[None, :]
    sin2 = tl.load(sin_row + (d + HALF) * stride_sd, mask=d_mask, other=0.0).to(tl.float32)[None, :]

    _rotate_heads(Q + b * stride_qb + t * stride_qt, stride_qh, stride_qd, n_q_heads, d, d_mask,
                  cos1, cos2, sin1, sin2, HALF, INVERSE, BLOCK_QH)
    _rotate_heads(K + b * stride_kb + t * stride_kt, stride_kh, stride_kd, n_k_heads, d, d_mask,
                  cos1, cos2, sin1, sin2, HALF, INVERSE, BLOCK_KH)


@triton.jit
def _rope_rank_r_kernel(
    X, COS, SIN, LEFT, RIGHT,
    stride_xb, stride_xh, stride_xt, stride_xd,
    stride_cb, stride_ct, stride_cd,
    stride_sb, stride_st, stride_sd,
    n_tokens, seq_len, HALF, head_dim, rank, stride_left, stride_right_j, stride_right_col,
    HAS_TERM: tl.constexpr, R: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # One program per (BLOCK_T tokens, head) of X (B, H, T, D, any strides), fully rotary (2 * HALF == D): the
    # rank-r term's rows of the left factor are the tokens (b * T + t), its columns of the right one the head's.
    m = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    h = tl.program_id(1).to(tl.int64)
    m_mask = m < n_tokens
    b, t = m // seq_len, m % seq_len
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HALF
    mask = m_mask[:, None] & d_mask[None, :]
    ptr1 = X + b[:, None] * stride_xb + h * stride_xh + t[:, None] * stride_xt + d[None, :] * stride_xd
    ptr2 = ptr1 + HALF * stride_xd
    x1 = plus_rank_r(tl.load(ptr1, mask=mask, other=0.0).to(tl.float32), X, LEFT, RIGHT, m, h * head_dim + d, m_mask,
                     d_mask, rank, stride_left, stride_right_j, stride_right_col, HAS_TERM, R, DOT_PRECISION, UPCAST)
    x2 = plus_rank_r(tl.load(ptr2, mask=mask, other=0.0).to(tl.float32), X, LEFT, RIGHT, m, h * head_dim + HALF + d,
                     m_mask, d_mask, rank, stride_left, stride_right_j, stride_right_col, HAS_TERM, R, DOT_PRECISION,
                     UPCAST)
    cos_rows = COS + b[:, None] * stride_cb + t[:, None] * stride_ct
    sin_rows = SIN + b[:, None] * stride_sb + t[:, None] * stride_st
    cos1 = tl.load(cos_rows + d[None, :] * stride_cd, mask=mask, other=0.0).to(tl.float32)
    cos2 = tl.load(cos_rows + (d[None, :] + HALF) * stride_cd, mask=mask, other=0.0).to(tl.float32)
    sin1 = tl.load(sin_rows + d[None, :] * stride_sd, mask=mask, other=0.0).to(tl.float32)
    sin2 = tl.load(sin_rows + (d[None, :] + HALF) * stride_sd, mask=mask, other=0.0).to(tl.float32)
    tl.store(ptr1, (x1 * cos1 - x2 * sin1).to(X.dtype.element_ty), mask=mask)
    tl.store(ptr2, (x2 * cos2 + x1 * sin2).to(X.dtype.element_ty), mask=mask)


# Elements of one half-head tile a program of the rank-r kernel holds (32 tokens of a 128-wide head): its six
# float32 tiles stay in registers; tokens in multiples of 16 (the term's dot needs 16 rows at least).
_RANK_R_TILE = 2048


def _table_strides(table):
    """cos's or sin's (B or 1, T, R) strides; a broadcast batch of 1 is read with stride 0, so one kernel serves both
    layouts."""
    return (table.stride(0) if table.shape[0] > 1 else 0, table.stride(1), table.stride(2))


def _check_term(x, term, name):
    left, right = term
    bsz, heads, seq_len, head_dim = x.shape
    if (left.shape != (bsz * seq_len, left.shape[1]) or left.stride(1) != 1
            or right.shape != (left.shape[1], heads * head_dim)):
        raise ValueError(f"apply_rope: {name}'s rank-r term must be left ({bsz * seq_len}, r) with contiguous rows and "
                         f"right (r, {heads * head_dim}); got {tuple(left.shape)} and {tuple(right.shape)}")


def _rope_rank_r_launch(x, cos, sin, term):
    """Adds term (or nothing) to x and rotates it in place, by +theta (the forward only)."""
    bsz, heads, seq_len, head_dim = x.shape
    if bsz * seq_len == 0:
        return
    half = cos.shape[-1] // 2
    cos_strides, sin_strides = _table_strides(cos), _table_strides(sin)
    left, right = term if term is not None else (x, x)  # stand-ins for pointers never read
    rank = left.shape[1] if term is not None else 0
    block_d = max(16, triton.next_power_of_2(half))
    block_t = max(16, _RANK_R_TILE // block_d)
    _rope_rank_r_kernel[(triton.cdiv(bsz * seq_len, block_t), heads)](
        x, cos, sin, left, right,
        *x.stride(), *cos_strides, *sin_strides,
        bsz * seq_len, seq_len, half, head_dim, rank,
        left.stride(0) if term is not None else 0, right.stride(0) if term is not None else 0,
        right.stride(1) if term is not None else 0,
        HAS_TERM=term is not None, R=rank_block(max(rank, 1)), DOT_PRECISION=dot_precision(x.dtype),
        UPCAST=x.device.type != "cuda", BLOCK_T=block_t, BLOCK_D=block_d,
        num_warps=4,
    )


def _check_shapes(q, k, cos, sin):
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError("apply_rope: q and k must be (batch, heads, seq, head_dim)")
    bsz, _, seq_len, head_dim = q.shape
    if k.shape[0] != bsz or k.shape[2] != seq_len or k.shape[3] != head_dim:
        raise ValueError(f"apply_rope: k shape {tuple(k.shape)} does not match q shape {tuple(q.shape)}")
    if head_dim % 2:
        raise ValueError("apply_rope: head_dim must be even")
    if (cos.shape != sin.shape or cos.dim() != 3 or cos.shape[1] != seq_len or cos.shape[0] not in (1, bsz)
            or cos.shape[2] > head_dim or cos.shape[2] % 2):
        raise ValueError(f"apply_rope: cos/sin must be ({bsz} or 1, {seq_len}, an even rotary dim <= {head_dim}), "
                         f"got {tuple(cos.shape)}")


def _rope_launch(q, k, cos, sin, inverse):
    """Rotates q and k in place (any strides), by +theta or, with inverse, by -theta."""
    bsz, n_q_heads, seq_len, head_dim = q.shape
    n_k_heads = k.shape[1]
    half = cos.shape[-1] // 2  # the rotary dims; with partial rotary the rest of each head passes through
    cos_strides, sin_strides = _table_strides(cos), _table_strides(sin)
    block_d = triton.next_power_of_2(half)
    block_qh = triton.next_power_of_2(n_q_heads)
    block_kh = triton.next_power_of_2(n_k_heads)
    if bsz * seq_len == 0:
        return
    _rope_kernel[(bsz * seq_len,)](
        q, k, cos, sin,
        *q.stride(), *k.stride(), *cos_strides, *sin_strides,
        seq_len, n_q_heads, n_k_heads, half,
        INVERSE=inverse,
        BLOCK_QH=block_qh,
        BLOCK_KH=block_kh,
        BLOCK_D=block_d,
        num_warps=num_warps_for(max(block_qh, block_kh) * block_d * 2),
    )


def _writable(grad):
    # Incoming gradients are rotated in place; one whose elements alias (an expanded tensor) is copied first.
    return grad.contiguous() if has_internal_overlap(grad) else grad


class RoPEFunction(torch.autograd.Function):
    # Autograd cannot mark two modified views dirty in one Function (and q, k are usually views of
    # the projections' outputs), so the storage is rotated in place and the outputs are returned as
    # new autograd views of it, whose backward is the inverse rotation. The inputs' version counters
    # are bumped so that any other node that saved the unrotated q or k fails loudly in backward.
    @staticmethod
    def forward(ctx, q, k, cos, sin, terms):
        if terms == (None, None):
            _rope_launch(q, k, cos, sin, inverse=False)
        else:
            for x, term in zip((q, k), terms):
                _rope_rank_r_launch(x, cos, sin, term)
        for t in (q, k):
            if not t.is_inference():  # inference tensors have no version counter
                torch.autograd.graph.increment_version(t)
        ctx.save_for_backward(cos, sin)
        return q.view_as(q), k.view_as(k)

    @staticmethod
    def backward(ctx, dq, dk):
        cos, sin = ctx.saved_tensors
        dq, dk = _writable(dq), _writable(dk)
        if dk.untyped_storage().data_ptr() == dq.untyped_storage().data_ptr():
            dk = dk.clone()  # e.g. both outputs fed one add: rotating shared memory twice would be wrong
        _rope_launch(dq, dk, cos, sin, inverse=True)
        return dq, dk, None, None, None


def apply_rope(q, k, cos, sin, q_term=None, k_term=None):
    """Applies HF's rotary embedding to q (B, Hq, T, D) and k (B, Hk, T, D) in place; returns (q, k).

    q and k may be any strided views (e.g. (B, T, H, D) tensors transposed to (B, H, T, D)). Their
    memory is rotated in place (no new activation memory) and the returned tensors are views of it
    that carry the rotation's autograd node: use the returned tensors, not the old q and k, from
    then on (the old names hold rotated values, but autograd still sees them as unrotated). Like any
    in-place op, it refuses leaves that require grad. cos/sin are (B or 1, T, D) as HF's rotary
    module or rope_cos_sin return them, with R <= D
    (partial rotary: only the first R dims of each head rotate); no gradient flows to cos/sin. Backward rotates the incoming
    gradients in place, so they are overwritten (autograd-owned in normal training; a gradient
    passed to .backward() by hand is overwritten too).

    q_term, k_term: a rank-r term (left (B * T, r) with contiguous rows, right (r, heads * D)) added to q (k)
    before the rotation, as a constant: no gradient flows to it here (the LoRA function that deferred it
    takes dq as its output's gradient). Fully rotary heads only (R == D).
    """
    if cos.dim() == 2:
        cos, sin = cos.unsqueeze(0), sin.unsqueeze(0)
    _check_shapes(q, k, cos, sin)
    for x, term, name in ((q, q_term, "q"), (k, k_term, "k")):
        if term is not None:
            _check_term(x, term, name)
            if cos.shape[-1] != x.shape[-1]:
                raise ValueError("apply_rope: a rank-r term needs fully rotary heads (cos/sin as wide as head_dim)")
    if torch.is_grad_enabled() and any(t.is_leaf and t.requires_grad for t in (q, k)):
        raise RuntimeError("apply_rope rotates q and k in place: they cannot be leaves requiring grad")
    return RoPEFunction.apply(q, k, cos, sin, (q_term, k_term))


def rope_cos_sin(inv_freq, position_ids, attention_scaling=1.0, dtype=torch.float32):
    """cos, sin of shape (B, T, D) for position_ids (B, T), as HF's rotary embedding module builds them.

    Per-row position ids give per-sample positions in packed sequences (ids restart at each sample).
    Computed in float32 with autocast off, then cast to dtype (HF casts to the activations' dtype).
    """
    with torch.autocast(device_type=position_ids.device.type, enabled=False):
        freqs = position_ids[..., None].float() * inv_freq.to(device=position_ids.device, dtype=torch.float32)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * attention_scaling
        sin = emb.sin() * attention_scaling
    return cos.to(dtype), sin.to(dtype)
