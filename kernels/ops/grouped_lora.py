"""Grouped LoRA GEMMs over rows sorted by expert (mixture-of-experts projections).

Rows of X are grouped by expert: expert e owns rows [starts[e], ends[e]). For every expert at once,
in one launch,
    Y_e = X_e @ W_e^T + s * (X_e @ A_e^T) @ B_e^T
with W [E, out, in] frozen and A [E, r, in], B [E, out, r] trainable (any strides: PEFT's expert
factors are views of its 2D weights). The launch grid is (row tiles, output-column tiles); each row
tile belongs to one expert (tiles never straddle two experts), read from small per-tile tables
built from the groups' row ranges without a host sync. Each program accumulates X_e @ W_e^T and,
in the same K loop, X_e @ A_e^T (r extra columns: r / BLOCK_N more FLOPs), then adds the rank-r
term s * XA @ B_e^T into its accumulator before the one store: the output is written once. The
column-tile-0 programs also store XA (rows x r), which backward needs. A rank past one tile
(_utils.RANK_CHUNK) would not fit a program: XA is then a grouped GEMM of its own and its rank-r term
is added onto the output a chunk of the rank at a time (rank_accumulate_, one more pass over it).

Backward (no per-expert Python loop): dX = dY @ W_e + s * (dY @ B_e) @ A_e is the same kernel on
transposed strides (its rank-r side product dY @ B_e is stored too), and dA_e = s * (dY B_e)^T X_e,
dB_e = s * dY_e^T (X_e A_e^T) are one launch each of a per-expert reduction over the expert's rows.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ._utils import dot_precision, new_output, rank_block, tile_dot
from .grouped_mm_lora import (
    grouped_mm_factors,
    grouped_mm_lora_forward,
    grouped_mm_lora_input_grad,
    grouped_mm_rank_product,
    rank_accumulate_,
    use_grouped_mm,
)

# Rows per tile; tiles never cross an expert boundary. Tests may shrink it.
BLOCK_M = 64
_BLOCK_N, _BLOCK_K = 64, 64


@dataclass(frozen=True, eq=False)
class RowTiles:
    """Row tile t (of BLOCK_M rows at most) covers [start[t], end[t]) of expert expert[t]'s rows. There are
    cdiv(rows, BLOCK_M) + experts tiles, an upper bound known without a device-to-host sync; the unused
    ones are empty (start == end)."""

    expert: torch.Tensor
    start: torch.Tensor
    end: torch.Tensor


@dataclass(frozen=True, eq=False)
class ExpertGroups:
    """Rows grouped by expert: expert e's rows are [starts[e], ends[e]) of the `rows` sorted rows. The
    Triton kernels also need row tiles (`tiles`), made on first use: about twenty small kernels that the
    torch._grouped_mm path, which reads the starts and ends alone, never launches."""

    starts: torch.Tensor
    ends: torch.Tensor
    rows: int
    block_m: int

    @property
    def num_experts(self) -> int:
        return self.starts.shape[0]

    @functools.cached_property
    def tiles(self) -> RowTiles:
        starts, ends, block_m = self.starts.to(torch.int64), self.ends.to(torch.int64), self.block_m
        counts = ends - starts
        tiles = (counts + block_m - 1) // block_m
        tile_ends = tiles.cumsum(0)
        t = torch.arange(triton.cdiv(self.rows, block_m) + self.num_experts, device=starts.device)
        expert = torch.searchsorted(tile_ends, t, right=True)
        valid = expert < self.num_experts
        expert = expert.clamp(max=self.num_experts - 1)
        tile_start = starts[expert] + (t - (tile_ends - tiles)[expert]) * block_m
        tile_end = torch.minimum(tile_start + block_m, ends[expert])
        int32 = torch.int32
        return RowTiles(expert.to(int32), torch.where(valid, tile_start, 0).to(int32),
                        torch.where(valid, tile_end, 0).to(int32))


_ARANGES: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def cached_arange(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """torch.arange(n) as a view of one cached tensor per (device, dtype), grown when a call needs more:
    no kernel launch per call. Read-only."""
    cached = _ARANGES.get((device, dtype))
    if cached is None or cached.shape[0] < n:
        cached = _ARANGES[(device, dtype)] = torch.arange(n, dtype=dtype, device=device)
    return cached[:n]


def expert_groups(sorted_experts: torch.Tensor, num_experts: int, block_m: int | None = None) -> ExpertGroups:
    """The groups of rows sorted by expert, from each sorted row's expert id (on the device; what
    torch.sort gives): one searchsorted for every expert's first row, expert E's standing for the end."""
    bounds = torch.searchsorted(sorted_experts, cached_arange(num_experts + 1, sorted_experts.dtype,
                                                              sorted_experts.device), out_int32=True)
    return ExpertGroups(bounds[:-1], bounds[1:], sorted_experts.shape[0], block_m or BLOCK_M)


@triton.jit
def _grouped_lora_kernel(
    X, W, A, B, OUT, XA,
    TILE_EXPERT, TILE_START, TILE_END,
    N, K, R, scaling,
    stride_xm, stride_xk,
    stride_we, stride_wn, stride_wk,
    stride_ae, stride_ar, stride_ak,
    stride_be, stride_bn, stride_br,
    stride_om, stride_on,
    stride_xam, stride_xar,
    HAS_LORA: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(TILE_EXPERT + pid_m).to(tl.int64)
    row_start = tl.load(TILE_START + pid_m).to(tl.int64)
    row_end = tl.load(TILE_END + pid_m).to(tl.int64)
    rows = row_start + tl.arange(0, BLOCK_M)
    row_mask = rows < row_end
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    ranks = tl.arange(0, BLOCK_R)
    rank_mask = ranks < R
    dtype = X.dtype.element_ty

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    xa = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    # The spare tiles of the grid's bound (start == end) skip the K loop; their stores are all masked.
    k_end = tl.where(row_end > row_start, K, 0)
    for k0 in range(0, k_end, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_mask = ks < K
        x = tl.load(X + rows[:, None] * stride_xm + ks[None, :] * stride_xk,
                    mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        w = tl.load(W + expert * stride_we + ks[:, None] * stride_wk + cols[None, :] * stride_wn,
                    mask=k_mask[:, None] & col_mask[None, :], other=0.0).to(dtype)
        acc = tile_dot(x, w, acc, DOT_PRECISION, UPCAST)
        if HAS_LORA:
            a = tl.load(A + expert * stride_ae + ks[:, None] * stride_ak + ranks[None, :] * stride_ar,
                        mask=k_mask[:, None] & rank_mask[None, :], other=0.0).to(dtype)
            xa = tile_dot(x, a, xa, DOT_PRECISION, UPCAST)
    if HAS_LORA:
        # XA is rounded to the compute dtype before the rank-r product, as the dense path's is.
        xa_rounded = xa.to(dtype)
        b = tl.load(B + expert * stride_be + ranks[:, None] * stride_br + cols[None, :] * stride_bn,
                    mask=rank_mask[:, None] & col_mask[None, :], other=0.0).to(dtype)
        acc += scaling * tile_dot(xa_rounded, b, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), DOT_PRECISION, UPCAST)
        if pid_n == 0:
            tl.store(XA + rows[:, None] * stride_xam + ranks[None, :] * stride_xar, xa_rounded,
                     mask=row_mask[:, None] & rank_mask[None, :])
    tl.store(OUT + rows[:, None] * stride_om + cols[None, :] * stride_on, acc.to(OUT.dtype.element_ty),
             mask=row_mask[:, None] & col_mask[None, :])


@triton.jit
def _grouped_rank_grad_kernel(
    P, Q, OUT, STARTS, ENDS,
    N, R, scaling,
    stride_pm, stride_pr,
    stride_qm, stride_qn,
    stride_oe, stride_or, stride_on,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
):
    # OUT[e] = scaling * P_e^T @ Q_e over expert e's rows; an expert without rows gets zeros.
    expert = tl.program_id(0)
    pid_n = tl.program_id(1)
    start = tl.load(STARTS + expert)
    end = tl.load(ENDS + expert)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    ranks = tl.program_id(2) * BLOCK_R + tl.arange(0, BLOCK_R)
    rank_mask = ranks < R
    acc = tl.zeros((BLOCK_R, BLOCK_N), dtype=tl.float32)
    for m0 in range(start, end, BLOCK_M):
        rows = (m0 + tl.arange(0, BLOCK_M)).to(tl.int64)
        row_mask = rows < end
        p = tl.load(P + rows[:, None] * stride_pm + ranks[None, :] * stride_pr,
                    mask=row_mask[:, None] & rank_mask[None, :], other=0.0)
        q = tl.load(Q + rows[:, None] * stride_qm + cols[None, :] * stride_qn,
                    mask=row_mask[:, None] & col_mask[None, :], other=0.0)
        acc = tile_dot(tl.trans(p), q, acc, DOT_PRECISION, UPCAST)
    tl.store(OUT + expert.to(tl.int64) * stride_oe + ranks[:, None] * stride_or + cols[None, :] * stride_on,
             (acc * scaling).to(OUT.dtype.element_ty), mask=rank_mask[:, None] & col_mask[None, :])


def _grouped_matmul(x, groups, w, w_strides, n, a=None, a_strides=None, b=None, b_strides=None, rank=0, scaling=1.0):
    """OUT[rows of e] = x_e @ W'_e^T + s * (x_e @ A'_e^T) @ B'_e^T and XA = x_e @ A'_e^T, where W'_e
    [n, k], A'_e [r, k], B'_e [n, r] are read through the given (expert, first, second) strides."""
    rows, k = x.shape
    if a is not None and rank_block(rank) < rank:
        # A rank past one tile (the kernel holds XA's whole rank through its K loop): XA as a grouped GEMM
        # of its own, then s * XA B'^T added onto the frozen weight's output a chunk of the rank at a time.
        out = _grouped_matmul(x, groups, w, w_strides, n)[0]
        xa = _grouped_matmul(x, groups, a, a_strides, rank)[0]
        b_view = b.as_strided((groups.num_experts, n, rank), b_strides, b.storage_offset())
        return rank_accumulate_(out, xa, b_view, groups, rank, scaling), xa
    out = new_output((rows, n), x.dtype, x.device)
    has_lora = a is not None
    xa = new_output((rows, rank), x.dtype, x.device) if has_lora else out
    if rows == 0:
        return out, (xa if has_lora else None)
    tiles = groups.tiles
    grid = (tiles.expert.shape[0], triton.cdiv(n, _BLOCK_N))
    _grouped_lora_kernel[grid](
        x, w, a if has_lora else w, b if has_lora else w, out, xa,
        tiles.expert, tiles.start, tiles.end,
        n, k, rank, float(scaling),
        x.stride(0), x.stride(1),
        *w_strides,
        *(a_strides if has_lora else (0, 0, 0)),
        *(b_strides if has_lora else (0, 0, 0)),
        out.stride(0), out.stride(1),
        xa.stride(0), xa.stride(1),
        HAS_LORA=has_lora,
        DOT_PRECISION=dot_precision(x.dtype),
        UPCAST=x.device.type != "cuda",
        BLOCK_M=groups.block_m, BLOCK_N=_BLOCK_N, BLOCK_K=_BLOCK_K, BLOCK_R=rank_block(rank) if has_lora else 16,
    )
    return out, (xa if has_lora else None)


def grouped_lora_forward(x, groups: ExpertGroups, weight, lora_A, lora_B, scaling, mm_factors=None):
    """(Y, XA) for rows x sorted by expert: Y = x_e W_e^T + s (x_e A_e^T) B_e^T; XA = x_e A_e^T
    (None without LoRA). weight [E, out, in]; lora_A [E, r, in]; lora_B [E, out, r]; any strides.
    mm_factors: on torch._grouped_mm (ops/grouped_mm_lora.py; only where use_grouped_mm said so) with
    these factors, grouped_mm_factors' of lora_A and lora_B ((None, None) without LoRA); None: Triton."""
    if mm_factors is not None:
        return grouped_mm_lora_forward(x, groups, weight, mm_factors, _rank(lora_A), scaling)
    w_strides = (weight.stride(0), weight.stride(1), weight.stride(2))
    if lora_A is None:
        return _grouped_matmul(x, groups, weight, w_strides, weight.shape[1])
    return _grouped_matmul(x, groups, weight, w_strides, weight.shape[1],
                           lora_A, (lora_A.stride(0), lora_A.stride(1), lora_A.stride(2)),
                           lora_B, (lora_B.stride(0), lora_B.stride(1), lora_B.stride(2)), lora_A.shape[1], scaling)


