"""RMSNorm: y = x * rsqrt(mean(x^2) + eps) * (offset + weight), one program per row.

Two numerics, both those of Hugging Face:
- cast_before_weight=True (Llama, Mistral, Qwen): normalise in float32, round the normalised value
  to x's dtype, then multiply by the weight (output dtype: promote(x.dtype, weight.dtype)).
- cast_before_weight=False (Gemma, offset=1.0): everything in float32, including (1 + w.float()),
  one rounding to x's dtype at the end.
The weight term is always (offset + weight.float()) in float32; with offset=0 that is weight itself.
"""
import torch
import triton
import triton.language as tl

from ._utils import MAX_FUSED_SIZE, new_output, num_warps_for, program_count


@triton.jit
def _rms_norm_fwd_kernel(
    X, Y, W, RSTD,
    stride_x, stride_y,
    n_cols, eps, offset,
    CAST_BEFORE_WEIGHT: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols

    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    tl.store(RSTD + row, rstd)

    normed = x * rstd
    if CAST_BEFORE_WEIGHT:
        normed = normed.to(X.dtype.element_ty).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32) + offset
    tl.store(Y + row * stride_y + cols, (normed * w).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _rms_norm_bwd_kernel(
    DY, X, W, RSTD, DX, DW_PARTIAL,
    stride_dy, stride_x, stride_dx,
    n_rows, n_cols, offset, rows_per_program,
    CAST_BEFORE_WEIGHT: tl.constexpr,
    COMPUTE_DW: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    # dx = rstd * (dn - n * mean(dn * n)) with n = x * rstd and dn = dy * (offset + w).
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32) + offset
    dw_acc = tl.zeros((BLOCK_SIZE,), dtype=tl.float32)

    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, n_rows)
    for row in range(row_start, row_end):
        x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + row)
        normed = x * rstd
        dnormed = dy * w
        if CAST_BEFORE_WEIGHT:
            # Hugging Face's autograd rounds the gradient of the rounded normalised value to x's dtype.
            dnormed = dnormed.to(X.dtype.element_ty).to(tl.float32)
        dx = rstd * (dnormed - normed * (tl.sum(dnormed * normed, axis=0) / n_cols))
        tl.store(DX + row * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
        if COMPUTE_DW:
            if CAST_BEFORE_WEIGHT:
                normed = normed.to(X.dtype.element_ty).to(tl.float32)
            dw_acc += dy * normed

    if COMPUTE_DW:
        tl.store(DW_PARTIAL + pid * n_cols + cols, dw_acc, mask=mask)


def _block_size(n_cols, element_size):
    block = triton.next_power_of_2(n_cols)
    if block * element_size > MAX_FUSED_SIZE:
        raise ValueError(f"rms_norm: hidden size {n_cols} is too large for one program per row")
    return block


def _as_rows(t, n_cols):
    t = t.reshape(-1, n_cols)
    return t if t.stride(-1) == 1 else t.contiguous()


def _rms_norm_forward(x, weight, eps, offset, cast_before_weight):
    n_cols = x.shape[-1]
    x2d = _as_rows(x, n_cols)
    n_rows = x2d.shape[0]
    out_dtype = torch.promote_types(x.dtype, weight.dtype) if cast_before_weight else x.dtype
    y = new_output((n_rows, n_cols), out_dtype, x.device)
    rstd = new_output((n_rows,), torch.float32, x.device)
    if n_rows > 0:
        block = _block_size(n_cols, x.element_size())
        _rms_norm_fwd_kernel[(n_rows,)](
            x2d, y, weight, rstd,
            x2d.stride(0), y.stride(0),
            n_cols, eps, offset,
            CAST_BEFORE_WEIGHT=cast_before_weight,
            BLOCK_SIZE=block,
            num_warps=num_warps_for(block),
        )
    return y.view(x.shape), x2d, rstd


def _rms_norm_backward(dy, x2d, weight, rstd, offset, cast_before_weight, compute_dw):
    n_rows, n_cols = x2d.shape
    dy2d = _as_rows(dy, n_cols)
    dx = new_output((n_rows, n_cols), x2d.dtype, x2d.device)
    if compute_dw:
        n_programs = max(1, min(n_rows, program_count(x2d.device)))
        rows_per_program = triton.cdiv(n_rows, n_programs)
        dw_partial = new_output((n_programs, n_cols), torch.float32, x2d.device)
    else:
        n_programs, rows_per_program, dw_partial = n_rows, 1, dx  # dx stands in for an unused pointer
    if n_rows > 0:
        block = _block_size(n_cols, x2d.element_size())
        _rms_norm_bwd_kernel[(n_programs,)](
            dy2d, x2d, weight, rstd, dx, dw_partial,
            dy2d.stride(0), x2d.stride(0), dx.stride(0),
            n_rows, n_cols, offset, rows_per_program,
            CAST_BEFORE_WEIGHT=cast_before_weight,
            COMPUTE_DW=compute_dw,
            BLOCK_SIZE=block,
            num_warps=num_warps_for(block),
        )
    dw = None
    if compute_dw:
        dw = dw_partial.sum(0).to(weight.dtype) if n_rows > 0 else torch.zeros_like(weight)
    return dx, dw


class RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, offset, cast_before_weight):
        y, x2d, rstd = _rms_norm_forward(x, weight, eps, offset, cast_before_weight)
        ctx.save_for_backward(x2d, weight, rstd)
        ctx.offset = offset
        ctx.cast_before_weight = cast_before_weight
        ctx.x_shape = x.shape
        return y

    @staticmethod
    def backward(ctx, dy):
        x2d, weight, rstd = ctx.saved_tensors
        dx, dw = _rms_norm_backward(
            dy, x2d, weight, rstd, ctx.offset, ctx.cast_before_weight, compute_dw=ctx.needs_input_grad[1]
        )
        return dx.view(ctx.x_shape), dw, None, None, None


def rms_norm(x, weight, eps, offset=0.0, cast_before_weight=True):
    """RMSNorm over the last dimension of x (any leading shape); see the module docstring for numerics.

    Saves x and one float32 inverse RMS per row for backward. The weight gradient is computed only
    when weight.requires_grad (frozen in LoRA: no dW work and no extra memory).
    """
    if weight.shape != x.shape[-1:]:
        raise ValueError(f"rms_norm: weight shape {tuple(weight.shape)} does not match hidden size {x.shape[-1]}")
    return RMSNormFunction.apply(x, weight, float(eps), float(offset), bool(cast_before_weight))
