"""Gated linear units: swiglu = silu(gate) * up, geglu = gelu(gate) * up, and gpt-oss's clamped SwiGLU.

Numerics of Hugging Face's `act_fn(gate_proj(x)) * up_proj(x)`: the activation is computed in
float32 and rounded to the input dtype, then multiplied by up in float32 and rounded again (what
torch does for two bf16 tensors). Only gate and up are saved; backward recomputes the activation
and writes d_gate and d_up over the saved gate and up buffers, so it allocates nothing.
`glu_backward_in_place` is that backward without autograd, also giving back the recomputed output
(over the incoming gradient), for the LoRA MLP, which needs it for the down projection's gradients.
Gate and up may be strided views of one projection's output: its two halves (gate first), or its
even and odd columns (gpt-oss interleaves them).

`glu_rank_r` and `glu_backward_in_place`'s rank-r terms serve LoRA over a base whose GEMM cannot accumulate
onto an output (FP8's row-wise scaled GEMM): gate and up arrive without their rank-r terms `xa @ B^T`, which the
kernel adds tile by tile (a rank-r dot per tile) instead of an `addmm_` pass over each (rows, intermediate)
output; backward adds them again, and the down projection's rank-r term onto the incoming gradient. The sums
are rounded once to the dtype, as the `addmm_` they replace rounded them.
"""
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ._utils import dot_precision, new_output, num_warps_for, plus_rank_r, rank_block, tanh

_SILU, _GELU, _GELU_TANH, _CLAMPED_SWIGLU = 0, 1, 2, 3
_MAX_BLOCK = 4096
# Tiles (rows, columns, warps) of the kernel with rank-r terms (a dot needs 16 rows at least), forward and
# backward: the fastest of benchmarks/glu_tiles.py's sweep at the 8B MLP on an H100 (thirty-fourth round: forward
# 0.311 ms, backward 0.654 ms, against 0.354 and 0.720 with the 32 x 128, 8-warp tile both used before).
_RANK_R_TILES = {"forward": (32, 128, 4), "backward": (32, 256, 4)}


@dataclass(frozen=True)
class ClampedSwiGLU:
    """gpt-oss's GLU: (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), with g = min(gate, limit)
    (GptOssExperts._apply_gate; swiglu_alpha and swiglu_limit in its config)."""

    alpha: float
    limit: float


@triton.jit
def _activation_and_derivative(g, ACTIVATION: tl.constexpr, alpha, limit):
    # act(g) and d act / d g (zero where a clamp cut g off)
    if ACTIVATION == 0:
        sig = tl.sigmoid(g)
        act = g * sig
        dact = sig * (1.0 + g * (1.0 - sig))
    elif ACTIVATION == 1:
        cdf = 0.5 * (1.0 + tl.math.erf(g * 0.7071067811865476))
        act = g * cdf
        dact = cdf + g * tl.exp(-0.5 * g * g) * 0.3989422804014327
    elif ACTIVATION == 2:
        inner = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        t = tanh(inner)
        act = 0.5 * g * (1.0 + t)
        dact = 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * g * g)
    else:
        clamped = tl.minimum(g, limit)
        sig = tl.sigmoid(alpha * clamped)
        act = clamped * sig
        dact = tl.where(g <= limit, sig * (1.0 + alpha * clamped * (1.0 - sig)), 0.0)
    return act, dact


@triton.jit
def _up_and_derivative(u, ACTIVATION: tl.constexpr, limit):
    # The factor the activation multiplies, and its derivative in u: u itself, or gpt-oss's clamp(u) + 1.
    # (one return of one type: Triton 3.6 refuses a scalar derivative in one constexpr branch, a tensor in the other)
    if ACTIVATION == 3:
        up = tl.minimum(tl.maximum(u, -limit), limit) + 1.0
        dup = tl.where((u >= -limit) & (u <= limit), 1.0, 0.0)
    else:
        up = u
        dup = tl.full(u.shape, 1.0, tl.float32)
    return up, dup


