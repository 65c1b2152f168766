"""Our Triton flash attention: causal, with an optional tanh soft-cap, sliding window and attention sinks.

    out = flash_attention(q, k, v, scale, window=None, softcap=None, sinks=None, segments=None)  # (B, Hq, T, D)

The masks and the soft-cap are those of core's module docstring (key j visible from query i when j <= i
and i - j < window, and, with packed samples, j in i's sample; s = softcap * tanh(scale * q.k / softcap) before
the softmax); no padding. Packed samples are contiguous runs of equal ids in `segments` (B, T): each row's
sample start (and each key's sample end) bound the key (query) blocks visited, so a sample's cost is its own
causal square. q is (B, Hq, T, D), k and v (B, Hk, T, D) with Hq a multiple of Hk: query head h reads kv head
h // (Hq // Hk), and k and v are never expanded. D a power of two from 16 to 256; any T; bf16, fp16 or
float32 (float32 products in IEEE float32, not TF32). Written for Gemma 2 (D 256, soft-cap 50, a window
on alternate layers), where FlexAttention's tiles measured 16.9 ms for a global layer that causal SDPA
without the soft-cap does in 4.57 (docs/kernels.md).

The FlashAttention-2 scheme:
- forward, one program per (query block, batch x query head): an online softmax in float32 over the
  key blocks the block can see, base-2 exponentials, the row's log-sum-exp saved for backward;
- backward: delta = rowsum(dO * O) per row; one program per (key block, batch x kv head) accumulates
  dK and dV over the query heads of its group and the query blocks that see it; one program per
  (query block, batch x query head) accumulates dQ. No atomics, so deterministic. With the soft-cap,
  t = tanh(x / c) for x = scale * q.k and ds/dx = 1 - t^2, so dS = P * (dP - delta) * (1 - t^2).
Sinks (gpt-oss): a learned logit per query head added to every row's softmax denominator, a key whose value
is zero. The forward starts each row's online softmax from it (running max = the sink, sum = 1), so the
saved log-sum-exp holds it and backward's P and delta need no change (the sink's value is zero, so it adds
nothing to dO . O); the sinks' own gradient is -sum over rows of P_sink * delta, from the saved LSE.
Key (query) blocks entirely above the diagonal or entirely outside the window are never visited: the
loop bounds come from the block indices. Of the visited blocks only those the diagonal, the window's
edge or the sequence's end cross compute a mask (three loops: masked, unmasked, masked).

"auto" picks it on CUDA for the head dimensions in core.TRITON_HEAD_DIMS (measured faster than
FlexAttention there); elsewhere backend="triton" or LANNER_ATTENTION=triton asks for it.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..ops._utils import dot_precision, new_output, tanh, tile_dot
from .kept_sdpa import stored_or_computed

# Tiles by head dimension, per kernel: (BLOCK_M queries, BLOCK_N keys, num_warps, num_stages). D 256 measured
# on the H200 (attention_bench.py --tune-triton, docs/benchmarks.md sixteenth round): of the candidates, a
# 64 x 32 forward at 4 warps (1.92 ms against 3.05 for 64 x 64 at 8 on Gemma 2's global layer at 8,192) and
# backward kernels at 4 warps, one stage (10.8 ms against 12.2); the others are not measured. The backward
# kernels hold two float32 accumulators of 32 x 256 (dK, dV) or one of 64 x 256 (dQ) beside their tiles, so
# their key block is 32.
LOG2_E = tl.constexpr(1.4426950408889634)  # scores are kept in base 2: exp(x) = exp2(x * log2(e))

TILES = {
    16: dict(fwd=(64, 64, 4, 3), dkdv=(64, 64, 4, 3), dq=(64, 64, 4, 3)),
    32: dict(fwd=(64, 64, 4, 3), dkdv=(64, 64, 4, 3), dq=(64, 64, 4, 3)),
    64: dict(fwd=(128, 64, 4, 3), dkdv=(32, 128, 4, 3), dq=(128, 32, 4, 3)),
    128: dict(fwd=(128, 64, 8, 3), dkdv=(32, 128, 8, 2), dq=(128, 32, 8, 2)),
    256: dict(fwd=(64, 32, 4, 2), dkdv=(64, 32, 4, 1), dq=(64, 32, 4, 1)),
}


@triton.jit
def _scores(qk, scale, softcap, HAS_SOFTCAP: tl.constexpr):
    """Base-2 scores of q.k, and t = tanh(x / softcap) (the soft-cap's derivative is 1 - t^2)."""
    x = qk * scale
    if HAS_SOFTCAP:
        t = tanh(x / softcap)
        x = softcap * t
    else:
        t = x
    return x * LOG2_E, t


@triton.jit
def _visible(rows, cols, seq_len, window, starts, HAS_WINDOW: tl.constexpr, HAS_SEGMENTS: tl.constexpr):
    """(rows x cols) mask of query rows seeing key cols, both inside the sequence (starts: each row's sample start)."""
    seen = (cols[None, :] <= rows[:, None]) & (rows[:, None] < seq_len) & (cols[None, :] < seq_len)
    if HAS_WINDOW:
        seen = seen & (rows[:, None] - cols[None, :] < window)
    if HAS_SEGMENTS:
        seen = seen & (cols[None, :] >= starts[:, None])
    return seen


@triton.jit
def _row_starts(STARTS, b, rows, seq_len, HAS_SEGMENTS: tl.constexpr):
    """Each row's sample start (packed samples), else the rows themselves (unread)."""
    if HAS_SEGMENTS:
        starts = tl.load(STARTS + b * seq_len + rows, mask=rows < seq_len, other=0)
    else:
        starts = rows
    return starts


@triton.jit
def _segment_key_bounds(STARTS, b, m0, seq_len, lo, full, diag, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Packed samples narrow _key_block_bounds: no row of [m0, m0 + BLOCK_M) sees a key before its first row's
    sample start, and every row sees the keys from its last row's sample start to the diagonal."""
    first = tl.load(STARTS + b * seq_len + m0)
    last = tl.load(STARTS + b * seq_len + tl.minimum(m0 + BLOCK_M, seq_len) - 1)
    lo = tl.maximum(lo, (first // BLOCK_N) * BLOCK_N)
    full = tl.maximum(tl.minimum(tl.maximum(full, tl.cdiv(last, BLOCK_N) * BLOCK_N), diag), lo)
    return lo, full


@triton.jit
def _key_block_bounds(m0, seq_len, window, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      HAS_WINDOW: tl.constexpr):
    """For queries [m0, m0 + BLOCK_M): the key blocks [lo, hi) they see, of which [full, diag) need no mask."""
    hi = tl.minimum(seq_len, m0 + BLOCK_M)
    diag = (m0 // BLOCK_N) * BLOCK_N  # from here a key may lie above the diagonal for some row
    if HAS_WINDOW:
        lo = (tl.maximum(m0 - window + 1, 0) // BLOCK_N) * BLOCK_N
        full = tl.cdiv(tl.maximum(m0 + BLOCK_M - window, 0), BLOCK_N) * BLOCK_N  # keys in every row's window
        full = tl.minimum(tl.maximum(full, lo), diag)
    else:
        lo = 0
        full = 0
    return lo, full, diag, hi


@triton.jit
def _row_pointers(X, b, h, stride_b, stride_h, stride_t, rows, dims):
    """Pointers to the (rows x dims) tile of one (batch, head) of a (B, H, T, D) tensor."""
    return X + b * stride_b + h * stride_h + rows[:, None] * stride_t + dims[None, :]


@triton.jit
def _load_rows(X, b, h, stride_b, stride_h, stride_t, rows, dims, seq_len):
    """That tile, rows past the sequence read as zeros."""
    return tl.load(_row_pointers(X, b, h, stride_b, stride_h, stride_t, rows, dims), mask=(rows < seq_len)[:, None],
                   other=0.0)


@triton.jit
def _query_program(n_heads, groups, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr):
    """A program over one query block of one (batch, query head): (m0, bh, b, h, kv head, rows, dims)."""
    m0 = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // n_heads, bh % n_heads
    return m0, bh, b, h, h // groups, m0 + tl.arange(0, BLOCK_M), tl.arange(0, HEAD_DIM)


@triton.jit
def _key_pointers(K, V, b, kv, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt, dims,
                  BLOCK_N: tl.constexpr):
    """Pointers to the first BLOCK_N keys' K and V rows of one (batch, kv head); key block n is n * stride on."""
    keys = tl.arange(0, BLOCK_N)[:, None]
    return (K + b * stride_kb + kv * stride_kh + keys * stride_kt + dims[None, :],
            V + b * stride_vb + kv * stride_vh + keys * stride_vt + dims[None, :])


@triton.jit
def _key_tiles(k_ptrs, v_ptrs, stride_kt, stride_vt, n, cols, seq_len, MASKED: tl.constexpr):
    """The K and V tiles of the key block starting at n; MASKED: keys past the sequence read as zeros."""
    if MASKED:
        k = tl.load(k_ptrs + n * stride_kt, mask=(cols < seq_len)[:, None], other=0.0)
        v = tl.load(v_ptrs + n * stride_vt, mask=(cols < seq_len)[:, None], other=0.0)
    else:
        k = tl.load(k_ptrs + n * stride_kt)
        v = tl.load(v_ptrs + n * stride_vt)
    return k, v


@triton.jit
def _fwd_blocks(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kt, stride_vt, rows, starts, start, end, seq_len,
                scale, softcap, window, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr,
                HAS_SOFTCAP: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_SEGMENTS: tl.constexpr,
                PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    for n in range(start, end, BLOCK_N):
        cols = n + tl.arange(0, BLOCK_N)
        k, v = _key_tiles(k_ptrs, v_ptrs, stride_kt, stride_vt, n, cols, seq_len, MASKED)
        s, _ = _scores(tile_dot(q, tl.trans(k), None, PRECISION, UPCAST), scale, softcap, HAS_SOFTCAP)
        if MASKED:
            s = tl.where(_visible(rows, cols, seq_len, window, starts, HAS_WINDOW, HAS_SEGMENTS), s, -1.0e30)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tile_dot(p.to(v.dtype), v, acc * alpha[:, None], PRECISION, UPCAST)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _fwd_kernel(Q, K, V, O, LSE, SINKS, STARTS,
                stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
                stride_vb, stride_vh, stride_vt, stride_ob, stride_oh, stride_ot,
                n_heads, groups, seq_len, scale, softcap, window,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                HAS_SOFTCAP: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_SEGMENTS: tl.constexpr,
                HAS_SINKS: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    m0, bh, b, h, kv, rows, dims = _query_program(n_heads, groups, BLOCK_M, HEAD_DIM)
    q = _load_rows(Q, b, h, stride_qb, stride_qh, stride_qt, rows, dims, seq_len)
    k_ptrs, v_ptrs = _key_pointers(K, V, b, kv, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
                                   dims, BLOCK_N)

    acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    # -1e30, a finite stand-in for -inf (also on masked scores): a row whose first visited block is all masked
    # gets finite weights there, which the next block's rescaling (exp2(-1e30 - max) = 0) wipes, not inf - inf.
    m_i = tl.zeros((BLOCK_M,), dtype=tl.float32) - 1.0e30
    if HAS_SINKS:  # the sink as the row's first key: its base-2 logit the running max, its weight 1 the sum
        m_i = tl.zeros((BLOCK_M,), dtype=tl.float32) + tl.load(SINKS + h).to(tl.float32) * LOG2_E
        l_i = l_i + 1.0
    starts = _row_starts(STARTS, b, rows, seq_len, HAS_SEGMENTS)
    lo, full, diag, hi = _key_block_bounds(m0, seq_len, window, BLOCK_M, BLOCK_N, HAS_WINDOW)
    if HAS_SEGMENTS:
        lo, full = _segment_key_bounds(STARTS, b, m0, seq_len, lo, full, diag, BLOCK_M, BLOCK_N)
    acc, l_i, m_i = _fwd_blocks(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kt, stride_vt, rows, starts, lo, full, seq_len,
                                scale, softcap, window, BLOCK_N, HEAD_DIM, True, HAS_SOFTCAP, HAS_WINDOW, HAS_SEGMENTS,
                                PRECISION, UPCAST)
    acc, l_i, m_i = _fwd_blocks(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kt, stride_vt, rows, starts, full, diag, seq_len,
                                scale, softcap, window, BLOCK_N, HEAD_DIM, False, HAS_SOFTCAP, HAS_WINDOW, HAS_SEGMENTS,
                                PRECISION, UPCAST)
    acc, l_i, m_i = _fwd_blocks(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kt, stride_vt, rows, starts, diag, hi, seq_len,
                                scale, softcap, window, BLOCK_N, HEAD_DIM, True, HAS_SOFTCAP, HAS_WINDOW, HAS_SEGMENTS,
                                PRECISION, UPCAST)
    inside = rows < seq_len
    tl.store(LSE + bh * seq_len + rows, m_i + tl.log2(l_i), mask=inside)
    out = acc / l_i[:, None]
    tl.store(_row_pointers(O, b, h, stride_ob, stride_oh, stride_ot, rows, dims), out.to(O.dtype.element_ty),
             mask=inside[:, None])


@triton.jit
def _delta_kernel(O, DO, DELTA, stride_ob, stride_oh, stride_ot, stride_db, stride_dh, stride_dt,
                  n_heads, seq_len, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr):
    _, bh, b, h, _, rows, dims = _query_program(n_heads, 1, BLOCK_M, HEAD_DIM)
    o = _load_rows(O, b, h, stride_ob, stride_oh, stride_ot, rows, dims, seq_len)
    do = _load_rows(DO, b, h, stride_db, stride_dh, stride_dt, rows, dims, seq_len)
    tl.store(DELTA + bh * seq_len + rows, tl.sum(o.to(tl.float32) * do.to(tl.float32), 1), mask=rows < seq_len)


@triton.jit
def _dkdv_blocks(dk, dv, k, v, q_ptrs, do_ptrs, lse_ptr, delta_ptr, STARTS, b, stride_qt, stride_dt, cols, start, end,
                 seq_len, scale, softcap, window, BLOCK_M: tl.constexpr, MASKED: tl.constexpr,
                 HAS_SOFTCAP: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_SEGMENTS: tl.constexpr,
                 PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    # Transposed: (keys x queries) tiles, so that dK and dV accumulate as products with the key rows first.
    for m in range(start, end, BLOCK_M):
        rows = m + tl.arange(0, BLOCK_M)
        if MASKED:
            inside = rows < seq_len
            q_t = tl.load(q_ptrs + m * stride_qt, mask=inside[None, :], other=0.0)
            do = tl.load(do_ptrs + m * stride_dt, mask=inside[:, None], other=0.0)
            lse = tl.load(lse_ptr + rows, mask=inside, other=0.0)
            delta = tl.load(delta_ptr + rows, mask=inside, other=0.0)
        else:
            q_t = tl.load(q_ptrs + m * stride_qt)
            do = tl.load(do_ptrs + m * stride_dt)
            lse = tl.load(lse_ptr + rows)
            delta = tl.load(delta_ptr + rows)
        s_t, t_t = _scores(tile_dot(k, q_t, None, PRECISION, UPCAST), scale, softcap, HAS_SOFTCAP)
        p_t = tl.exp2(s_t - lse[None, :])
        if MASKED:
            starts = _row_starts(STARTS, b, rows, seq_len, HAS_SEGMENTS)
            p_t = tl.where(tl.trans(_visible(rows, cols, seq_len, window, starts, HAS_WINDOW, HAS_SEGMENTS)), p_t, 0.0)
        dv = tile_dot(p_t.to(do.dtype), do, dv, PRECISION, UPCAST)
        ds_t = p_t * (tile_dot(v, tl.trans(do), None, PRECISION, UPCAST) - delta[None, :])
        if HAS_SOFTCAP:
            ds_t = ds_t * (1.0 - t_t * t_t)
        dk = tile_dot(ds_t.to(q_t.dtype), tl.trans(q_t), dk, PRECISION, UPCAST)
    return dk, dv


@triton.jit
def _dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, STARTS, ENDS,
                 stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
                 stride_vb, stride_vh, stride_vt, stride_db, stride_dh, stride_dt,
                 stride_dkb, stride_dkh, stride_dkt, stride_dvb, stride_dvh, stride_dvt,
                 n_kv_heads, groups, seq_len, scale, softcap, window,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                 HAS_SOFTCAP: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_SEGMENTS: tl.constexpr,
                 PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    n0 = tl.program_id(0) * BLOCK_N
    bkv = tl.program_id(1).to(tl.int64)
    b, kv = bkv // n_kv_heads, bkv % n_kv_heads
    cols = n0 + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    k = _load_rows(K, b, kv, stride_kb, stride_kh, stride_kt, cols, dims, seq_len)
    v = _load_rows(V, b, kv, stride_vb, stride_vh, stride_vt, cols, dims, seq_len)

    # Query blocks that see a key of this block: [lo, hi); [diag, full) need no mask (below the diagonal,
    # inside every window, inside the sequence).
    lo = (n0 // BLOCK_M) * BLOCK_M
    if HAS_WINDOW:
        hi = tl.minimum(seq_len, n0 + BLOCK_N - 1 + window)
        full = ((n0 + window) // BLOCK_M) * BLOCK_M
    else:
        hi = seq_len
        full = seq_len
    if HAS_SEGMENTS:  # no query past the last key's sample end sees the block; past the first key's, not all of it
        hi = tl.minimum(hi, tl.load(ENDS + b * seq_len + tl.minimum(n0 + BLOCK_N, seq_len) - 1))
        full = tl.minimum(full, (tl.load(ENDS + b * seq_len + n0) // BLOCK_M) * BLOCK_M)
    diag = tl.minimum(tl.cdiv(n0 + BLOCK_N - 1, BLOCK_M) * BLOCK_M, hi)
    full = tl.maximum(tl.minimum(tl.minimum(full, (seq_len // BLOCK_M) * BLOCK_M), hi), diag)

    dk = tl.zeros((BLOCK_N, HEAD_DIM), dtype=tl.float32)
    dv = tl.zeros((BLOCK_N, HEAD_DIM), dtype=tl.float32)
    block_rows = tl.arange(0, BLOCK_M)
    for g in range(groups):  # GQA: this kv head's gradients sum over its query heads
        bh = b * (n_kv_heads * groups) + kv * groups + g
        h = kv * groups + g
        q_ptrs = Q + b * stride_qb + h * stride_qh + block_rows[None, :] * stride_qt + dims[:, None]
        do_ptrs = DO + b * stride_db + h * stride_dh + block_rows[:, None] * stride_dt + dims[None, :]
        lse_ptr = LSE + bh * seq_len
        delta_ptr = DELTA + bh * seq_len
        dk, dv = _dkdv_blocks(dk, dv, k, v, q_ptrs, do_ptrs, lse_ptr, delta_ptr, STARTS, b, stride_qt, stride_dt, cols,
                              lo, diag, seq_len, scale, softcap, window, BLOCK_M, True, HAS_SOFTCAP, HAS_WINDOW,
                              HAS_SEGMENTS, PRECISION, UPCAST)
        dk, dv = _dkdv_blocks(dk, dv, k, v, q_ptrs, do_ptrs, lse_ptr, delta_ptr, STARTS, b, stride_qt, stride_dt, cols,
                              diag, full, seq_len, scale, softcap, window, BLOCK_M, False, HAS_SOFTCAP, HAS_WINDOW,
                              HAS_SEGMENTS, PRECISION, UPCAST)
        dk, dv = _dkdv_blocks(dk, dv, k, v, q_ptrs, do_ptrs, lse_ptr, delta_ptr, STARTS, b, stride_qt, stride_dt, cols,
                              full, hi, seq_len, scale, softcap, window, BLOCK_M, True, HAS_SOFTCAP, HAS_WINDOW,
                              HAS_SEGMENTS, PRECISION, UPCAST)
    key_inside = (cols < seq_len)[:, None]
    tl.store(_row_pointers(DK, b, kv, stride_dkb, stride_dkh, stride_dkt, cols, dims),
             (dk * scale).to(DK.dtype.element_ty), mask=key_inside)
    tl.store(_row_pointers(DV, b, kv, stride_dvb, stride_dvh, stride_dvt, cols, dims),
             dv.to(DV.dtype.element_ty), mask=key_inside)


@triton.jit
def _dq_blocks(dq, q, do, lse, delta, k_ptrs, v_ptrs, stride_kt, stride_vt, rows, starts, start, end, seq_len,
               scale, softcap, window, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
               HAS_SOFTCAP: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_SEGMENTS: tl.constexpr,
               PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    for n in range(start, end, BLOCK_N):
        cols = n + tl.arange(0, BLOCK_N)
        k, v = _key_tiles(k_ptrs, v_ptrs, stride_kt, stride_vt, n, cols, seq_len, MASKED)
        s, t = _scores(tile_dot(q, tl.trans(k), None, PRECISION, UPCAST), scale, softcap, HAS_SOFTCAP)
        p = tl.exp2(s - lse[:, None])
        if MASKED:
            p = tl.where(_visible(rows, cols, seq_len, window, starts, HAS_WINDOW, HAS_SEGMENTS), p, 0.0)
        ds = p * (tile_dot(do, tl.trans(v), None, PRECISION, UPCAST) - delta[:, None])
        if HAS_SOFTCAP:
            ds = ds * (1.0 - t * t)
        dq = tile_dot(ds.to(k.dtype), k, dq, PRECISION, UPCAST)
    return dq


@triton.jit
def _dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, STARTS,
               stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
               stride_vb, stride_vh, stride_vt, stride_db, stride_dh, stride_dt,
               stride_dqb, stride_dqh, stride_dqt,
               n_heads, groups, seq_len, scale, softcap, window,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
               HAS_SOFTCAP: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_SEGMENTS: tl.constexpr,
               PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    m0, bh, b, h, kv, rows, dims = _query_program(n_heads, groups, BLOCK_M, HEAD_DIM)
    inside = rows < seq_len
    q = _load_rows(Q, b, h, stride_qb, stride_qh, stride_qt, rows, dims, seq_len)
    do = _load_rows(DO, b, h, stride_db, stride_dh, stride_dt, rows, dims, seq_len)
    lse = tl.load(LSE + bh * seq_len + rows, mask=inside, other=0.0)
    delta = tl.load(DELTA + bh * seq_len + rows, mask=inside, other=0.0)
    k_ptrs, v_ptrs = _key_pointers(K, V, b, kv, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
                                   dims, BLOCK_N)

    dq = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
    starts = _row_starts(STARTS, b, rows, seq_len, HAS_SEGMENTS)
    lo, full, diag, hi = _key_block_bounds(m0, seq_len, window, BLOCK_M, BLOCK_N, HAS_WINDOW)
    if HAS_SEGMENTS:
        lo, full = _segment_key_bounds(STARTS, b, m0, seq_len, lo, full, diag, BLOCK_M, BLOCK_N)
    dq = _dq_blocks(dq, q, do, lse, delta, k_ptrs, v_ptrs, stride_kt, stride_vt, rows, starts, lo, full, seq_len,
                    scale, softcap, window, BLOCK_N, True, HAS_SOFTCAP, HAS_WINDOW, HAS_SEGMENTS, PRECISION, UPCAST)
    dq = _dq_blocks(dq, q, do, lse, delta, k_ptrs, v_ptrs, stride_kt, stride_vt, rows, starts, full, diag, seq_len,
                    scale, softcap, window, BLOCK_N, False, HAS_SOFTCAP, HAS_WINDOW, HAS_SEGMENTS, PRECISION, UPCAST)
    dq = _dq_blocks(dq, q, do, lse, delta, k_ptrs, v_ptrs, stride_kt, stride_vt, rows, starts, diag, hi, seq_len,
                    scale, softcap, window, BLOCK_N, True, HAS_SOFTCAP, HAS_WINDOW, HAS_SEGMENTS, PRECISION, UPCAST)
    tl.store(_row_pointers(DQ, b, h, stride_dqb, stride_dqh, stride_dqt, rows, dims),
             (dq * scale).to(DQ.dtype.element_ty), mask=inside[:, None])


def _strides(x):
    return x.stride(0), x.stride(1), x.stride(2)


def _inner_contiguous(x):
    return x if x.stride(-1) == 1 else x.contiguous()


def _tiles(head_dim):
    if head_dim not in TILES:
        raise ValueError(f"flash_attention: head dim {head_dim} is not a power of two from 16 to 256")
    return TILES[head_dim]


_SAMPLE_BOUNDS = "flash sample bounds"  # flash_attention's key in its caller's per-forward cache


def _sample_bounds(segments: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For packed samples (contiguous runs of equal ids, (B, T)): each position's sample start and end, int32."""
    batch, length = segments.shape
    index = torch.arange(length, device=segments.device, dtype=torch.int32).expand(batch, length)
    first = torch.ones_like(segments, dtype=torch.bool)
    first[:, 1:] = segments[:, 1:] != segments[:, :-1]
    last = torch.ones_like(first)
    last[:, :-1] = first[:, 1:]
    starts = torch.where(first, index, 0).cummax(1).values
    ends = torch.where(last, index + 1, length).flip(1).cummin(1).values.flip(1)
    return starts.to(torch.int32).contiguous(), ends.to(torch.int32).contiguous()


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sinks, starts, ends, scale, window, softcap, kept, recomputing):
        q, k, v = (_inner_contiguous(x) for x in (q, k, v))
        out, lse, _ = stored_or_computed(
            kept, recomputing, lambda: (*_forward(q, k, v, sinks, starts, scale, window, softcap), ()))
        ctx.save_for_backward(q, k, v, out, lse, sinks, starts, ends)
        ctx.options = (scale, window, softcap)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, sinks, starts, ends = ctx.saved_tensors
        scale, window, softcap = ctx.options
        grad_out = _inner_contiguous(grad_out)
        batch, n_heads, seq_len, head_dim = q.shape
        n_kv_heads = k.shape[1]
        groups = n_heads // n_kv_heads
        tiles = _tiles(head_dim)
        flags = _flags(q, window, softcap, starts)
        options = (seq_len, scale, softcap or 1.0, window or seq_len)
        bounds = (starts, ends) if starts is not None else (lse, lse)  # (unread without packed samples)

        delta = new_output((batch * n_heads, seq_len), torch.float32, q.device)
        _delta_kernel[(triton.cdiv(seq_len, 64), batch * n_heads)](
            out, grad_out, delta, *_strides(out), *_strides(grad_out), n_heads, seq_len, BLOCK_M=64, HEAD_DIM=head_dim)

        dk = new_output(k.shape, k.dtype, k.device)
        dv = new_output(v.shape, v.dtype, v.device)
        block_m, block_n, warps, stages = tiles["dkdv"]
        _dkdv_kernel[(triton.cdiv(seq_len, block_n), batch * n_kv_heads)](
            q, k, v, grad_out, lse, delta, dk, dv, *bounds, *_strides(q), *_strides(k), *_strides(v), *_strides(grad_out),
            *_strides(dk), *_strides(dv), n_kv_heads, groups, *options,
            BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=head_dim, **flags, num_warps=warps, num_stages=stages)

        dq = new_output(q.shape, q.dtype, q.device)
        block_m, block_n, warps, stages = tiles["dq"]
        _dq_kernel[(triton.cdiv(seq_len, block_m), batch * n_heads)](
            q, k, v, grad_out, lse, delta, dq, bounds[0], *_strides(q), *_strides(k), *_strides(v), *_strides(grad_out),
            *_strides(dq), n_heads, groups, *options,
            BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=head_dim, **flags, num_warps=warps, num_stages=stages)
        d_sinks = None
        if sinks is not None and ctx.needs_input_grad[3]:
            # d sink_h = -sum over the head's rows of P_sink * delta, P_sink = 2^(sink log2 e - lse)
            p_sink = torch.exp2(sinks.float().repeat(batch)[:, None] * LOG2_E.value - lse)
            d_sinks = -(p_sink * delta).view(batch, n_heads, seq_len).sum((0, 2)).to(sinks.dtype)
        return dq, dk, dv, d_sinks, None, None, None, None, None, None, None


def _forward(q, k, v, sinks, starts, scale, window, softcap):
    """(output, log-sum-exp of each softmax row, float32 (B * Hq, T))."""
    batch, n_heads, seq_len, head_dim = q.shape
    block_m, block_n, warps, stages = _tiles(head_dim)["fwd"]
    out = new_output(q.shape, q.dtype, q.device)
    lse = new_output((batch * n_heads, seq_len), torch.float32, q.device)
    _fwd_kernel[(triton.cdiv(seq_len, block_m), batch * n_heads)](
        q, k, v, out, lse, sinks if sinks is not None else lse, starts if starts is not None else lse,
        *_strides(q), *_strides(k), *_strides(v),
        *_strides(out), n_heads, n_heads // k.shape[1], seq_len, scale, softcap or 1.0, window or seq_len,
        BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=head_dim, **_flags(q, window, softcap, starts),
        HAS_SINKS=sinks is not None, num_warps=warps, num_stages=stages)
    return out, lse


def _flags(q, window, softcap, starts):
    return dict(HAS_SOFTCAP=softcap is not None, HAS_WINDOW=window is not None, HAS_SEGMENTS=starts is not None,
                PRECISION=dot_precision(q.dtype), UPCAST=q.device.type != "cuda")


def flash_attention(q, k, v, scale: float, window: int | None = None, softcap: float | None = None,
                    sinks: torch.Tensor | None = None, segments: torch.Tensor | None = None,
                    cache: dict | None = None, kept=None, recomputing: bool = False) -> torch.Tensor:
    """Causal attention (B, Hq, T, D) with the module docstring's options; window None or < T, softcap None or > 0,
    sinks None or (Hq,) logits, segments None or (B, T) sample ids in contiguous runs. cache: a dict that lives as
    long as these segments (one forward's), where their sample bounds are computed once for every layer. kept,
    recomputing: the output and log-sum-exp stored in a forward, taken in a recompute (kept_sdpa.py's `kept`)."""
    if q.shape[1] % k.shape[1] or k.shape != v.shape or q.shape[2] != k.shape[2]:
        raise ValueError(f"flash_attention: q {tuple(q.shape)} with k {tuple(k.shape)}, v {tuple(v.shape)}")
    if sinks is not None and sinks.shape != (q.shape[1],):
        raise ValueError(f"flash_attention: sinks {tuple(sinks.shape)} for {q.shape[1]} query heads")
    if segments is not None and segments.shape != (q.shape[0], q.shape[2]):
        raise ValueError(f"flash_attention: segments {tuple(segments.shape)} for q {tuple(q.shape)}")
    starts = ends = None
    if segments is not None:
        bounds = cache.get(_SAMPLE_BOUNDS) if cache is not None else None
        if bounds is None:
            bounds = _sample_bounds(segments)
            if cache is not None:
                cache[_SAMPLE_BOUNDS] = bounds
        starts, ends = bounds
    return _FlashAttention.apply(q, k, v, None if sinks is None else sinks.contiguous(), starts, ends, float(scale),
                                 window, softcap, kept, recomputing)
