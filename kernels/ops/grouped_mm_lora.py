"""Grouped LoRA GEMMs on torch._grouped_mm: the mixture-of-experts path on Hopper and Blackwell GPUs.

The same products as ops/grouped_lora.py, for rows sorted by expert (expert e owns rows
[starts[e], ends[e]); torch._grouped_mm takes the int32 ends as its offsets),
    Y = X_e W_e^T + s * (X_e A_e^T) B_e^T           (forward; XA = X_e A_e^T kept for backward)
    dX = dY_e W_e + s * (dY_e B_e) A_e               (backward; dY B kept for dA)
as two grouped GEMMs and one Triton kernel each: the frozen weight's GEMM, the rank-r product
(X_e A_e^T or dY_e B_e), then `rank_accumulate_` adds s * (rank-r product) @ factor_e^T into the
output in place, reading and writing it once (a third grouped GEMM would write an output-sized
product for an add to read back: two more passes over the output). On sm90/sm100 with bf16
operands torch._grouped_mm runs CUTLASS's grouped GEMM (TMA, wgmma, persistent tiles), where the one
Triton kernel, fixed 64x64x64 tiles, measured 1.7x slower per Qwen3-30B-A3B layer on an H200. The
LoRA factors' own gradients stay on the Triton reductions (grouped_lora_factor_grads): they are
small (r x in per expert), and grouped_mm's ragged-K form (2D x 2D) writes bf16 only on its fast
path, which would round the float32 factors' gradients.

torch._grouped_mm needs both operands in one dtype, a unit stride in each matrix's last two dims and
every other stride (and the data pointer) a multiple of 16 bytes. The activations here are fresh
row-major tensors, so that is a rule on the feature dims and the frozen weights. The LoRA factors
are cast to the compute dtype once per experts call (`grouped_mm_factors`, kept for backward; copied
row-major only where their strides break the rule, padded with zero ranks only where r is not a
multiple of 16 bytes), which costs E * r * (in + out) elements.
"""
from __future__ import annotations

import functools
import logging

import torch
import triton
import triton.language as tl

from ._utils import dot_precision, rank_block, tile_dot

log = logging.getLogger("lanner.kernels")

# None: torch._grouped_mm on CUDA devices where it reaches CUTLASS (compute capability 9.x or 10.x, bf16),
# the Triton kernels elsewhere. True: on those devices and on the CPU (bf16 or float32; the tests compare
# both paths there). False: the Triton kernels always.
ENABLED: bool | None = None

_ALIGN_BYTES = 16

# Rows per program of rank_accumulate_ (a tile may straddle experts). Tests may shrink it.
ACCUMULATE_BLOCK_M = 64
_ACCUMULATE_BLOCK_N = 128


def _cutlass_device(device: torch.device) -> bool:
    # On other GPUs torch._grouped_mm loops over the groups with a device-to-host sync: Triton is faster.
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch.cuda.get_device_capability(index)[0] in (9, 10) and grouped_mm_works(f"cuda:{index}")


@functools.cache
def grouped_mm_works(device: str) -> bool:
    """Once per device, torch._grouped_mm on both weight layouts used here, on a tiny bf16 case with an
    empty group: a torch build whose grouped GEMM refuses or miscomputes them leaves the experts on
    Triton, with a warning in words."""
    generator = torch.Generator(device).manual_seed(0)  # the caller's random streams stay untouched
    x = torch.randn(24, 16, device=device, generator=generator).bfloat16()
    w = torch.randn(3, 16, 16, device=device, generator=generator).bfloat16()
    offs = torch.tensor([8, 8, 24], device=device, dtype=torch.int32)
    expected = torch.cat([x[:8] @ w[0].t(), x[8:] @ w[2].t()]).float()
    try:
        ok = all(torch.allclose(torch._grouped_mm(x, b, offs=offs).float(), expected, rtol=2e-2, atol=2e-1)
                 for b in (w.transpose(1, 2), w.transpose(1, 2).contiguous()))
        reason = "wrong results"
    except RuntimeError as error:
        ok, reason = False, str(error)
    if not ok:
        log.warning("lanner.kernels: MoE experts on the Triton kernels: torch._grouped_mm failed its check on %s (%s)",
                    device, reason)
    return ok


