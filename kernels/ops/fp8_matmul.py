"""The FP8 GEMM: e4m3 operands with row-wise float32 scales, out = (a_q @ b_q^T) * a_scale * b_scale.

On CUDA with compute capability 8.9 or newer (Ada, Hopper) it is `torch._scaled_mm` with row-wise
scales (scale_a (M, 1) per row of a, scale_b (1, N) per row of b, bf16 out), on the tensor cores.
Elsewhere (the CPU, the tests, or LANNER_FP8_EMULATE=1) it is an exact float32 emulation of the same
arithmetic: the e4m3 codes cast to float32 (exact), one float32 matmul (every product of two e4m3
values is exact in float32; the sums round as the tensor cores' float32 accumulation does, in another
order), then the two scales and one rounding to the output dtype. The two paths agree within the
rounding of the float32 sums and of that last cast (docs/fp8.md).

A CUDA GPU older than 8.9 has no FP8 tensor cores: `fp8_backend` says so in words, with the fallbacks.

`quantize_rows` makes the operands: per-row e4m3 codes and float32 scales (each row's largest magnitude
maps to 448), one Triton program per row on a GPU, torch elsewhere, the same bits either way.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

FP8_DTYPE = torch.float8_e4m3fn
E4M3_MAX = torch.finfo(FP8_DTYPE).max  # 448
MIN_CAPABILITY = (8, 9)
EMULATE_ENV = "LANNER_FP8_EMULATE"
# quantize_rows works in float32 on this many elements at a time (64 MiB), not on a float32 copy of a whole
# (tokens x 14,336) activation or gradient.
QUANTIZE_CHUNK_ELEMENTS = 2**24


class FP8Unsupported(RuntimeError):
    """FP8 tensor cores are not on this GPU."""


def fp8_unsupported_message(name: str, capability: tuple[int, int]) -> str:
    return (f"FP8 needs compute capability {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or newer (Ada/Hopper); this GPU "
            f"is {name} ({capability[0]}.{capability[1]}). Train with lora (bf16) or qlora (4-bit) instead, or set "
            f"{EMULATE_ENV}=1 to emulate FP8 in float32 (the same results, slower than bf16)")


def fp8_backend(device: torch.device) -> str:
    """"scaled_mm" (FP8 tensor cores) or "emulated"; raises FP8Unsupported on a CUDA GPU below 8.9
    unless LANNER_FP8_EMULATE=1 asks for the emulation."""
    if os.environ.get(EMULATE_ENV) == "1" or device.type != "cuda":
        return "emulated"
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        raise FP8Unsupported(fp8_unsupported_message(torch.cuda.get_device_name(device), capability))
    return "scaled_mm"


def quantize_rows(x: torch.Tensor, column_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scale): x (M, K), times column_scale (K,) when given, as e4m3 codes and a float32 scale per
    row (M, 1) with x * column_scale ~= codes * scale; on a GPU one Triton kernel (x read twice, the codes
    written once), elsewhere torch in chunks. The same codes and scales, bit for bit."""
    if x.is_cuda:
        return quantize_rows_triton(x, column_scale)
    return quantize_rows_torch(x, column_scale)


def quantize_rows_torch(x: torch.Tensor, column_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scale): x (M, K), times column_scale (K,) when given, as e4m3 codes and a float32 scale per
    row (M, 1) with x * column_scale ~= codes * scale.

    Each row's largest magnitude maps to 448, e4m3's largest finite value (an all-zero row gets scale 1).
    The products and the division are in float32 and the cast rounds to nearest even, so every element's
    error is at most 2^-4 of its magnitude (3 mantissa bits), or 2^-10 * scale below e4m3's normal range
    (2^-6 * scale). Rows are taken in chunks so the float32 temporaries stay small."""
    codes = torch.empty(x.shape, dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty((x.shape[0], 1), dtype=torch.float32, device=x.device)
    step = max(1, QUANTIZE_CHUNK_ELEMENTS // max(x.shape[1], 1))
    for start in range(0, x.shape[0], step):
        rows = slice(start, start + step)
        x32 = x[rows].to(torch.float32, copy=True) if column_scale is None else x[rows] * column_scale.float()
        amax = x32.abs().amax(dim=-1, keepdim=True)
        # a tensor divisor: CUDA divides by a Python scalar as a product with its reciprocal (not correctly
        # rounded), which differs from the Triton kernel's div_rn in the last bit
        chunk_scale = torch.where(amax > 0, amax / torch.full_like(amax, E4M3_MAX), torch.ones_like(amax))
        codes[rows] = x32.div_(chunk_scale).clamp_(-E4M3_MAX, E4M3_MAX)
        scale[rows] = chunk_scale
    return codes, scale


@triton.jit
def _e4m3_bits(v):
    """The e4m3 bit patterns (in int32) of float32 v, |v| <= 448, rounded to nearest even by integer
    operations: the CPU interpreter's float8 cast rounds ties away and flushes small subnormals."""
    bits = v.to(tl.int32, bitcast=True)
    a = bits & 0x7FFFFFFF
    e = (a >> 23) - 127
    # normal (e >= -6): drop 20 of the 23 mantissa bits, to nearest even; a carry moves into the exponent
    r = a + 0x7FFFF + ((a >> 20) & 1)
    normal = (((r >> 23) - 120) << 3) | ((r >> 20) & 7)
    # subnormal: round(mantissa * 2^(e + 9 - 23)) to nearest even; 8 is 2^-6, the smallest normal's pattern
    mantissa = (a & 0x7FFFFF) | 0x800000
    shift = tl.minimum(14 - e, 30)
    q = mantissa >> shift
    rest = mantissa & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    q += ((rest > half) | ((rest == half) & ((q & 1) == 1))).to(tl.int32)
    return tl.where(e >= -6, normal, q) | tl.where(bits < 0, 0x80, 0)


