"""Mixture-of-experts MLPs with LoRA on the experts, as one autograd function over grouped GEMMs.

For tokens routed to top-k experts (the family's own router runs before, and its logits feed
transformers' auxiliary load-balancing loss as usual), `lora_moe_experts` computes what transformers'
experts modules compute,
    out[t] = sum over the token's k experts e of  w[t, e] * down_e(act(gate_e(x_t)) * up_e(x_t)),
with gate and up one concatenated projection per expert (gate_up [E, 2I, d], gate first):

1. the T * k (token, expert) assignments are sorted by expert (a stable sort; each expert's rows found
   by a searchsorted of the sorted ids, so nothing waits on the device);
2. gate_up: one grouped LoRA GEMM over the sorted rows: torch._grouped_mm (CUTLASS) on Hopper and
   Blackwell in bf16 (ops/grouped_mm_lora.py), else one Triton launch (ops/grouped_lora.py), chosen
   once per call for forward and backward;
3. the GLU kernel (ops/glu.py) on its two halves;
4. down: one grouped LoRA GEMM, likewise;
5. each token's k rows weighted by their routing weights and summed, in one kernel (ops/moe_combine.py:
   float32 products and sum, rounded once to the output dtype; no weighted copy of the rows).

Saved for backward: the block input (T rows, gathered again by expert in backward), the sort order,
each sorted row's token and the order's inverse (computed once), the sorted rows' gate_up output and
the two (rows x r) rank-r products, and on the torch._grouped_mm path the LoRA factors cast for it. The activation and the down projection's output are not kept: backward recomputes
the activation from gate_up (and writes it over the down gradient, as the dense MLP does). The
routing weights get their gradient as <dout[t], down_e(h)> = <dh_e, h>, from the activation gradient
before it is weighted (one kernel takes the dot and weights dh in place), so the down output never
has to exist in backward; the input gradient is the combine kernel's unweighted per-token sum.

gpt-oss's experts (ops/glu.py's ClampedSwiGLU) differ in four ways, all on the same path: weights stored
[E, in, out] (read through transposed views), gate and up interleaved (the even and odd columns of gate_up;
`interleaved=True`), a frozen bias per expert on each projection (added to its sorted rows; the down
projection's bias also reaches the routing weights' gradient as <dout[t], b_e>), and the clamped GLU.

QLoRA's NF4 experts (quant/nf4_experts.py) come as readers instead of weights: each GEMM's weight is dequantised
into a buffer shared by every layer just before it runs, in forward and again in backward, and never saved.

Under the memory engine's checkpoints (`lora_moe_experts`' stash and output_needed), the recompute skips
the down GEMMs and the combine, and a keep_mlp layer's recompute reuses the forward's routing and gate_up.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .lora import MLPStash, compute_dtype
from .ops.glu import GLU_ACTIVATIONS, glu, glu_backward_in_place, is_glu_activation
from .ops.grouped_mm_lora import grouped_mm_factors, use_grouped_mm
from .ops.grouped_lora import (
    ExpertGroups,
    cached_arange,
    expert_groups,
    grouped_lora_factor_grads,
    grouped_lora_forward,
    grouped_lora_input_grad,
    grouped_lora_rank_product,
)
from .ops.moe_combine import moe_combine, moe_weight_grad_

if TYPE_CHECKING:
    from .quant.nf4_experts import ExpertStackReader


@dataclass(frozen=True, eq=False)
class ExpertProjection:
    """One projection of every expert: a frozen weight [E, out, in], or a reader that makes it when called
    with the compute dtype (an NF4 stack dequantised into a shared buffer: quant/nf4_experts.py), and, when
    adapted, LoRA factors lora_A [E, r, in] and lora_B [E, out, r] (any strides: views of PEFT's 2D
    weights); bias: a frozen [E, out] (gpt-oss), or None."""

    weight: torch.Tensor | ExpertStackReader
    lora_A: torch.Tensor | None = None
    lora_B: torch.Tensor | None = None
    scaling: float = 1.0
    bias: torch.Tensor | None = None

    def dense(self, dtype: torch.dtype, groups: ExpertGroups | None = None) -> torch.Tensor:
        """The frozen weight; a reader's is read again at each call (forward, then backward), never kept. Given
        the groups of fewer rows than experts (a decoding step's few tokens), a reader reads only the experts
        that have rows: the GEMMs read no other."""
        if isinstance(self.weight, torch.Tensor):
            return self.weight
        few_rows = groups is not None and groups.rows < groups.num_experts
        return self.weight(dtype, groups.ends > groups.starts if few_rows else None)


def _halves(gate_up: torch.Tensor, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate, up) as views of the gate_up rows: the two halves, or the even and odd columns."""
    return (gate_up[:, 0::2], gate_up[:, 1::2]) if interleaved else gate_up.chunk(2, dim=-1)


def _add_bias_(rows: torch.Tensor, bias: torch.Tensor | None, row_experts: torch.Tensor) -> None:
    if bias is not None:
        rows += bias.index_select(0, row_experts)


def sort_by_expert(top_k_index: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor, ExpertGroups]:
    """(order, inverse, groups): sorted row i is the flattened (token, slot) assignment order[i], so its
    token is order[i] // k; inverse (int32) is order's inverse, the sorted row of each assignment;
    groups says which rows belong to which expert. Two kernels after the sort, over cached aranges and with
    nothing waiting on the device: the inverse's scatter and the groups' searchsorted."""
    flat = top_k_index.reshape(-1)
    sorted_experts, order = torch.sort(flat, stable=True)
    inverse = torch.empty(flat.shape, dtype=torch.int32, device=flat.device)
    inverse.scatter_(0, order, cached_arange(flat.numel(), torch.int32, flat.device))
    return order, inverse, expert_groups(sorted_experts, num_experts)


class LoRAMoEExpertsFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, top_k_weights, top_k_index, dtype, activation, interleaved, gate_up, down, stash,
                output_needed, *lora_weights):
        tokens, k = top_k_index.shape
        x2 = hidden.reshape(tokens, -1).to(dtype)
        kept = (stash.take() if stash is not None else None) or {}
        if "experts" in kept:  # the recompute of a keep_mlp layer: the routing and gate_up from its forward
            groups, order, token_of_row, inverse, gu, xa_gu, ha = kept["experts"]
        else:
            order, inverse, groups = sort_by_expert(top_k_index, gate_up.weight.shape[0])
            token_of_row = order // k
            gu = xa_gu = ha = None
        w_gate_up, w_down = gate_up.dense(dtype, groups), down.dense(dtype, groups)
        # The GEMMs' path, for forward and backward alike: torch._grouped_mm where it reaches CUTLASS
        # (Hopper/Blackwell, bf16, 16-byte-aligned dims), with the LoRA factors cast for it here once,
        # else the Triton kernels (ops/grouped_mm_lora.py).
        ctx.grouped_mm = use_grouped_mm(x2, w_gate_up, w_down)
        factors_gu, factors_down = ([grouped_mm_factors(p.lora_A, p.lora_B, dtype) for p in (gate_up, down)]
                                    if ctx.grouped_mm else (None, None))
        # Each sorted row's expert, for the biases' rows
        row_experts = top_k_index.reshape(-1)[order] if gate_up.bias is not None or down.bias is not None else None
        if gu is None:
            gu, xa_gu = grouped_lora_forward(x2[token_of_row], groups, w_gate_up, gate_up.lora_A,
                                             gate_up.lora_B, gate_up.scaling, factors_gu)
            _add_bias_(gu, gate_up.bias, row_experts)
        if output_needed:
            gate, up = _halves(gu, interleaved)
            y, ha = grouped_lora_forward(glu(gate, up, activation), groups, w_down, down.lora_A, down.lora_B,
                                         down.scaling, factors_down)
            _add_bias_(y, down.bias, row_experts)
            out = moe_combine(y, inverse, k, top_k_weights, hidden.dtype)
            del y
        else:
            # A checkpoint's recompute whose output nothing saves: backward needs the down projection's
            # rank-r input product only, not its GEMM or the combine.
            if ha is None and down.lora_A is not None:
                gate, up = _halves(gu, interleaved)
                ha = grouped_lora_rank_product(glu(gate, up, activation), groups, down.lora_A, factors_down)
            out = hidden.new_empty(hidden.shape)
        if stash is not None and not kept and {"gate", "up"} <= set(stash.keep):
            stash.store({"experts": (groups, order, token_of_row, inverse, gu, xa_gu, ha)})
        ctx.save_for_backward(x2, top_k_weights, top_k_index if down.bias is not None else None, order,
                              token_of_row, inverse, gu, xa_gu, ha,
                              *(factors_gu or (None, None)), *(factors_down or (None, None)))
        # The groups on ctx (a few ints per expert), as GroupedLoRAFunction keeps them: the Triton path's row
        # tiles, made in forward, serve backward too.
        ctx.groups, ctx.activation, ctx.interleaved, ctx.projections = groups, activation, interleaved, (gate_up, down)
        ctx.hidden_shape, ctx.hidden_dtype = hidden.shape, hidden.dtype
        return out.view(hidden.shape)

    @staticmethod
    def backward(ctx, dout):
        x2, top_k_weights, top_k_index, order, token_of_row, inverse, gu, xa_gu, ha, *factors = ctx.saved_tensors
        factors_gu, factors_down = (factors[:2], factors[2:]) if ctx.grouped_mm else (None, None)
        groups = ctx.groups
        gate_up, down = ctx.projections
        tokens, k = top_k_weights.shape
        dout_sorted = dout.reshape(tokens, -1).to(x2.dtype)[token_of_row]
        # dh before the routing weight (linear in dout), whose dot with h is the weight's gradient.
        dh, dyb = grouped_lora_input_grad(dout_sorted, groups, down.dense(x2.dtype), down.lora_A, down.lora_B,
                                          down.scaling, factors_down)
        gate, up = _halves(gu, ctx.interleaved)
        h = glu(gate, up, ctx.activation)
        d_top_k_weights = moe_weight_grad_(dh, h, order, top_k_weights)  # and dh now weighted
        if down.bias is not None:  # + <dout[t], b_e>, for every token and expert in one small GEMM
            bias_dot = dout.reshape(tokens, -1).float() @ down.bias.float().t()
            d_top_k_weights = (d_top_k_weights.float() + bias_dot.gather(1, top_k_index)).to(top_k_weights.dtype)
        grads_down = (None, None)
        if down.lora_A is not None:
            # The weighted dy = w * dout never exists: dA = s (dy B)^T h = s (w dout B)^T h and
            # dB = s dy^T (h A^T) = s dout^T (w h A^T), so the two rank-r products take the weight (torch
            # multiplies bf16 in float32 and rounds once: a float32 copy of the weights would change nothing).
            weights = top_k_weights.reshape(-1)[order][:, None]
            grads_down = grouped_lora_factor_grads(h, dout_sorted, ha.mul_(weights), dyb.mul_(weights), groups,
                                                   down.lora_A, down.lora_B, down.scaling)
        del h, dout_sorted, dyb
        glu_backward_in_place(dh, gate, up, ctx.activation)  # gu now holds d_gate | d_up
        del dh
        dx_sorted, dgub = grouped_lora_input_grad(gu, groups, gate_up.dense(x2.dtype), gate_up.lora_A,
                                                  gate_up.lora_B, gate_up.scaling, factors_gu)
        grads_gate_up = (None, None)
        if gate_up.lora_A is not None:
            grads_gate_up = grouped_lora_factor_grads(x2[token_of_row], gu, xa_gu, dgub, groups, gate_up.lora_A,
                                                      gate_up.lora_B, gate_up.scaling)
        dx = moe_combine(dx_sorted, inverse, k, out_dtype=ctx.hidden_dtype).view(ctx.hidden_shape)
        lora_grads = [g for g, p in zip((*grads_gate_up, *grads_down), _lora_inputs(gate_up, down)) if p is not None]
        return (dx, d_top_k_weights, None, None, None, None, None, None, None, None, *lora_grads)


