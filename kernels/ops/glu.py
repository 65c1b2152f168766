"""Gated linear units: swiglu = silu(gate) * up, geglu = gelu(gate) * up, and gpt-oss's clamped SwiGLU.

Numerics of Hugging Face's `act_fn(gate_proj(x)) * up_proj(x)`: the activation is computed in
float32 and rounded to the input dtype, then multiplied by up in float32 and rounded again (what
torch does for two bf16 tensors). Only gate and up are saved; backward recomputes the activation
and writes d_gate and d_up over the saved gate and up buffers, so it allocates nothing.
`glu_backward_in_place` is that backward without autograd, also giving back the recomputed output
(over the incoming gradient), for the LoRA MLP, which needs it for the down projection's gradients.
Gate and up may be strided views of one projection's output: its two halves (gate first), or its
even and odd columns (gpt-oss interleaves them).
"""
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ._utils import new_output, num_warps_for, tanh

_SILU, _GELU, _GELU_TANH, _CLAMPED_SWIGLU = 0, 1, 2, 3
_MAX_BLOCK = 4096


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


def glu_backward_in_place(dout, gate, up, activation):
    """Backward of act(gate) * up for gate and up the caller saved, without autograd: writes d_gate
    over gate, d_up over up and the recomputed output over dout, allocating nothing.
    activation: as glu's. Gate and up may have any column stride. Returns (output, d_gate, d_up) in
    those buffers."""
    if not (dout.shape == gate.shape == up.shape) or not (dout.dtype == gate.dtype == up.dtype):
        raise ValueError("glu_backward_in_place: dout, gate and up must have one shape and dtype")
    if dout.stride(-1) != 1:
        raise ValueError("glu_backward_in_place: dout's rows must be contiguous")
    rows = [t.view(-1, t.shape[-1]) for t in (dout, gate, up)]  # views: the results land in the callers' buffers
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