def grouped_lora_input_grad(dy, groups: ExpertGroups, weight, lora_A, lora_B, scaling, mm_factors=None):
    """(dX, dY B) for rows dy sorted by expert: dX = dy_e W_e + s (dy_e B_e) A_e, one launch; the
    rank-r side product dy_e B_e (None without LoRA) gives dA. mm_factors: as grouped_lora_forward's."""
    if mm_factors is not None:
        return grouped_mm_lora_input_grad(dy, groups, weight, mm_factors, _rank(lora_A), scaling)
    # W'_e = W_e^T, A'_e = B_e^T, B'_e = A_e^T: the forward kernel on swapped strides.
    w_strides = (weight.stride(0), weight.stride(2), weight.stride(1))
    if lora_A is None:
        return _grouped_matmul(dy, groups, weight, w_strides, weight.shape[2])
    return _grouped_matmul(dy, groups, weight, w_strides, weight.shape[2],
                           lora_B, (lora_B.stride(0), lora_B.stride(2), lora_B.stride(1)),
                           lora_A, (lora_A.stride(0), lora_A.stride(2), lora_A.stride(1)), lora_A.shape[1], scaling)


def grouped_lora_rank_product(x, groups: ExpertGroups, lora_A, mm_factors=None):
    """XA = x_e A_e^T alone, grouped_lora_forward's second output, for a recompute that needs no Y."""
    if mm_factors is not None:
        return grouped_mm_rank_product(x, groups, mm_factors[0], _rank(lora_A))
    return _grouped_matmul(x, groups, lora_A, (lora_A.stride(0), lora_A.stride(1), lora_A.stride(2)),
                           lora_A.shape[1])[0]


