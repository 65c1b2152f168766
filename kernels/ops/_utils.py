"""Helpers shared by the kernels in this package (launch settings, output allocation, tanh, dots)."""
import math

import torch
import triton
import triton.language as tl

# Tests set this to True: every output buffer a wrapper allocates is then filled with NaN first,
# so an element that a kernel forgets to write shows up as a NaN instead of stale memory.
POISON_OUTPUTS = False

# One program holds at most this many elements of a row in registers.
MAX_FUSED_SIZE = 65536

# A rank-r dot takes the rank this many at a time: a job's rank goes up to 1,024, whose whole tiles would
# not fit a program's registers and shared memory. Tests may shrink it (16 at least, tl.dot's).
RANK_CHUNK = 64


def new_output(shape, dtype, device):
    out = torch.empty(shape, dtype=dtype, device=device)
    if POISON_OUTPUTS:
        out.fill_(math.nan)
    return out


def num_warps_for(block_size):
    if block_size >= 32768:
        return 32
    if block_size >= 8192:
        return 16
    if block_size >= 2048:
        return 8
    return 4


def program_count(device):
    """Persistent-style grid size: one program per SM on a GPU, a few under the CPU interpreter."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def has_internal_overlap(t):
    """True when two elements of t share memory (e.g. an expanded tensor), so it cannot be written in place."""
    dims = sorted((s, n) for s, n in zip(t.stride(), t.shape) if n > 1)
    extent = 1
    for stride, size in dims:
        if stride < extent:
            return True
        extent = stride * size
    return False


@triton.jit
def tanh(x):
    # tl.math has no tanh in triton 3.6 and libdevice is not available under the interpreter.
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def tile_dot(a, b, acc, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    # UPCAST: Triton's CPU interpreter (3.9) computes bfloat16 dots wrongly; float32 operands give the
    # same products (a bf16 x bf16 product is exact in float32) and float32 accumulation, as the GPU.
    if UPCAST:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        out = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    return out


@triton.jit
def plus_rank_r(value, TARGET, LEFT, RIGHT, rows, cols, row_mask, col_mask, rank, stride_left, stride_right_j,
                 stride_right_col, HAS_TERM: tl.constexpr, R: tl.constexpr, DOT_PRECISION: tl.constexpr,
                 UPCAST: tl.constexpr):
    # value (a float32 tile of TARGET) + left[rows] @ right[:, cols], rounded once to TARGET's dtype as an addmm_
    # onto it would be; left (rows, rank), right (rank, cols) with any strides, R of the rank at a time (a rank of
    # 1,024 whole would not fit the shared memory). Unchanged without HAS_TERM.
    if HAS_TERM:
        for start in range(0, rank, R):
            j = start + tl.arange(0, R)
            left = tl.load(LEFT + rows[:, None] * stride_left + j[None, :],
                           mask=row_mask[:, None] & (j[None, :] < rank), other=0.0)
            right = tl.load(RIGHT + j[:, None] * stride_right_j + cols[None, :] * stride_right_col,
                            mask=(j[:, None] < rank) & col_mask[None, :], other=0.0)
            value = tile_dot(left, right, value, DOT_PRECISION, UPCAST)
        value = value.to(TARGET.dtype.element_ty).to(tl.float32)
    return value


def rank_block(rank: int) -> int:
    """The rank dim of a rank-r dot's tile: tl.dot needs 16 at least, and a large rank goes RANK_CHUNK at a time."""
    return min(RANK_CHUNK, max(16, triton.next_power_of_2(rank)))


def dot_precision(dtype: torch.dtype) -> str:
    # float32 inputs: exact products (as torch's float32 matmul without TF32); others ignore it.
    return "ieee" if dtype == torch.float32 else "tf32"