def _dtype_ok(device: torch.device, dtype: torch.dtype) -> bool:
    # CUDA: only bf16 (in and out) reaches CUTLASS. The CPU kernel also takes float32, whose exact
    # products let the tests hold this path to the float32 bound.
    return dtype == torch.bfloat16 or (device.type == "cpu" and dtype == torch.float32)


def _aligned(t: torch.Tensor) -> bool:
    """A unit stride in the last two dims, the other strides and the data pointer on 16 bytes."""
    align = _ALIGN_BYTES // t.element_size()
    strides = list(t.stride())
    if 1 not in strides[-2:] or t.data_ptr() % _ALIGN_BYTES:
        return False
    strides.pop(len(strides) - 2 + strides[-2:].index(1))
    return all(s % align == 0 for s in strides)


def use_grouped_mm(x: torch.Tensor, *weights: torch.Tensor) -> bool:
    """Whether the grouped GEMMs of rows x (and of the activations derived from them, row-major with the
    weights' feature dims) over the frozen weights [E, out, in] can run on torch._grouped_mm; else the
    Triton kernels. Chosen once per experts call, before anything runs, so it never fails half-way."""
    if ENABLED is False or not hasattr(torch, "_grouped_mm") or x.shape[0] == 0:
        return False
    if x.device.type == "cuda":
        if not _cutlass_device(x.device):
            return False
    elif not (ENABLED and x.device.type == "cpu" and grouped_mm_works("cpu")):
        return False
    if not _dtype_ok(x.device, x.dtype) or not _aligned(x):
        return False
    align = _ALIGN_BYTES // x.element_size()
    return all(w.dtype == x.dtype and w.device == x.device and _aligned(w)
               and w.shape[1] % align == 0 and w.shape[2] % align == 0 for w in weights)


