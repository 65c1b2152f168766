"""The glue around a mixture-of-experts block's grouped GEMMs: combining sorted rows back into tokens,
and the routing weights' gradient.

Rows sorted by expert: sorted row i is the flattened (token, slot) assignment order[i] (token
order[i] // k, slot order[i] % k), and inverse[t * k + j] is the sorted row of token t's slot j.

- `moe_combine(rows, inverse, k, weights)`: out[t] = sum_j w[t, j] * rows[inverse[t * k + j]], each
  product and the sum in float32, rounded once to the output dtype; without weights the plain
  per-token sum (the input gradient of the dispatch gather). One pass: no weighted or float copy of
  the rows, no gather, no separate reduction.
- `moe_weight_grad_(dh, h, order, weights)`: the routing weights' gradient <dh[i], h[i]> (float32 dot)
  written straight to its (token, slot), and dh[i] scaled by its row's weight in place (float32
  product, one rounding), reading dh and h once.

Deterministic (no atomics): each output element is written by one program. Offsets are int64.
"""
import torch
import triton
import triton.language as tl

from ._utils import new_output

# Elements of one program's [rows, columns] tile: BLOCK_D up to 1024 columns (16-byte loads for 4
# warps), and several rows per program when rows are shorter.
_TILE = 2048
_MAX_BLOCK_D = 1024


@triton.jit
def _combine_kernel(
    ROWS, INVERSE, WEIGHTS, OUT,
    n_tokens, n_cols,
    stride_rows, stride_out,
    K: tl.constexpr,
    HAS_WEIGHTS: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    tokens = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    token_mask = tokens < n_tokens
    mask = token_mask[:, None] & (cols < n_cols)[None, :]
    acc = tl.zeros((BLOCK_T, BLOCK_D), dtype=tl.float32)
    for j in tl.static_range(K):  # unrolled: the k row loads are in flight together
        assignment = tokens * K + j
        row = tl.load(INVERSE + assignment, mask=token_mask, other=0).to(tl.int64)
        y = tl.load(ROWS + row[:, None] * stride_rows + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        if HAS_WEIGHTS:
            y *= tl.load(WEIGHTS + assignment, mask=token_mask, other=0.0).to(tl.float32)[:, None]
        acc += y
    tl.store(OUT + tokens[:, None] * stride_out + cols[None, :], acc.to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _weight_grad_kernel(
    DH, H, ORDER, WEIGHTS, DW,
    n_rows, n_cols,
    stride_dh, stride_h,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_S + tl.arange(0, BLOCK_S)
    row_mask = rows < n_rows
    assignment = tl.load(ORDER + rows, mask=row_mask, other=0).to(tl.int64)
    w = tl.load(WEIGHTS + assignment, mask=row_mask, other=0.0).to(tl.float32)[:, None]
    acc = tl.zeros((BLOCK_S, BLOCK_D), dtype=tl.float32)
    for c0 in range(0, n_cols, BLOCK_D):
        cols = c0 + tl.arange(0, BLOCK_D)
        mask = row_mask[:, None] & (cols < n_cols)[None, :]
        dh_ptrs = DH + rows[:, None] * stride_dh + cols[None, :]
        dh = tl.load(dh_ptrs, mask=mask, other=0.0).to(tl.float32)
        h = tl.load(H + rows[:, None] * stride_h + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        acc += dh * h
        tl.store(dh_ptrs, (dh * w).to(DH.dtype.element_ty), mask=mask)
    tl.store(DW + assignment, tl.sum(acc, axis=1).to(DW.dtype.element_ty), mask=row_mask)


def _blocks(n_cols):
    block_d = min(triton.next_power_of_2(max(n_cols, 1)), _MAX_BLOCK_D)
    return max(1, _TILE // block_d), block_d


def _check_rows(name, t):
    if t.dim() != 2 or t.stride(1) != 1:
        raise ValueError(f"{name} must be 2D with contiguous rows, got shape {tuple(t.shape)} strides {t.stride()}")


def moe_combine(rows: torch.Tensor, inverse: torch.Tensor, k: int, weights: torch.Tensor | None = None,
                out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """[T, d] per-token sums of the sorted rows [T * k, d]: out[t] = sum_j w[t, j] * rows[inverse[t * k + j]]
    (w = 1 without weights [T, k]), accumulated in float32 and rounded once to out_dtype (rows' dtype
    by default). inverse [T * k]: the sorted row of each flattened (token, slot) assignment."""
    _check_rows("rows", rows)
    n_rows, n_cols = rows.shape
    if n_rows % k or inverse.shape != (n_rows,):
        raise ValueError(f"moe_combine: {n_rows} rows, inverse {tuple(inverse.shape)} and k={k} do not match")
    tokens = n_rows // k
    out = new_output((tokens, n_cols), out_dtype or rows.dtype, rows.device)
    if out.numel():
        if weights is not None:
            if weights.shape != (tokens, k):
                raise ValueError(f"moe_combine: weights {tuple(weights.shape)}, expected {(tokens, k)}")
            weights = weights.contiguous()
        block_t, block_d = _blocks(n_cols)
        _combine_kernel[(triton.cdiv(tokens, block_t), triton.cdiv(n_cols, block_d))](
            rows, inverse, rows if weights is None else weights, out,
            tokens, n_cols,
            rows.stride(0), out.stride(0),
            K=k,
            HAS_WEIGHTS=weights is not None,
            BLOCK_T=block_t,
            BLOCK_D=block_d,
            num_warps=4,
        )
    return out


def moe_weight_grad_(dh: torch.Tensor, h: torch.Tensor, order: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The routing weights' gradient [T, k] (weights' dtype): d_w[order[i]] = <dh[i], h[i]> in float32,
    for sorted rows dh and h [T * k, n]; and dh[i] *= w[order[i]] in place (float32 product, rounded once)."""
    _check_rows("dh", dh)
    _check_rows("h", h)
    if dh.shape != h.shape or order.shape != (dh.shape[0],) or weights.numel() != dh.shape[0]:
        raise ValueError(f"moe_weight_grad_: dh {tuple(dh.shape)}, h {tuple(h.shape)}, order {tuple(order.shape)} "
                         f"and weights {tuple(weights.shape)} do not match")
    weights = weights.contiguous()
    d_weights = new_output(weights.shape, weights.dtype, weights.device)
    n_rows, n_cols = dh.shape
    if n_rows:
        block_s, block_d = _blocks(n_cols)
        _weight_grad_kernel[(triton.cdiv(n_rows, block_s),)](
            dh, h, order, weights, d_weights,
            n_rows, n_cols,
            dh.stride(0), h.stride(0),
            BLOCK_S=block_s,
            BLOCK_D=block_d,
            num_warps=4,
        )
    return d_weights