def _lora_inputs(gate_up: ExpertProjection, down: ExpertProjection):
    return gate_up.lora_A, gate_up.lora_B, down.lora_A, down.lora_B


def lora_moe_experts(hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                     gate_up: ExpertProjection, down: ExpertProjection, activation,
                     *, interleaved: bool = False, stash: MLPStash | None = None,
                     output_needed: bool = True) -> torch.Tensor:
    """The routed experts' output [T, d] for hidden [T, d], top_k_index [T, k] (expert ids) and
    top_k_weights [T, k] (gradients flow to hidden, the routing weights and the LoRA factors).
    gate_up: gate and up concatenated (gate first), or interleaved (gate in the even columns);
    activation: "silu", "gelu", "gelu_tanh" or a ClampedSwiGLU (ops/glu.py).

    stash and output_needed serve the memory engine's checkpoints as for the dense MLP (lora.lora_mlp):
    a stash keeping gate and up carries the routing and the gate_up output from the forward to the
    recompute, which then skips the sort, the gathers and the gate_up GEMMs; output_needed=False skips
    the down GEMMs and the combine and returns an uninitialised tensor of the output's shape."""
    if not is_glu_activation(activation):
        raise ValueError(f"unknown GLU activation {activation!r}; expected a ClampedSwiGLU or one of {GLU_ACTIVATIONS}")
    lora_weights = [t for t in _lora_inputs(gate_up, down) if t is not None]
    return LoRAMoEExpertsFunction.apply(hidden, top_k_weights, top_k_index, compute_dtype(hidden), activation,
                                        interleaved, gate_up, down, stash, output_needed, *lora_weights)
