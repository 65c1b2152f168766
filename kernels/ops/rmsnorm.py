"""RMSNorm: y = x * rsqrt(mean(x^2) + eps) * (offset + weight), a row (or several short rows) per program.

Two numerics, both those of Hugging Face:
- cast_before_weight=True (Llama, Mistral, Qwen): normalise in float32, round the normalised value
  to x's dtype, then multiply by the weight (output dtype: promote(x.dtype, weight.dtype)).
- cast_before_weight=False (Gemma, offset=1.0): everything in float32, including (1 + w.float()),
  one rounding to x's dtype at the end.
The weight term is always (offset + weight.float()) in float32; with offset=0 that is weight itself.

With codes_to, the forward also quantises its output as `fp8_matmul.quantize_rows` would (the same bits: per-row
e4m3 codes and float32 scales of the rounded output), in the same pass, for the FP8 products that read it.
"""
import torch
import triton
import triton.language as tl

from ._utils import MAX_FUSED_SIZE, new_output, num_warps_for, program_count
from .fp8_matmul import E4M3_MAX, FP8_DTYPE, hardware_e4m3_cast, row_scales, store_codes


@triton.jit
def _rms_norm_fwd_kernel(
    X, Y, W, RSTD, CODES, SCALE,
    stride_x, stride_y,
    n_rows, n_cols, eps, offset,
    CAST_BEFORE_WEIGHT: tl.constexpr,
    QUANTIZE: tl.constexpr,
    HARDWARE_CAST: tl.constexpr,
    E4M3_MAX: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_SIZE)
    row_mask = rows < n_rows
    mask = row_mask[:, None] & (cols < n_cols)[None, :]

    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps)
    tl.store(RSTD + rows, rstd, mask=row_mask)

    normed = x * rstd[:, None]
    if CAST_BEFORE_WEIGHT:
        normed = normed.to(X.dtype.element_ty).to(tl.float32)
    w = tl.load(W + cols, mask=cols < n_cols, other=0.0).to(tl.float32) + offset
    y = (normed * w[None, :]).to(Y.dtype.element_ty)
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], y, mask=mask)
    if QUANTIZE:  # quantize_rows of the rounded output: each row's largest magnitude maps to E4M3_MAX
        v = y.to(tl.float32)
        scale = row_scales(tl.abs(v), E4M3_MAX)
        tl.store(SCALE + rows, scale, mask=row_mask)
        store_codes(CODES, rows, cols, mask, v, scale, n_cols, E4M3_MAX, HARDWARE_CAST)