@triton.jit
def _scaled_block(x_row, COLUMN_SCALE, start, n_cols, HAS_COLUMN_SCALE: tl.constexpr, BLOCK: tl.constexpr):
    cols = start + tl.arange(0, BLOCK)
    mask = cols < n_cols
    v = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_COLUMN_SCALE:
        v = v * tl.load(COLUMN_SCALE + cols, mask=mask, other=0.0)
    return v, cols, mask


@triton.jit
def _quantize_rows_kernel(X, COLUMN_SCALE, CODES, SCALE, n_cols, x_row_stride, E4M3_MAX: tl.constexpr,
                          HAS_COLUMN_SCALE: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = X + row * x_row_stride
    amax = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        v, cols, mask = _scaled_block(x_row, COLUMN_SCALE, start, n_cols, HAS_COLUMN_SCALE, BLOCK)
        amax = tl.maximum(amax, tl.abs(v))
    row_max = tl.max(amax, axis=0)
    scale = tl.where(row_max > 0, tl.math.div_rn(row_max, E4M3_MAX), 1.0)
    tl.store(SCALE + row, scale)
    for start in range(0, n_cols, BLOCK):  # the second read of the row mostly hits the L2 cache
        v, cols, mask = _scaled_block(x_row, COLUMN_SCALE, start, n_cols, HAS_COLUMN_SCALE, BLOCK)
        v = tl.minimum(tl.maximum(tl.math.div_rn(v, scale), -E4M3_MAX), E4M3_MAX)
        tl.store(CODES + row * n_cols + cols, _e4m3_bits(v).to(tl.uint8), mask=mask)


def quantize_rows_triton(x: torch.Tensor, column_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_rows as one Triton program per row (GPU, or the CPU interpreter in the tests)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    rows, cols = x.shape
    codes = torch.empty((rows, cols), dtype=torch.uint8, device=x.device)
    scale = torch.empty((rows, 1), dtype=torch.float32, device=x.device)
    if rows:
        column_scale = None if column_scale is None else column_scale.float().contiguous()
        _quantize_rows_kernel[(rows,)](x, column_scale if column_scale is not None else scale, codes, scale, cols,
                                       x.stride(0), E4M3_MAX=E4M3_MAX, HAS_COLUMN_SCALE=column_scale is not None,
                                       BLOCK=min(triton.next_power_of_2(cols), 2048), num_warps=4)
    return codes.view(FP8_DTYPE), scale


def fp8_matmul(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor | None,
               out_dtype: torch.dtype, backend: str) -> torch.Tensor:
    """(a @ b^T) * a_scale * b_scale in out_dtype.

    a: (M, K) e4m3, row-major; a_scale: (M, 1) float32. b: (N, K) e4m3, row-major (so b.t() is the
    column-major operand cuBLAS' FP8 GEMM wants); b_scale: (N,) float32, or None for no scale. backend: fp8_backend(device).
    On the tensor cores the result is rounded to bf16 (the row-wise-scaled GEMM's only output) and then
    cast to out_dtype."""
    if backend == "scaled_mm":
        n = b.shape[0]
        scale_b = (torch.ones(1, n, device=b.device, dtype=torch.float32) if b_scale is None
                   else b_scale.view(1, n))
        out = torch._scaled_mm(a, b.t(), scale_a=a_scale, scale_b=scale_b, out_dtype=torch.bfloat16)
        return out if out_dtype == torch.bfloat16 else out.to(out_dtype)
    out = (a.float() @ b.float().t()).mul_(a_scale)
    if b_scale is not None:
        out.mul_(b_scale)
    return out.to(out_dtype)