def _rank(lora_A) -> int:
    return 0 if lora_A is None else lora_A.shape[1]


def _grouped_rank_grad(p, q, groups: ExpertGroups, out, out_strides, scaling):
    """out[e] (viewed [E, r, n] through out_strides) = s * p_e^T @ q_e over expert e's rows."""
    r, n = p.shape[1], q.shape[1]
    grid = (groups.num_experts, triton.cdiv(n, _BLOCK_N), triton.cdiv(r, rank_block(r)))
    _grouped_rank_grad_kernel[grid](
        p, q, out, groups.starts, groups.ends,
        n, r, float(scaling),
        p.stride(0), p.stride(1),
        q.stride(0), q.stride(1),
        *out_strides,
        DOT_PRECISION=dot_precision(p.dtype),
        UPCAST=p.device.type != "cuda",
        BLOCK_M=groups.block_m, BLOCK_N=_BLOCK_N, BLOCK_R=rank_block(r),
    )
    return out


def grouped_lora_factor_grads(x, dy, xa, dyb, groups: ExpertGroups, lora_A, lora_B, scaling):
    """(dA, dB) shaped and strided like lora_A [E, r, in] and lora_B [E, out, r], in their dtypes:
    dA_e = s (dy_e B_e)^T x_e and dB_e = s dy_e^T (x_e A_e^T)."""
    dA = torch.empty_strided(lora_A.shape, lora_A.stride(), dtype=lora_A.dtype, device=lora_A.device)
    dB = torch.empty_strided(lora_B.shape, lora_B.stride(), dtype=lora_B.dtype, device=lora_B.device)
    _grouped_rank_grad(dyb, x, groups, dA, (dA.stride(0), dA.stride(1), dA.stride(2)), scaling)
    _grouped_rank_grad(xa, dy, groups, dB, (dB.stride(0), dB.stride(2), dB.stride(1)), scaling)
    return dA, dB