@triton.jit
def _glu_fwd_kernel(
    GATE, UP, OUT,
    stride_gate, stride_gate_col, stride_up, stride_up_col, stride_out,
    n_cols, alpha, limit,
    ACTIVATION: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    g = tl.load(GATE + row * stride_gate + cols * stride_gate_col, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(UP + row * stride_up + cols * stride_up_col, mask=mask, other=0.0).to(tl.float32)
    act, _ = _activation_and_derivative(g, ACTIVATION, alpha, limit)
    up, _ = _up_and_derivative(u, ACTIVATION, limit)
    act = act.to(OUT.dtype.element_ty).to(tl.float32)
    up = up.to(OUT.dtype.element_ty).to(tl.float32)
    tl.store(OUT + row * stride_out + cols, (act * up).to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _glu_bwd_kernel(
    DOUT, GATE, UP,
    stride_dout, stride_gate, stride_gate_col, stride_up, stride_up_col,
    n_cols, alpha, limit,
    ACTIVATION: tl.constexpr,
    WRITE_OUT: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    # d_up = dout * act(gate) * up'; d_gate = dout * up * act'(gate); written over gate and up. WRITE_OUT:
    # the forward's output act(gate) * up is written over dout (each element is read before).
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    gate_ptrs = GATE + row * stride_gate + cols * stride_gate_col
    up_ptrs = UP + row * stride_up + cols * stride_up_col
    dout = tl.load(DOUT + row * stride_dout + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(gate_ptrs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptrs, mask=mask, other=0.0).to(tl.float32)
    act, dact = _activation_and_derivative(g, ACTIVATION, alpha, limit)
    up, dup = _up_and_derivative(u, ACTIVATION, limit)
    # The forward's rounded activation, and HF autograd's rounding of d(act) to the input dtype.
    act = act.to(GATE.dtype.element_ty).to(tl.float32)
    up = up.to(GATE.dtype.element_ty).to(tl.float32)
    dact_out = (dout * up).to(GATE.dtype.element_ty).to(tl.float32)
    tl.store(gate_ptrs, (dact_out * dact).to(GATE.dtype.element_ty), mask=mask)
    tl.store(up_ptrs, (dout * act * dup).to(UP.dtype.element_ty), mask=mask)
    if WRITE_OUT:
        tl.store(DOUT + row * stride_dout + cols, (act * up).to(DOUT.dtype.element_ty), mask=mask)


@triton.jit
def _glu_rank_r_kernel(
    DOUT, GATE, UP, OUT,
    GATE_LEFT, GATE_RIGHT, UP_LEFT, UP_RIGHT, DOUT_LEFT, DOUT_RIGHT,
    n_rows, n_cols, stride_dout, stride_gate, stride_gate_col, stride_up, stride_up_col, stride_out,
    gate_rank, stride_gate_left, stride_gate_right_j, stride_gate_right_col,
    up_rank, stride_up_left, stride_up_right_j, stride_up_right_col,
    dout_rank, stride_dout_left, stride_dout_right_j, stride_dout_right_col,
    ROW_AMAX, GATE_COLUMN_SCALE, UP_COLUMN_SCALE, stride_amax,
    alpha, limit,
    ACTIVATION: tl.constexpr, BACKWARD: tl.constexpr,
    GATE_TERM: tl.constexpr, UP_TERM: tl.constexpr, DOUT_TERM: tl.constexpr, R: tl.constexpr, AMAX: tl.constexpr,
    DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # Forward: OUT = act(g) * u. BACKWARD: as _glu_bwd_kernel with WRITE_OUT, d = DOUT (+ its term). g = GATE + its
    # rank-r term, u = UP + its term, each rounded once to the dtype. AMAX (backward): each row's largest magnitude
    # of d_gate * GATE_COLUMN_SCALE and d_up * UP_COLUMN_SCALE (as rounded and stored) in the tile goes to
    # ROW_AMAX[row, tile column], for the FP8 quantiser of gate's and up's joined input gradient.
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask, col_mask = rows < n_rows, cols < n_cols
    mask = row_mask[:, None] & col_mask[None, :]
    gate_ptrs = GATE + rows[:, None] * stride_gate + cols[None, :] * stride_gate_col
    up_ptrs = UP + rows[:, None] * stride_up + cols[None, :] * stride_up_col
    g = plus_rank_r(tl.load(gate_ptrs, mask=mask, other=0.0).to(tl.float32), GATE, GATE_LEFT, GATE_RIGHT, rows,
                     cols, row_mask, col_mask, gate_rank, stride_gate_left, stride_gate_right_j,
                     stride_gate_right_col, GATE_TERM, R, DOT_PRECISION, UPCAST)
    u = plus_rank_r(tl.load(up_ptrs, mask=mask, other=0.0).to(tl.float32), UP, UP_LEFT, UP_RIGHT, rows, cols,
                     row_mask, col_mask, up_rank, stride_up_left, stride_up_right_j, stride_up_right_col,
                     UP_TERM, R, DOT_PRECISION, UPCAST)
    act, dact = _activation_and_derivative(g, ACTIVATION, alpha, limit)
    up, dup = _up_and_derivative(u, ACTIVATION, limit)
    act = act.to(GATE.dtype.element_ty).to(tl.float32)
    up = up.to(GATE.dtype.element_ty).to(tl.float32)
    if BACKWARD:
        dout_ptrs = DOUT + rows[:, None] * stride_dout + cols[None, :]
        dout = plus_rank_r(tl.load(dout_ptrs, mask=mask, other=0.0).to(tl.float32), DOUT, DOUT_LEFT, DOUT_RIGHT,
                            rows, cols, row_mask, col_mask, dout_rank, stride_dout_left, stride_dout_right_j,
                            stride_dout_right_col, DOUT_TERM, R, DOT_PRECISION, UPCAST)
        dact_out = (dout * up).to(GATE.dtype.element_ty).to(tl.float32)
        d_gate = (dact_out * dact).to(GATE.dtype.element_ty)
        d_up = (dout * act * dup).to(UP.dtype.element_ty)
        tl.store(gate_ptrs, d_gate, mask=mask)
        if AMAX:  # each maximum taken right after its store: the tile's values live no longer than without
            gate_scale = tl.load(GATE_COLUMN_SCALE + cols, mask=col_mask, other=0.0)
            amax = tl.max(tl.abs(d_gate.to(tl.float32) * gate_scale[None, :]), axis=1)
        tl.store(up_ptrs, d_up, mask=mask)
        if AMAX:
            up_scale = tl.load(UP_COLUMN_SCALE + cols, mask=col_mask, other=0.0)
            amax = tl.maximum(amax, tl.max(tl.abs(d_up.to(tl.float32) * up_scale[None, :]), axis=1))
            tl.store(ROW_AMAX + rows * stride_amax + tl.program_id(1), amax, mask=row_mask)
        tl.store(dout_ptrs, (act * up).to(DOUT.dtype.element_ty), mask=mask)
    else:
        tl.store(OUT + rows[:, None] * stride_out + cols[None, :], (act * up).to(OUT.dtype.element_ty), mask=mask)


def _as_rows(t):
    """(rows, n_cols) view, any column stride (a half or the even columns of a fused gate_up); a copy
    only where the leading dims do not merge."""
    try:
        return t.view(-1, t.shape[-1])
    except RuntimeError:
        return t.reshape(-1, t.shape[-1]).contiguous()


def _grid_and_block(n_rows, n_cols):
    block = min(triton.next_power_of_2(n_cols), _MAX_BLOCK)
    return (n_rows, triton.cdiv(n_cols, block)), block


def _kernel_activation(activation) -> tuple[int, float, float]:
    """(code, alpha, limit) for an activation name or a ClampedSwiGLU."""
    if isinstance(activation, ClampedSwiGLU):
        return _CLAMPED_SWIGLU, float(activation.alpha), float(activation.limit)
    return _ACTIVATION_CODES[activation], 0.0, 0.0


def _glu_forward(gate2d, up2d, activation):
    n_rows, n_cols = gate2d.shape
    code, alpha, limit = _kernel_activation(activation)
    out = new_output((n_rows, n_cols), gate2d.dtype, gate2d.device)
    if out.numel():
        grid, block = _grid_and_block(n_rows, n_cols)
        _glu_fwd_kernel[grid](
            gate2d, up2d, out,
            gate2d.stride(0), gate2d.stride(1), up2d.stride(0), up2d.stride(1), out.stride(0),
            n_cols, alpha, limit,
            ACTIVATION=code,
            BLOCK_SIZE=block,
            num_warps=num_warps_for(block),
        )
    return out


def _glu_backward(dout2d, gate2d, up2d, activation, write_out=False):
    n_rows, n_cols = gate2d.shape
    code, alpha, limit = _kernel_activation(activation)
    if gate2d.numel():
        grid, block = _grid_and_block(n_rows, n_cols)
        _glu_bwd_kernel[grid](
            dout2d, gate2d, up2d,
            dout2d.stride(0), gate2d.stride(0), gate2d.stride(1), up2d.stride(0), up2d.stride(1),
            n_cols, alpha, limit,
            ACTIVATION=code,
            WRITE_OUT=write_out,
            BLOCK_SIZE=block,
            num_warps=num_warps_for(block),
        )
    return gate2d, up2d


def _term_arguments(term, rows2d):
    """A rank-r term (left (rows, r), right (r, cols)) as the kernel's arguments: pointers, rank, strides."""
    if term is None:
        return (rows2d, rows2d, 0, 0, 0, 0), 0
    left, right = term
    if left.shape[0] != rows2d.shape[0] or right.shape != (left.shape[1], rows2d.shape[1]) or left.stride(1) != 1:
        raise ValueError(f"glu: a rank-r term of left {tuple(left.shape)} (contiguous rows) and right "
                         f"{tuple(right.shape)} for ({rows2d.shape[0]}, {rows2d.shape[1]}) rows")
    return (left, right, left.shape[1], left.stride(0), right.stride(0), right.stride(1)), left.shape[1]


def glu_row_amax_parts(n_cols: int) -> int:
    """The columns of glu_backward_in_place's row_amax for rows of n_cols: one a column tile."""
    return triton.cdiv(n_cols, _RANK_R_TILES["backward"][1])


def _glu_rank_r(dout2d, gate2d, up2d, out, activation, terms, row_amax=None, column_scales=None):
    """The rank-r kernel over (rows, cols): forward into out when dout2d is None, else backward in place."""
    n_rows, n_cols = gate2d.shape
    if not gate2d.numel():
        return
    backward = dout2d is not None
    if row_amax is not None and (
            row_amax.dtype != torch.float32 or row_amax.shape != (n_rows, glu_row_amax_parts(n_cols))
            or row_amax.stride(1) != 1 or column_scales is None
            or any(c.shape != (n_cols,) or c.dtype != torch.float32 or not c.is_contiguous() for c in column_scales)):
        raise ValueError(f"glu: row_amax must be float32 ({n_rows}, {glu_row_amax_parts(n_cols)}) with contiguous "
                         f"rows, with two contiguous float32 column scales of {n_cols}")
    code, alpha, limit = _kernel_activation(activation)
    (gate_term, gate_rank), (up_term, up_rank), (dout_term, dout_rank) = (_term_arguments(t, gate2d) for t in terms)
    gate_scale, up_scale = column_scales if row_amax is not None else (gate2d, gate2d)
    block_m, block_n, warps = _RANK_R_TILES["backward" if backward else "forward"]
    grid = (triton.cdiv(n_rows, block_m), triton.cdiv(n_cols, block_n))
    _glu_rank_r_kernel[grid](
        dout2d if backward else gate2d, gate2d, up2d, gate2d if backward else out,
        gate_term[0], gate_term[1], up_term[0], up_term[1], dout_term[0], dout_term[1],
        n_rows, n_cols, dout2d.stride(0) if backward else 0, gate2d.stride(0), gate2d.stride(1), up2d.stride(0),
        up2d.stride(1), 0 if backward else out.stride(0),
        *gate_term[2:], *up_term[2:], *dout_term[2:],
        gate2d if row_amax is None else row_amax, gate_scale, up_scale, 0 if row_amax is None else row_amax.stride(0),
        alpha, limit,
        ACTIVATION=code, BACKWARD=backward, GATE_TERM=gate_rank > 0, UP_TERM=up_rank > 0, DOUT_TERM=dout_rank > 0,
        R=rank_block(max(gate_rank, up_rank, dout_rank)), AMAX=row_amax is not None,
        DOT_PRECISION=dot_precision(gate2d.dtype), UPCAST=gate2d.device.type != "cuda",
        BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps,
    )


class GLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up, activation):
        if gate.shape != up.shape or gate.dtype != up.dtype:
            raise ValueError(f"glu: gate {tuple(gate.shape)} {gate.dtype} and up {tuple(up.shape)} {up.dtype} differ")
        gate2d, up2d = _as_rows(gate), _as_rows(up)
        out = _glu_forward(gate2d, up2d, activation)
        ctx.save_for_backward(gate2d, up2d)
        ctx.activation = activation
        ctx.shape = gate.shape
        return out.view(gate.shape)

    @staticmethod
    def backward(ctx, dout):
        gate2d, up2d = ctx.saved_tensors
        dout2d = dout.reshape(-1, dout.shape[-1])
        if dout2d.stride(-1) != 1:
            dout2d = dout2d.contiguous()
        d_gate, d_up = _glu_backward(dout2d, gate2d, up2d, ctx.activation)
        # The buffers now hold gradients: bump their versions so any other user of them fails loudly.
        torch.autograd.graph.increment_version(gate2d)
        torch.autograd.graph.increment_version(up2d)
        return d_gate.view(ctx.shape), d_up.view(ctx.shape), None


_ACTIVATION_CODES = {"silu": _SILU, "gelu": _GELU, "gelu_tanh": _GELU_TANH}
GLU_ACTIVATIONS = tuple(_ACTIVATION_CODES)


def is_glu_activation(activation) -> bool:
    """A name in GLU_ACTIVATIONS or a ClampedSwiGLU: what glu and glu_backward_in_place take."""
    return isinstance(activation, ClampedSwiGLU) or activation in _ACTIVATION_CODES


def glu(gate, up, activation):
    """act(gate) * up for activation "silu" (SwiGLU), "gelu" (exact GeGLU), "gelu_tanh", or a
    ClampedSwiGLU; backward overwrites gate and up, as swiglu's and geglu's do."""
    return GLUFunction.apply(gate, up, activation)


def glu_rank_r(gate, up, activation, gate_term=None, up_term=None):
    """act(gate + gl @ gr) * (up + ul @ ur), without autograd, for 2-D gate and up: gate_term = (gl, gr), up_term
    = (ul, ur), each (rows, r) by (r, cols) with any strides, or None (that input has its term already)."""
    if gate.shape != up.shape or gate.dtype != up.dtype or gate.dim() != 2:
        raise ValueError(f"glu: gate {tuple(gate.shape)} {gate.dtype} and up {tuple(up.shape)} {up.dtype} must be "
                         "2-D and alike")
    if gate_term is None and up_term is None:
        return _glu_forward(gate, up, activation)
    out = new_output(gate.shape, gate.dtype, gate.device)
    _glu_rank_r(None, gate, up, out, activation, (gate_term, up_term, None))
    return out


def glu_backward_in_place(dout, gate, up, activation, gate_term=None, up_term=None, dout_term=None, row_amax=None,
                          column_scales=None):
    """Backward of act(gate) * up for gate and up the caller saved, without autograd: writes d_gate
    over gate, d_up over up and the recomputed output over dout, allocating nothing.
    activation: as glu's. Gate and up may have any column stride. Returns (output, d_gate, d_up) in
    those buffers. gate_term, up_term: as glu_rank_r's (the forward's); dout_term: a rank-r term of the
    incoming gradient (the down projection's, for 2-D rows). row_amax, column_scales: a float32 (rows,
    glu_row_amax_parts(cols)) buffer filled with each row's largest magnitude of [d_gate * gate's column scale,
    d_up * up's] (two float32 (cols,) vectors) in each column tile, for the FP8 quantiser of gate's and up's joined
    input gradient (`quantize_joined_rows(..., row_amax)`: each row then read once)."""
    if not (dout.shape == gate.shape == up.shape) or not (dout.dtype == gate.dtype == up.dtype):
        raise ValueError("glu_backward_in_place: dout, gate and up must have one shape and dtype")
    if dout.stride(-1) != 1:
        raise ValueError("glu_backward_in_place: dout's rows must be contiguous")
    rows = [t.view(-1, t.shape[-1]) for t in (dout, gate, up)]  # views: the results land in the callers' buffers
    terms = (gate_term, up_term, dout_term)
    if any(term is not None for term in terms) or row_amax is not None:
        _glu_rank_r(*rows, None, activation, terms, row_amax, column_scales)
    else:
        _glu_backward(*rows, activation, write_out=True)
    return dout, gate, up


def swiglu(gate, up):
    """silu(gate) * up. Backward overwrites gate and up with their gradients (they are saved, not copied)."""
    return GLUFunction.apply(gate, up, "silu")


def geglu(gate, up, approximate="none"):
    """gelu(gate, approximate) * up, approximate in {"none", "tanh"}. Backward overwrites gate and up."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"geglu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return GLUFunction.apply(gate, up, "gelu" if approximate == "none" else "gelu_tanh")
