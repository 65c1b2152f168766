"""Gated linear units: swiglu = silu(gate) * up and geglu = gelu(gate) * up.

Numerics of Hugging Face's `act_fn(gate_proj(x)) * up_proj(x)`: the activation is computed in
float32 and rounded to the input dtype, then multiplied by up in float32 and rounded again (what
torch does for two bf16 tensors). Only gate and up are saved; backward recomputes the activation
and writes d_gate and d_up over the saved gate and up buffers, so it allocates nothing.
`glu_backward_in_place` is that backward without autograd, also giving back the recomputed output
(over the incoming gradient), for the LoRA MLP, which needs it for the down projection's gradients.
"""
import torch
import triton
import triton.language as tl

from ._utils import new_output, num_warps_for, tanh

_SILU, _GELU, _GELU_TANH = 0, 1, 2
_MAX_BLOCK = 4096


@triton.jit
def _activation_and_derivative(g, ACTIVATION: tl.constexpr):
    if ACTIVATION == 0:
        sig = tl.sigmoid(g)
        act = g * sig
        dact = sig * (1.0 + g * (1.0 - sig))
    elif ACTIVATION == 1:
        cdf = 0.5 * (1.0 + tl.math.erf(g * 0.7071067811865476))
        act = g * cdf
        dact = cdf + g * tl.exp(-0.5 * g * g) * 0.3989422804014327
    else:
        inner = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        t = tanh(inner)
        act = 0.5 * g * (1.0 + t)
        dact = 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * g * g)
    return act, dact


@triton.jit
def _glu_fwd_kernel(
    GATE, UP, OUT,
    stride_gate, stride_up, stride_out,
    n_cols,
    ACTIVATION: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    g = tl.load(GATE + row * stride_gate + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(UP + row * stride_up + cols, mask=mask, other=0.0).to(tl.float32)
    act, _ = _activation_and_derivative(g, ACTIVATION)
    act = act.to(OUT.dtype.element_ty).to(tl.float32)
    tl.store(OUT + row * stride_out + cols, (act * u).to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _glu_bwd_kernel(
    DOUT, GATE, UP,
    stride_dout, stride_gate, stride_up,
    n_cols,
    ACTIVATION: tl.constexpr,
    WRITE_OUT: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    # d_up = dout * act(gate); d_gate = dout * up * act'(gate); written over gate and up. WRITE_OUT:
    # the forward's output act(gate) * up is written over dout (each element is read before).
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    dout = tl.load(DOUT + row * stride_dout + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(GATE + row * stride_gate + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(UP + row * stride_up + cols, mask=mask, other=0.0).to(tl.float32)
    act, dact = _activation_and_derivative(g, ACTIVATION)
    # The forward's rounded activation, and HF autograd's rounding of d(act) to the input dtype.
    act = act.to(GATE.dtype.element_ty).to(tl.float32)
    dact_out = (dout * u).to(GATE.dtype.element_ty).to(tl.float32)
    tl.store(GATE + row * stride_gate + cols, (dact_out * dact).to(GATE.dtype.element_ty), mask=mask)
    tl.store(UP + row * stride_up + cols, (dout * act).to(UP.dtype.element_ty), mask=mask)
    if WRITE_OUT:
        tl.store(DOUT + row * stride_dout + cols, (act * u).to(DOUT.dtype.element_ty), mask=mask)


def _as_rows(t):
    """(rows, n_cols) view with unit column stride; a view when possible (e.g. chunks of a fused gate_up)."""
    n_cols = t.shape[-1]
    if t.stride(-1) == 1:
        try:
            return t.view(-1, n_cols)
        except RuntimeError:
            pass
    return t.reshape(-1, n_cols).contiguous()


def _grid_and_block(n_rows, n_cols):
    block = min(triton.next_power_of_2(n_cols), _MAX_BLOCK)
    return (n_rows, triton.cdiv(n_cols, block)), block


def _glu_forward(gate2d, up2d, activation):
    n_rows, n_cols = gate2d.shape
    out = new_output((n_rows, n_cols), gate2d.dtype, gate2d.device)
    if out.numel():
        grid, block = _grid_and_block(n_rows, n_cols)
        _glu_fwd_kernel[grid](
            gate2d, up2d, out,
            gate2d.stride(0), up2d.stride(0), out.stride(0),
            n_cols,
            ACTIVATION=activation,
            BLOCK_SIZE=block,
            num_warps=num_warps_for(block),
        )
    return out


def _glu_backward(dout2d, gate2d, up2d, activation, write_out=False):
    n_rows, n_cols = gate2d.shape
    if gate2d.numel():
        grid, block = _grid_and_block(n_rows, n_cols)
        _glu_bwd_kernel[grid](
            dout2d, gate2d, up2d,
            dout2d.stride(0), gate2d.stride(0), up2d.stride(0),
            n_cols,
            ACTIVATION=activation,
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
        d_gate, d_up = _glu_backward(_as_rows(dout), gate2d, up2d, ctx.activation)
        # The buffers now hold gradients: bump their versions so any other user of them fails loudly.
        torch.autograd.graph.increment_version(gate2d)
        torch.autograd.graph.increment_version(up2d)
        return d_gate.view(ctx.shape), d_up.view(ctx.shape), None


_ACTIVATION_CODES = {"silu": _SILU, "gelu": _GELU, "gelu_tanh": _GELU_TANH}
GLU_ACTIVATIONS = tuple(_ACTIVATION_CODES)


def glu(gate, up, activation):
    """act(gate) * up for activation "silu" (SwiGLU), "gelu" (exact GeGLU) or "gelu_tanh"; backward
    overwrites gate and up, as swiglu's and geglu's do."""
    return GLUFunction.apply(gate, up, _ACTIVATION_CODES[activation])


def glu_backward_in_place(dout, gate, up, activation):
    """Backward of act(gate) * up for gate and up the caller saved, without autograd: writes d_gate
    over gate, d_up over up and the recomputed output over dout, allocating nothing.
    activation: "silu", "gelu" or "gelu_tanh". Returns (output, d_gate, d_up) in those buffers."""
    if not (dout.shape == gate.shape == up.shape) or not (dout.dtype == gate.dtype == up.dtype):
        raise ValueError("glu_backward_in_place: dout, gate and up must have one shape and dtype")
    if any(t.stride(-1) != 1 for t in (dout, gate, up)):
        raise ValueError("glu_backward_in_place: rows must be contiguous")
    rows = [t.view(-1, t.shape[-1]) for t in (dout, gate, up)]  # views: the results land in the callers' buffers
    _glu_backward(*rows, _ACTIVATION_CODES[activation], write_out=True)
    return dout, gate, up


def swiglu(gate, up):
    """silu(gate) * up. Backward overwrites gate and up with their gradients (they are saved, not copied)."""
    return GLUFunction.apply(gate, up, _SILU)


def geglu(gate, up, approximate="none"):
    """gelu(gate, approximate) * up, approximate in {"none", "tanh"}. Backward overwrites gate and up."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"geglu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return GLUFunction.apply(gate, up, _GELU if approximate == "none" else _GELU_TANH)