class GroupedLoRAFunction(torch.autograd.Function):
    """One grouped LoRA projection over rows sorted by expert; gradients for x, A and B (W is frozen)."""

    @staticmethod
    def forward(ctx, x, groups, weight, lora_A, lora_B, scaling):
        mm_factors = grouped_mm_factors(lora_A, lora_B, x.dtype) if use_grouped_mm(x, weight) else None
        y, xa = grouped_lora_forward(x, groups, weight, lora_A, lora_B, scaling, mm_factors)
        ctx.save_for_backward(x, xa, *(mm_factors or (None, None)))
        ctx.grouped_mm = mm_factors is not None
        ctx.groups, ctx.weight, ctx.lora, ctx.scaling = groups, weight, (lora_A, lora_B), scaling
        ctx.dtype = x.dtype
        return y

    @staticmethod
    def backward(ctx, dy):
        x, xa, a, b = ctx.saved_tensors
        lora_A, lora_B = ctx.lora
        dy = dy.to(ctx.dtype).contiguous()
        dx, dyb = grouped_lora_input_grad(dy, ctx.groups, ctx.weight, lora_A, lora_B, ctx.scaling,
                                          (a, b) if ctx.grouped_mm else None)
        dA = dB = None
        if lora_A is not None:
            dA, dB = grouped_lora_factor_grads(x, dy, xa, dyb, ctx.groups, lora_A, lora_B, ctx.scaling)
        return dx, None, None, dA, dB, None


def grouped_lora(x, groups: ExpertGroups, weight, lora_A, lora_B, scaling: float):
    """Y = x_e W_e^T + scaling * (x_e A_e^T) B_e^T for rows x [S, in] sorted by expert (see
    expert_groups); weight [E, out, in] frozen, lora_A [E, r, in] and lora_B [E, out, r] trainable."""
    return GroupedLoRAFunction.apply(x, groups, weight, lora_A, lora_B, scaling)
