"""NF4 dequantisation: packed 4-bit codes (bitsandbytes' layout) to a dense 16/32-bit weight.

Storage, as bitsandbytes writes it: the row-major flattened weight in blocks of `blocksize`
elements, two codes per byte (element 2i in the high nibble, 2i+1 in the low), one absmax per
block. With double quantisation ("nested") the absmax itself is stored as 8-bit codes into a
256-entry dynamic map, in blocks of 256 with their own float32 absmax, plus one float32 offset:

    absmax[b] = nested_code[absmax_q[b]] * nested_absmax[b // 256] + offset
    w[i]      = nf4_code[nibble(i)] * absmax[i // blocksize]

Both levels run in one kernel, in float32, each product and the sum rounded once (fused
multiply-add is switched off) exactly as bitsandbytes' separate dequantisations round them, then
one rounding (to nearest even) to the output dtype.
"""
import torch
import triton
import triton.language as tl

from ._utils import new_output

BLOCK_SIZE = 1024
# Under the CPU interpreter each program costs ~20 ms of Python whatever its size: few, large ones.
INTERPRETER_BLOCK_SIZE = 1 << 16
NESTED_BLOCKSIZE = 256


@triton.jit
def _dequantize_nf4_kernel(
    PACKED, ABSMAX, CODE, NESTED_ABSMAX, NESTED_CODE, OUT, NEEDED,
    n_elements, offset, part_elements,
    BLOCKSIZE: tl.constexpr,
    HAS_NEEDED: tl.constexpr,
    NESTED: tl.constexpr,
    NESTED_BLOCKSIZE: tl.constexpr,
    ROUND_TO_BF16: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    start = tl.program_id(0).to(tl.int64) * BLOCK_SIZE
    idx = start + tl.arange(0, BLOCK_SIZE)
    mask = idx < n_elements
    if HAS_NEEDED:  # only the parts (experts) asked for: the others' elements are neither read nor written
        mask &= tl.load(NEEDED + idx // part_elements, mask=mask, other=0) != 0

    byte = tl.load(PACKED + idx // 2, mask=mask, other=0).to(tl.int32)
    nibble = tl.where(idx % 2 == 0, byte >> 4, byte & 0xF)
    value = tl.load(CODE + nibble, mask=mask, other=0.0)

    block = idx // BLOCKSIZE
    if NESTED:
        absmax_q = tl.load(ABSMAX + block, mask=mask, other=0).to(tl.int32)
        nested_scale = tl.load(NESTED_ABSMAX + block // NESTED_BLOCKSIZE, mask=mask, other=0.0)
        absmax = tl.load(NESTED_CODE + absmax_q, mask=mask, other=0.0) * nested_scale + offset
    else:
        absmax = tl.load(ABSMAX + block, mask=mask, other=0.0)
    weight = value * absmax
    if ROUND_TO_BF16:
        # Round to nearest even by hand (OUT is the bf16 output viewed as int16): the interpreter's
        # float32 -> bfloat16 cast truncates, and this is the GPU's cvt.rn in a few integer ops.
        bits = weight.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        tl.store(OUT + idx, (bits >> 16).to(tl.int16), mask=mask)
    else:
        tl.store(OUT + idx, weight.to(OUT.dtype.element_ty), mask=mask)


def dequantize_nf4(
    packed: torch.Tensor,
    absmax: torch.Tensor,
    code: torch.Tensor,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    blocksize: int = 64,
    nested_absmax: torch.Tensor | None = None,
    nested_code: torch.Tensor | None = None,
    offset: float = 0.0,
    out: torch.Tensor | None = None,
    needed: torch.Tensor | None = None,
) -> torch.Tensor:
    """The dense weight of `shape` in `dtype`, written into `out` when given (contiguous, right size).

    packed: uint8 codes, two per byte; absmax: float32 per block, or uint8 codes when nested_absmax
    (float32, one per 256 blocks) and nested_code (float32, 256 entries) are given; code: the 16
    float32 NF4 values. needed: a bool per slice of the first dimension (a stack's experts); only the true
    ones are written, the others' elements in `out` are left as they were.
    """
    n = 1
    for size in shape:
        n *= size
    if packed.numel() * 2 < n:
        raise ValueError(f"{packed.numel()} packed bytes hold fewer than the {n} elements of shape {tuple(shape)}")
    nested = nested_absmax is not None
    if nested != (nested_code is not None):
        raise ValueError("nested_absmax and nested_code go together")
    if out is None:
        out = new_output(shape, dtype, packed.device)
    elif out.numel() != n or not out.is_contiguous() or out.dtype != dtype:
        raise ValueError(f"out must be a contiguous {dtype} tensor of {n} elements")
    if needed is not None and needed.shape != (shape[0],):
        raise ValueError(f"needed must hold one flag per slice of the first dimension ({shape[0]})")
    block = BLOCK_SIZE if packed.is_cuda else min(triton.next_power_of_2(n), INTERPRETER_BLOCK_SIZE)
    _dequantize_nf4_kernel[(triton.cdiv(n, block),)](
        packed, absmax, code,
        nested_absmax if nested else absmax, nested_code if nested else code,
        out.view(torch.int16) if dtype == torch.bfloat16 else out, needed if needed is not None else packed,
        n, float(offset), n // shape[0] if shape else n,
        BLOCKSIZE=blocksize, HAS_NEEDED=needed is not None, NESTED=nested, NESTED_BLOCKSIZE=NESTED_BLOCKSIZE,
        ROUND_TO_BF16=dtype == torch.bfloat16, BLOCK_SIZE=block,
        enable_fp_fusion=False,
    )
    return out.view(shape)