def _as_operand(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t itself when it already is a dtype operand for torch._grouped_mm, else a row-major dtype copy
    (one cast-and-copy kernel)."""
    if t.dtype == dtype and _aligned(t):
        return t
    return torch.empty(t.shape, dtype=dtype, device=t.device).copy_(t)


def grouped_mm_factors(lora_A: torch.Tensor | None, lora_B: torch.Tensor | None, dtype: torch.dtype):
    """(a, b): lora_A [E, r, in] and lora_B [E, out, r] (any strides and dtype) for torch._grouped_mm, in
    dtype, as [E, r', in] and [E, out, r'], r' = r rounded up to 16 bytes; (None, None) without LoRA. An
    aligned rank (r = 16 in bf16) is only cast (not even copied when a factor already suits); another is
    padded with zero ranks. Made once per experts call, for forward and backward."""
    if lora_A is None:
        return None, None
    experts, rank, _ = lora_A.shape
    align = _ALIGN_BYTES // torch.empty((), dtype=dtype).element_size()
    if rank % align == 0:
        return _as_operand(lora_A, dtype), _as_operand(lora_B, dtype)
    padded = -(-rank // align) * align
    a = lora_A.new_zeros((experts, padded, lora_A.shape[2]), dtype=dtype)
    a[:, :rank] = lora_A
    b = lora_B.new_zeros((experts, lora_B.shape[1], padded), dtype=dtype)
    b[:, :, :rank] = lora_B
    return a, b


@triton.jit
def _rank_accumulate_kernel(
    OUT, XR, F, STARTS, ENDS,
    M, N, R, E, scaling,
    stride_om, stride_on,
    stride_xm, stride_xr,
    stride_fe, stride_fn, stride_fr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_E: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    row0 = pid_m * BLOCK_M
    rows = row0 + tl.arange(0, BLOCK_M)
    row_mask = rows < M
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    # The experts owning the tile's first and last rows (the count of experts ending at or before the
    # row); rows are sorted, so the tile's experts are those two and any between (some maybe empty).
    experts = tl.arange(0, BLOCK_E)
    ends = tl.load(ENDS + experts, mask=experts < E, other=M)
    first = tl.sum((ends <= row0).to(tl.int32))
    last = tl.sum((ends <= tl.minimum(row0 + BLOCK_M, M) - 1).to(tl.int32))
    rows64 = rows.to(tl.int64)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for r0 in range(0, R, BLOCK_R):
        ranks = r0 + tl.arange(0, BLOCK_R)
        rank_mask = ranks < R
        xr = tl.load(XR + rows64[:, None] * stride_xm + ranks[None, :] * stride_xr,
                     mask=row_mask[:, None] & rank_mask[None, :], other=0.0)
        for e in range(first, last + 1):
            owned = (rows >= tl.load(STARTS + e)) & (rows < tl.load(ENDS + e))
            f = tl.load(F + e * stride_fe + ranks[:, None] * stride_fr + cols[None, :] * stride_fn,
                        mask=rank_mask[:, None] & col_mask[None, :], other=0.0).to(xr.dtype)
            acc = tile_dot(tl.where(owned[:, None], xr, tl.zeros_like(xr)), f, acc, DOT_PRECISION, UPCAST)
    out_ptrs = OUT + rows64[:, None] * stride_om + cols[None, :] * stride_on
    mask = row_mask[:, None] & col_mask[None, :]
    out = tl.load(out_ptrs, mask=mask, other=0.0).to(tl.float32) + scaling * acc
    tl.store(out_ptrs, out.to(OUT.dtype.element_ty), mask=mask)


def rank_accumulate_(out, xr, factor, groups, rank: int, scaling: float):
    """out[m] += scaling * xr[m, :rank] @ factor[e, :, :rank]^T in place, for the rows m of each expert e
    (rows sorted by expert, groups: ExpertGroups); out [M, N], xr [M, >= rank] in the compute dtype,
    factor [E, N, >= rank] with any strides (B for forward; A transposed for the input gradient). The
    rank-r dot accumulates in float32 and is added to out's element in float32, rounded once."""
    rows, n = out.shape
    if rows == 0:
        return out
    experts = groups.num_experts
    grid = (triton.cdiv(rows, ACCUMULATE_BLOCK_M), triton.cdiv(n, _ACCUMULATE_BLOCK_N))
    _rank_accumulate_kernel[grid](
        out, xr, factor, groups.starts, groups.ends,
        rows, n, rank, experts, float(scaling),
        out.stride(0), out.stride(1),
        xr.stride(0), xr.stride(1),
        factor.stride(0), factor.stride(1), factor.stride(2),
        DOT_PRECISION=dot_precision(xr.dtype),
        UPCAST=out.device.type != "cuda",
        BLOCK_M=ACCUMULATE_BLOCK_M, BLOCK_N=_ACCUMULATE_BLOCK_N, BLOCK_R=rank_block(rank),
        BLOCK_E=triton.next_power_of_2(experts),
    )
    return out


def grouped_mm_lora_forward(x, groups, weight, factors, rank: int, scaling):
    """(Y, XA) as grouped_lora_forward's, for groups (ExpertGroups) and factors grouped_mm_factors' (a, b)
    of a rank-`rank` LoRA."""
    y = torch._grouped_mm(x, weight.transpose(1, 2), offs=groups.ends)
    a, b = factors
    if a is None:
        return y, None
    xa = grouped_mm_rank_product(x, groups, a, rank)
    rank_accumulate_(y, xa, b, groups, rank, scaling)
    return y, xa


def grouped_mm_rank_product(x, groups, a, rank: int):
    """XA alone, as grouped_mm_lora_forward's second output, for a (grouped_mm_factors') of a rank-`rank` LoRA."""
    return torch._grouped_mm(x, a.transpose(1, 2), offs=groups.ends)[:, :rank]


def grouped_mm_lora_input_grad(dy, groups, weight, factors, rank: int, scaling):
    """(dX, dY B) as grouped_lora_input_grad's; arguments as grouped_mm_lora_forward's."""
    dx = torch._grouped_mm(dy, weight, offs=groups.ends)
    a, b = factors
    if a is None:
        return dx, None
    dyb = torch._grouped_mm(dy, b, offs=groups.ends)
    rank_accumulate_(dx, dyb, a.transpose(1, 2), groups, rank, scaling)
    return dx, dyb[:, :rank]