@triton.jit
def _rms_norm_bwd_kernel(
    DY, X, W, RSTD, DX, DW_PARTIAL, DPASSED,
    stride_dy, stride_x, stride_dx, stride_dpassed,
    n_rows, n_cols, offset, rows_per_program,
    CAST_BEFORE_WEIGHT: tl.constexpr,
    COMPUTE_DW: tl.constexpr,
    ADD_DPASSED: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    # dx = rstd * (dn - n * mean(dn * n)) with n = x * rstd and dn = dy * (offset + w); with ADD_DPASSED, plus the
    # gradient of x's other use (pass_input).
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    col_mask = cols < n_cols
    w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32) + offset
    dw_acc = tl.zeros((BLOCK_ROWS, BLOCK_SIZE), dtype=tl.float32)

    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, n_rows)
    for first in range(row_start, row_end, BLOCK_ROWS):
        rows = first + tl.arange(0, BLOCK_ROWS)
        row_mask = rows < row_end
        mask = row_mask[:, None] & col_mask[None, :]
        x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)[:, None]
        normed = x * rstd
        dnormed = dy * w[None, :]
        if CAST_BEFORE_WEIGHT:
            # Hugging Face's autograd rounds the gradient of the rounded normalised value to x's dtype.
            dnormed = dnormed.to(X.dtype.element_ty).to(tl.float32)
        dx = rstd * (dnormed - normed * (tl.sum(dnormed * normed, axis=1) / n_cols)[:, None])
        if ADD_DPASSED:
            dx += tl.load(DPASSED + rows[:, None] * stride_dpassed + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        if COMPUTE_DW:
            if CAST_BEFORE_WEIGHT:
                normed = normed.to(X.dtype.element_ty).to(tl.float32)
            dw_acc += dy * normed

    if COMPUTE_DW:
        tl.store(DW_PARTIAL + pid * n_cols + cols, tl.sum(dw_acc, axis=0), mask=col_mask)


# Elements a program holds when rows are short: per-head norms (Qwen3's and Gemma 3's q/k norms, 128 wide)
# one row per program would launch hundreds of thousands of programs that each move 256 bytes.
_ROWS_BLOCK_ELEMENTS = 4096


def _blocks(n_cols, element_size):
    """(BLOCK_ROWS, BLOCK_SIZE, num_warps): a row per BLOCK_SIZE, several rows per program when rows are short."""
    block = triton.next_power_of_2(n_cols)
    if block * element_size > MAX_FUSED_SIZE:
        raise ValueError(f"rms_norm: hidden size {n_cols} is too large for one program per row")
    rows = max(1, _ROWS_BLOCK_ELEMENTS // block)
    return rows, block, num_warps_for(rows * block)


def _as_rows(t, n_cols):
    t = t.reshape(-1, n_cols)
    return t if t.stride(-1) == 1 else t.contiguous()


def _rms_norm_forward(x, weight, eps, offset, cast_before_weight, quantize=False):
    """(y, x's rows, rstd, (codes, scale) of y's rows when quantize, else None)."""
    n_cols = x.shape[-1]
    x2d = _as_rows(x, n_cols)
    n_rows = x2d.shape[0]
    out_dtype = torch.promote_types(x.dtype, weight.dtype) if cast_before_weight else x.dtype
    # Allocated in x's shape and returned as it is, not as a view of a 2D buffer: an output that is a view
    # cannot be modified in place (Mixtral's router jitter multiplies the normed hidden states in place).
    y = new_output(x.shape, out_dtype, x.device)
    y2d = y.view(n_rows, n_cols)
    rstd = new_output((n_rows,), torch.float32, x.device)
    quantised = None
    if quantize:
        quantised = (torch.empty((n_rows, n_cols), dtype=torch.uint8, device=x.device),
                     torch.empty((n_rows, 1), dtype=torch.float32, device=x.device))
    if n_rows > 0:
        block_rows, block, num_warps = _blocks(n_cols, x.element_size())
        codes, scale = quantised or (y2d, rstd)  # stand-ins for the pointers a plain norm never reads
        _rms_norm_fwd_kernel[(triton.cdiv(n_rows, block_rows),)](
            x2d, y2d, weight, rstd, codes, scale,
            x2d.stride(0), y2d.stride(0),
            n_rows, n_cols, eps, offset,
            CAST_BEFORE_WEIGHT=cast_before_weight,
            QUANTIZE=quantize,
            HARDWARE_CAST=quantize and hardware_e4m3_cast(x.device),
            E4M3_MAX=E4M3_MAX,
            BLOCK_ROWS=block_rows,
            BLOCK_SIZE=block,
            num_warps=num_warps,
        )
    if quantised is not None:
        quantised = (quantised[0].view(FP8_DTYPE), quantised[1])
    return y, x2d, rstd, quantised


def _rms_norm_backward(dy, x2d, weight, rstd, offset, cast_before_weight, compute_dw, dpassed=None):
    n_rows, n_cols = x2d.shape
    dy2d = _as_rows(dy, n_cols)
    dpassed2d = dy2d if dpassed is None else _as_rows(dpassed, n_cols)  # (dy stands in for an absent one)
    dx = new_output((n_rows, n_cols), x2d.dtype, x2d.device)
    block_rows, block, num_warps = _blocks(n_cols, x2d.element_size())
    if compute_dw:
        n_programs = max(1, min(n_rows, program_count(x2d.device)))
        rows_per_program = triton.cdiv(n_rows, n_programs)
        dw_partial = new_output((n_programs, n_cols), torch.float32, x2d.device)
    else:  # dx stands in for the unused partials' pointer
        n_programs, rows_per_program, dw_partial = triton.cdiv(n_rows, block_rows), block_rows, dx
    if n_rows > 0:
        _rms_norm_bwd_kernel[(n_programs,)](
            dy2d, x2d, weight, rstd, dx, dw_partial, dpassed2d,
            dy2d.stride(0), x2d.stride(0), dx.stride(0), dpassed2d.stride(0),
            n_rows, n_cols, offset, rows_per_program,
            CAST_BEFORE_WEIGHT=cast_before_weight,
            COMPUTE_DW=compute_dw,
            ADD_DPASSED=dpassed is not None,
            BLOCK_ROWS=block_rows,
            BLOCK_SIZE=block,
            num_warps=num_warps,
        )
    dw = None
    if compute_dw:
        dw = dw_partial.sum(0).to(weight.dtype) if n_rows > 0 else torch.zeros_like(weight)
    return dx, dw


class RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, offset, cast_before_weight, codes_to, pass_input=False):
        y, x2d, rstd, quantised = _rms_norm_forward(x, weight, eps, offset, cast_before_weight, codes_to is not None)
        if quantised is not None:
            codes_to(y, y.view(-1, y.shape[-1]), *quantised)
        ctx.save_for_backward(x2d, weight, rstd)
        ctx.offset = offset
        ctx.cast_before_weight = cast_before_weight
        ctx.x_shape = x.shape
        return (y, x.view_as(x)) if pass_input else y

    @staticmethod
    def backward(ctx, dy, dpassed=None):
        x2d, weight, rstd = ctx.saved_tensors
        if dy is None:  # only the passed view was used
            return dpassed, None, None, None, None, None, None
        dx, dw = _rms_norm_backward(
            dy, x2d, weight, rstd, ctx.offset, ctx.cast_before_weight, compute_dw=ctx.needs_input_grad[1],
            dpassed=dpassed,
        )
        return dx.view(ctx.x_shape), dw, None, None, None, None, None


def rms_norm(x, weight, eps, offset=0.0, cast_before_weight=True, codes_to=None, pass_input=False):
    """RMSNorm over the last dimension of x (any leading shape); see the module docstring for numerics.

    Saves x and one float32 inverse RMS per row for backward. The weight gradient is computed only
    when weight.requires_grad (frozen in LoRA: no dW work and no extra memory). codes_to: called with
    (y, y's rows, their e4m3 codes, their scales (rows, 1)) after the forward made them (see above).
    pass_input: returns (y, a view of x) instead, for x's other use (a decoder layer's residual add): the
    backward adds that view's gradient into x's in its own pass, instead of autograd adding the two after it.
    """
    if weight.shape != x.shape[-1:]:
        raise ValueError(f"rms_norm: weight shape {tuple(weight.shape)} does not match hidden size {x.shape[-1]}")
    return RMSNormFunction.apply(x, weight, float(eps), float(offset), bool(cast_before_weight), codes_to,
                                 bool(pass_input))
