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
maps to 448), one Triton kernel on a GPU, torch elsewhere, the same bits either way. `transpose_into`
lays out the input gradient's second operand, W^T's codes, in tiles.
"""
from __future__ import annotations

import functools
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
# A Triton quantiser program holds up to this many elements of rows that it reads once (32 a thread with 8
# warps), or blocks of a half of that of a longer row that it reads twice (16 a thread: fewer registers, more
# programs to an SM, while the rows they hold still fit in the L2 cache for their second read).
QUANTIZE_TILE = 8192
# The (rows, columns) tile of the quantiser of rows whose maxima are known: each tile on its own, read once.
KNOWN_AMAX_TILE = (8, 1024)
# The transpose's square tiles of bytes: rows of 128 bytes, whole cache lines, both ways.
TRANSPOSE_TILE = 128


class FP8Unsupported(RuntimeError):
    """FP8 tensor cores are not on this GPU."""


def fp8_unsupported_message(name: str, capability: tuple[int, int]) -> str:
    return (f"FP8 needs compute capability {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or newer (Ada/Hopper); this GPU "
            f"is {name} ({capability[0]}.{capability[1]}). Train with lora (bf16) or qlora (4-bit) instead, or set "
            f"{EMULATE_ENV}=1 to emulate FP8 in float32 (the same results, slower than bf16)")


@functools.cache
def _capability_of(index: int | None) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def cuda_capability(device: torch.device) -> tuple[int, int]:
    """The CUDA device's compute capability (index None: the current device's), asked once per device: every
    FP8 product asks."""
    return _capability_of(device.index)


def fp8_backend(device: torch.device) -> str:
    """"scaled_mm" (FP8 tensor cores) or "emulated"; raises FP8Unsupported on a CUDA GPU below 8.9
    unless LANNER_FP8_EMULATE=1 asks for the emulation."""
    if os.environ.get(EMULATE_ENV) == "1" or device.type != "cuda":
        return "emulated"
    capability = cuda_capability(device)
    if capability < MIN_CAPABILITY:
        raise FP8Unsupported(fp8_unsupported_message(torch.cuda.get_device_name(device), capability))
    return "scaled_mm"


def quantize_rows(x: torch.Tensor, column_scale: torch.Tensor | None = None, row_amax: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scale): x (M, K), times column_scale (K,) when given, as e4m3 codes and a float32 scale per
    row (M, 1) with x * column_scale ~= codes * scale; on a GPU one Triton kernel (x read once, twice for
    rows longer than QUANTIZE_TILE; the codes written once), elsewhere torch in chunks. The same codes and
    scales, bit for bit. row_amax: each row's largest |x * column_scale| as the maxima of its parts (M, parts),
    float32, found by the kernel that wrote x (the GLU's): every row is then read once, in tiles."""
    if x.is_cuda:
        return quantize_rows_triton(x, column_scale, row_amax)
    return quantize_rows_torch(x, column_scale, row_amax)


