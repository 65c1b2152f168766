"""A decoder layer's residual add, with the rank-r LoRA term of the projection before it added on the way.

Over an FP8 base the o and down projections' GEMMs cannot accumulate onto their outputs, so their LoRA terms
were an addmm_ each (a read and a write of the output) before the residual add read it again: here
residual + (out + left @ right) is one pass, the term rounded once to out's dtype as the addmm_ would have.
"""
import torch
import triton
import triton.language as tl

from ._utils import dot_precision, new_output, plus_rank_r, rank_block

# (rows, columns) of a program's tile and its warps: the term's dot wants rows of 32 at least; wide tiles
# keep each program's share of right (the term's (rank, columns) factor) reused over its rows.
_TILE = (32, 128, 4)


@triton.jit
def _residual_rank_r_kernel(
    RESIDUAL, OUT, RESULT, LEFT, RIGHT, n_rows, n_cols, stride_residual, stride_out, stride_result,
    rank, stride_left, stride_right_j, stride_right_col,
    R: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask, col_mask = rows < n_rows, cols < n_cols
    mask = row_mask[:, None] & col_mask[None, :]
    out = tl.load(OUT + rows[:, None] * stride_out + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    out = plus_rank_r(out, OUT, LEFT, RIGHT, rows, cols, row_mask, col_mask, rank, stride_left, stride_right_j,
                      stride_right_col, True, R, DOT_PRECISION, UPCAST)
    residual = tl.load(RESIDUAL + rows[:, None] * stride_residual + cols[None, :], mask=mask, other=0.0)
    tl.store(RESULT + rows[:, None] * stride_result + cols[None, :],
             (residual.to(tl.float32) + out).to(RESULT.dtype.element_ty), mask=mask)


def _rows(t: torch.Tensor) -> torch.Tensor | None:
    """t as (rows, columns) with unit column stride, without a copy; None where it has no such view."""
    try:
        rows = t.view(-1, t.shape[-1])
    except RuntimeError:
        return None
    return rows if rows.stride(-1) == 1 else None


class _ResidualAdd(torch.autograd.Function):
    """residual + out, the term added onto out in forward: the gradient is the sum's for both (out's
    projection computes its LoRA gradients from it, as for its whole output)."""

    @staticmethod
    def forward(ctx, residual, out, left, right):
        residual2d, out2d = _rows(residual), _rows(out)
        result = new_output(out.shape, out.dtype, out.device)
        n_rows, n_cols = out2d.shape
        rank = left.shape[1]
        block_m, block_n, warps = _TILE
        _residual_rank_r_kernel[(triton.cdiv(n_rows, block_m), triton.cdiv(n_cols, block_n))](
            residual2d, out2d, result, left, right, n_rows, n_cols, residual2d.stride(0), out2d.stride(0), n_cols,
            rank, left.stride(0), right.stride(0), right.stride(1),
            R=rank_block(rank), DOT_PRECISION=dot_precision(out.dtype), UPCAST=out.device.type != "cuda",
            BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps,
        )
        return result

    @staticmethod
    def backward(ctx, grad):
        return grad, grad, None, None


class _UnreadSum(torch.autograd.Function):
    """residual + out where the sum is only differentiated, never read: no pass, the gradient to both."""

    @staticmethod
    def forward(ctx, residual, out):
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):
        return grad, grad


def unread_sum(residual: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """residual + out in autograd's graph, its values left as out's: for a checkpoint's recompute whose MLP left its
    output unwritten (LoRAMLPFunction's output_needed), where the layer's output is differentiated, not read (the
    memory engine's graphs take the recompute's gradients from it)."""
    return _UnreadSum.apply(residual, out)


def residual_add(residual: torch.Tensor, out: torch.Tensor, term=None) -> torch.Tensor:
    """residual + out, where term = (left, right), (rows, r) by (r, columns), is first added onto out's rows
    (as out.addmm_(left, right) would): one kernel for alike 16/32-bit tensors on the GPU or the interpreter,
    torch's ops for anything else (a residual of another dtype: the sum is then torch's). Without a term,
    residual + out."""
    if term is None:
        return residual + out
    left, right = term
    fused = (residual.shape == out.shape and residual.dtype == out.dtype
             and residual.device == out.device and _rows(residual) is not None and _rows(out) is not None
             and left.stride(-1) == 1 and left.shape[0] == out.numel() // out.shape[-1])
    if not fused:
        return residual + torch.addmm(out.reshape(-1, out.shape[-1]), left, right).view(out.shape)
    return _ResidualAdd.apply(residual, out, left, right)