def quantize_rows_torch(x: torch.Tensor, column_scale: torch.Tensor | None = None, row_amax: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
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
        amax = x32.abs().amax(dim=-1, keepdim=True) if row_amax is None else row_amax[rows].amax(dim=-1, keepdim=True)
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
def _scaled_tile(X, COLUMN_SCALE, rows, row_mask, x_row_stride, start, n_cols, HAS_COLUMN_SCALE: tl.constexpr,
                 BLOCK: tl.constexpr):
    cols = start + tl.arange(0, BLOCK)
    col_mask = cols < n_cols
    mask = row_mask[:, None] & col_mask[None, :]
    v = tl.load(X + rows[:, None] * x_row_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_COLUMN_SCALE:
        v = v * tl.load(COLUMN_SCALE + cols, mask=col_mask, other=0.0)[None, :]
    return v, cols, mask


def hardware_e4m3_cast(device: torch.device) -> bool:
    """Whether the quantisers round to e4m3 with the GPU's conversion instruction (FP8 GPUs) rather than by
    `_e4m3_bits`' integer operations (the CPU interpreter, older GPUs): the same bits either way."""
    return device.type == "cuda" and cuda_capability(device) >= MIN_CAPABILITY


@triton.jit
def row_scales(amax, E4M3_MAX: tl.constexpr):
    """The float32 scale of each row of a (rows, block) tile of magnitudes: its largest maps to E4M3_MAX, an
    all-zero row gets 1."""
    row_max = tl.max(amax, axis=1)
    return tl.where(row_max > 0, tl.math.div_rn(row_max, E4M3_MAX), 1.0)


@triton.jit
def store_codes(CODES, rows, cols, mask, v, scale, n_cols, E4M3_MAX: tl.constexpr, HARDWARE_CAST: tl.constexpr):
    v = tl.minimum(tl.maximum(tl.math.div_rn(v, scale[:, None]), -E4M3_MAX), E4M3_MAX)
    if HARDWARE_CAST:  # one cvt.rn.satfinite.e4m3x2 for two elements: rounds to nearest even too
        codes = v.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    else:
        codes = _e4m3_bits(v).to(tl.uint8)
    tl.store(CODES + rows[:, None] * n_cols + cols[None, :], codes, mask=mask)


@triton.jit
def _quantize_rows_kernel(X, COLUMN_SCALE, CODES, SCALE, n_rows, n_cols, x_row_stride, E4M3_MAX: tl.constexpr,
                          HAS_COLUMN_SCALE: tl.constexpr, HARDWARE_CAST: tl.constexpr, ROWS: tl.constexpr,
                          BLOCK: tl.constexpr, ONE_PASS: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    row_mask = rows < n_rows
    if ONE_PASS:  # the rows fit in the block: read once
        v, cols, mask = _scaled_tile(X, COLUMN_SCALE, rows, row_mask, x_row_stride, 0, n_cols, HAS_COLUMN_SCALE,
                                     BLOCK)
        amax = tl.abs(v)
    else:
        amax = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK):
            v, cols, mask = _scaled_tile(X, COLUMN_SCALE, rows, row_mask, x_row_stride, start, n_cols,
                                         HAS_COLUMN_SCALE, BLOCK)
            amax = tl.maximum(amax, tl.abs(v))
    scale = row_scales(amax, E4M3_MAX)
    tl.store(SCALE + rows, scale, mask=row_mask)
    if ONE_PASS:
        store_codes(CODES, rows, cols, mask, v, scale, n_cols, E4M3_MAX, HARDWARE_CAST)
    else:
        for start in range(0, n_cols, BLOCK):  # the second read of a long row mostly hits the L2 cache
            v, cols, mask = _scaled_tile(X, COLUMN_SCALE, rows, row_mask, x_row_stride, start, n_cols,
                                         HAS_COLUMN_SCALE, BLOCK)
            store_codes(CODES, rows, cols, mask, v, scale, n_cols, E4M3_MAX, HARDWARE_CAST)


@triton.jit
def _quantize_known_kernel(X, COLUMN_SCALE, CODES, SCALE, ROW_AMAX, n_rows, n_cols, x_row_stride, codes_row_stride,
                           n_parts, E4M3_MAX: tl.constexpr, HAS_COLUMN_SCALE: tl.constexpr,
                           HARDWARE_CAST: tl.constexpr, WRITE_SCALE: tl.constexpr, ROWS: tl.constexpr,
                           BLOCK: tl.constexpr, PARTS: tl.constexpr):
    # Rows whose largest magnitudes are known, in parts (ROW_AMAX (rows, n_parts)): each (ROWS, BLOCK) tile is
    # quantised on its own, read once; the programs of the first column block write the scales.
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    row_mask = rows < n_rows
    parts = tl.arange(0, PARTS)
    amax = tl.load(ROW_AMAX + rows[:, None] * n_parts + parts[None, :],
                   mask=row_mask[:, None] & (parts[None, :] < n_parts), other=0.0)
    scale = row_scales(amax, E4M3_MAX)
    if WRITE_SCALE:
        if tl.program_id(1) == 0:
            tl.store(SCALE + rows, scale, mask=row_mask)
    v, cols, mask = _scaled_tile(X, COLUMN_SCALE, rows, row_mask, x_row_stride, tl.program_id(1) * BLOCK, n_cols,
                                 HAS_COLUMN_SCALE, BLOCK)
    store_codes(CODES, rows, cols, mask, v, scale, codes_row_stride, E4M3_MAX, HARDWARE_CAST)


def _quantize_known(x: torch.Tensor, column_scale: torch.Tensor | None, codes: torch.Tensor, scale: torch.Tensor,
                    row_amax: torch.Tensor, write_scale: bool = True) -> None:
    """_quantize_known_kernel over x (rows, n) into codes (rows, n) (a column block of wider codes too)."""
    rows, cols = x.shape
    if (row_amax.dtype != torch.float32 or row_amax.dim() != 2 or row_amax.shape[0] != rows
            or not row_amax.is_contiguous()):
        raise ValueError(f"row_amax: float32 (rows, parts), contiguous, for {rows} rows; got {row_amax.dtype} "
                         f"{tuple(row_amax.shape)}")
    block_rows, block = KNOWN_AMAX_TILE
    _quantize_known_kernel[(triton.cdiv(rows, block_rows), triton.cdiv(cols, block))](
        x, column_scale if column_scale is not None else scale, codes, scale, row_amax, rows, cols, x.stride(0),
        codes.stride(0), row_amax.shape[1], E4M3_MAX=E4M3_MAX, HAS_COLUMN_SCALE=column_scale is not None,
        HARDWARE_CAST=hardware_e4m3_cast(x.device), WRITE_SCALE=write_scale, ROWS=block_rows, BLOCK=block,
        PARTS=triton.next_power_of_2(row_amax.shape[1]), num_warps=8)


# Parts of one joined row: q/k/v's gradients (or gate/up's) quantised as the columns of one operand.
MAX_JOINED_PARTS = 3


@triton.jit
def _part_amax(X, COLUMN_SCALE, rows, row_mask, x_row_stride, n_cols, amax, BLOCK: tl.constexpr):
    for start in range(0, n_cols, BLOCK):
        v, _, _ = _scaled_tile(X, COLUMN_SCALE, rows, row_mask, x_row_stride, start, n_cols, True, BLOCK)
        amax = tl.maximum(amax, tl.abs(v))
    return amax


@triton.jit
def _part_store(X, COLUMN_SCALE, CODES, rows, row_mask, x_row_stride, n_cols, codes_row_stride, scale,
                E4M3_MAX: tl.constexpr, HARDWARE_CAST: tl.constexpr, BLOCK: tl.constexpr):
    for start in range(0, n_cols, BLOCK):
        v, cols, mask = _scaled_tile(X, COLUMN_SCALE, rows, row_mask, x_row_stride, start, n_cols, True, BLOCK)
        store_codes(CODES, rows, cols, mask, v, scale, codes_row_stride, E4M3_MAX, HARDWARE_CAST)


@triton.jit
def _quantize_joined_kernel(X0, X1, X2, COLUMN_SCALE, CODES, SCALE, n_rows, n0, n1, n2, stride0, stride1, stride2,
                            E4M3_MAX: tl.constexpr, HARDWARE_CAST: tl.constexpr, ROWS: tl.constexpr,
                            BLOCK: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    row_mask = rows < n_rows
    width = n0 + n1 + n2
    amax = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
    amax = _part_amax(X0, COLUMN_SCALE, rows, row_mask, stride0, n0, amax, BLOCK)
    amax = _part_amax(X1, COLUMN_SCALE + n0, rows, row_mask, stride1, n1, amax, BLOCK)
    amax = _part_amax(X2, COLUMN_SCALE + n0 + n1, rows, row_mask, stride2, n2, amax, BLOCK)
    scale = row_scales(amax, E4M3_MAX)
    tl.store(SCALE + rows, scale, mask=row_mask)
    # the second read of each part mostly hits the L2 cache
    _part_store(X0, COLUMN_SCALE, CODES, rows, row_mask, stride0, n0, width, scale, E4M3_MAX, HARDWARE_CAST, BLOCK)
    _part_store(X1, COLUMN_SCALE + n0, CODES + n0, rows, row_mask, stride1, n1, width, scale, E4M3_MAX,
                HARDWARE_CAST, BLOCK)
    _part_store(X2, COLUMN_SCALE + n0 + n1, CODES + n0 + n1, rows, row_mask, stride2, n2, width, scale, E4M3_MAX,
                HARDWARE_CAST, BLOCK)


def quantize_joined_rows(parts: list[torch.Tensor], column_scales: list[torch.Tensor],
                         row_amax: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_rows of the parts' columns side by side, each part times its column scale: (codes (M, sum of
    the widths), scale (M, 1)), one scale per joined row, without the joined rows ever being written in 16
    bits. On a GPU one Triton kernel (each part read twice, the second time mostly from the L2 cache; with
    row_amax, the joined rows' maxima as quantize_rows takes them, once, in tiles), elsewhere torch on the joined
    copy; the same bits as quantize_rows of that copy (which one part is: it may be read once)."""
    if not 1 <= len(parts) <= MAX_JOINED_PARTS or len(column_scales) != len(parts):
        raise ValueError(f"quantize_joined_rows: 1 to {MAX_JOINED_PARTS} parts, each with its column scale; got "
                         f"{len(parts)} parts and {len(column_scales)} scales")
    if len(parts) == 1:
        return quantize_rows(parts[0], column_scales[0], row_amax)
    if not parts[0].is_cuda:
        return quantize_rows_torch(torch.cat(parts, dim=1), torch.cat(column_scales), row_amax)
    return quantize_joined_rows_triton(parts, column_scales, row_amax)


def quantize_joined_rows_triton(parts: list[torch.Tensor], column_scales: list[torch.Tensor],
                                row_amax: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    parts = [p if p.stride(-1) == 1 else p.contiguous() for p in parts]
    rows = parts[0].shape[0]
    widths = [p.shape[1] for p in parts]
    codes = torch.empty((rows, sum(widths)), dtype=torch.uint8, device=parts[0].device)
    scale = torch.empty((rows, 1), dtype=torch.float32, device=parts[0].device)
    if rows and row_amax is not None:
        start = 0
        for i, (part, part_scale) in enumerate(zip(parts, column_scales)):
            _quantize_known(part, part_scale.float().reshape(-1).contiguous(), codes[:, start:start + part.shape[1]],
                            scale, row_amax, write_scale=i == 0)
            start += part.shape[1]
    elif rows:
        column_scale = torch.cat([s.float().reshape(-1) for s in column_scales])
        padded = parts + [parts[0]] * (MAX_JOINED_PARTS - len(parts))  # absent parts: zero columns
        n = widths + [0] * (MAX_JOINED_PARTS - len(parts))
        # a block no wider than the narrowest part (k/v's 1,024 columns beside q's 4,096), several rows to it; long
        # parts (gate's and up's 14,336) in a quarter tile: with the column scale's loads beside each block's, the
        # half tile ran at 1.5 TB/s, this at 1.7 (8B shape, H100, docs/fp8.md)
        block = min(triton.next_power_of_2(min(widths)), QUANTIZE_TILE // 2)
        if block == QUANTIZE_TILE // 2 and min(widths) > block:
            block = QUANTIZE_TILE // 4
        rows_per_program = max(1, QUANTIZE_TILE // 2 // block)
        _quantize_joined_kernel[(triton.cdiv(rows, rows_per_program),)](
            *padded, column_scale, codes, scale, rows, *n, *(p.stride(0) for p in padded),
            E4M3_MAX=E4M3_MAX, HARDWARE_CAST=hardware_e4m3_cast(parts[0].device),
            ROWS=rows_per_program, BLOCK=block, num_warps=8)
    return codes.view(FP8_DTYPE), scale


def quantize_tile(n_cols: int, column_scale: bool = False) -> tuple[int, int]:
    """(rows per program, columns per block) of the Triton quantiser: rows that fit in QUANTIZE_TILE are read
    once, several to a program (k/v-sized gradients: eight of 1,024); a longer row has a program to itself
    and is read in blocks, twice: blocks of a quarter tile when a column scale is loaded beside each (a
    14,336-wide row at 2.1 TB/s against 1.6 in half tiles, H100), of a half tile otherwise (2.4 against 2.2)."""
    block = triton.next_power_of_2(max(n_cols, 1))
    if block <= QUANTIZE_TILE:
        return QUANTIZE_TILE // block, block
    return 1, QUANTIZE_TILE // (4 if column_scale else 2)


def quantize_rows_triton(x: torch.Tensor, column_scale: torch.Tensor | None = None,
                         row_amax: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_rows in one Triton kernel (GPU, or the CPU interpreter in the tests). On a GPU with FP8
    (compute capability 8.9+) the e4m3 rounding is the hardware's conversion, elsewhere `_e4m3_bits`, whose
    ~30 integer operations an element made the kernel compute-bound: both round to nearest even."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    rows, cols = x.shape
    codes = torch.empty((rows, cols), dtype=torch.uint8, device=x.device)
    scale = torch.empty((rows, 1), dtype=torch.float32, device=x.device)
    column_scale = None if column_scale is None else column_scale.float().contiguous()
    if rows and row_amax is not None:
        _quantize_known(x, column_scale, codes, scale, row_amax)
    elif rows:
        rows_per_program, block = quantize_tile(cols, column_scale is not None)
        _quantize_rows_kernel[(triton.cdiv(rows, rows_per_program),)](
            x, column_scale if column_scale is not None else scale, codes, scale, rows, cols, x.stride(0),
            E4M3_MAX=E4M3_MAX, HAS_COLUMN_SCALE=column_scale is not None, HARDWARE_CAST=hardware_e4m3_cast(x.device),
            ROWS=rows_per_program, BLOCK=block, ONE_PASS=block >= cols, num_warps=8)
    return codes.view(FP8_DTYPE), scale


@triton.jit
def _transpose_kernel(X, OUT, n_rows, n_cols, out_row_stride, TILE: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * TILE + tl.arange(0, TILE)
    cols = tl.program_id(1).to(tl.int64) * TILE + tl.arange(0, TILE)
    tile = tl.load(X + rows[:, None] * n_cols + cols[None, :], mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols))
    tl.store(OUT + cols[:, None] * out_row_stride + rows[None, :], tl.trans(tile),
             mask=(cols[:, None] < n_cols) & (rows[None, :] < n_rows))


def transpose_into(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out = x^T, x contiguous 2-D, out with contiguous rows (a column block of a wider matrix too), in
    TRANSPOSE_TILE-square tiles that are read and written a row at a time (the shuffle between the two goes
    through shared memory): torch's strided copy of a transposed byte matrix ran at about a fifteenth of the
    memory's bandwidth."""
    n_rows, n_cols = x.shape
    if (out.shape != (n_cols, n_rows) or not x.is_contiguous() or out.stride(-1) != 1
            or out.stride(0) < n_rows or out.dtype != x.dtype):
        raise ValueError(f"transpose_into: a {x.dtype} ({n_cols}, {n_rows}) out with contiguous rows for x of shape "
                         f"{tuple(x.shape)}, not {out.dtype} {tuple(out.shape)} with strides {out.stride()}")
    if x.numel():
        grid = (triton.cdiv(n_rows, TRANSPOSE_TILE), triton.cdiv(n_cols, TRANSPOSE_TILE))
        _transpose_kernel[grid](x, out, n_rows, n_cols, out.stride(0), TILE=TRANSPOSE_TILE, num_warps=8)
    return out


_UNIT_SCALES: dict[tuple[torch.device, int], torch.Tensor] = {}


def _unit_scale(n: int, device: torch.device) -> torch.Tensor:
    """A (1, n) float32 row of ones, made once per width and device (the input gradient's weight scale is
    on dy's columns instead): not an allocation and a fill kernel at every backward product."""
    key = (device, n)
    if key not in _UNIT_SCALES:
        _UNIT_SCALES[key] = torch.ones(1, n, device=device, dtype=torch.float32)
    return _UNIT_SCALES[key]


def fp8_matmul(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor | None,
               out_dtype: torch.dtype, backend: str, bias: torch.Tensor | None = None,
               fast_accum: bool = False) -> torch.Tensor:
    """(a @ b^T) * a_scale * b_scale (+ bias) in out_dtype.

    a: (M, K) e4m3, row-major; a_scale: (M, 1) float32. b: (N, K) e4m3, row-major (so b.t() is the
    column-major operand cuBLAS' FP8 GEMM wants); b_scale: (N,) float32, or None for no scale; bias: (N,)
    or None, added to the scaled float32 sums before the one rounding (on the tensor cores in the GEMM's
    epilogue, in bf16). backend: fp8_backend(device). On the tensor cores the result is rounded to bf16
    (the row-wise-scaled GEMM's only output) and then cast to out_dtype. fast_accum: the tensor cores'
    fast accumulation (partial sums kept in the MMA's own narrower accumulator instead of being moved into
    float32 every few K-blocks: 10-16% faster GEMMs, a few times the rounding of the sums, docs/fp8.md); the
    emulation's sums are float32 either way."""
    if backend == "scaled_mm":
        n = b.shape[0]
        scale_b = _unit_scale(n, b.device) if b_scale is None else b_scale.view(1, n)
        out = torch._scaled_mm(a, b.t(), scale_a=a_scale, scale_b=scale_b, out_dtype=torch.bfloat16,
                               bias=None if bias is None else bias.to(torch.bfloat16), use_fast_accum=fast_accum)
        return out if out_dtype == torch.bfloat16 else out.to(out_dtype)
    out = (a.float() @ b.float().t()).mul_(a_scale)
    if b_scale is not None:
        out.mul_(b_scale)
    if bias is not None:
        out.add_(bias)
    return out.to(out_dtype)
