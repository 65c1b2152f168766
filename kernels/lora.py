"""LoRA projections as autograd functions: frozen base matmul plus the rank-r path.

Every function computes, for each projection,
    out = x @ W^T (+ bias) + scaling * (x @ A^T) @ B^T
and in backward produces dX and the A/B gradients through rank-r intermediates; the frozen base
weight W never gets a gradient. W is read through `base_weight(module)` in forward and again in
backward and is never saved, so a quantised base can hand out a dense weight on demand; a base that
multiplies in its own format (FP8) gives its two products instead (`register_base_matmul`).

Saved for backward: the block input and the (N, r) products x @ A^T (cheap); the MLP also keeps
its gate and up projections, from which the activation is recomputed in backward. Under the memory
engine's checkpointing the MLP can skip work its recompute does not need (see LoRAMLPFunction).
"""
from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from .ops.glu import GLU_ACTIVATIONS, glu, glu_backward_in_place, glu_rank_r, glu_row_amax_parts

_WEIGHT_READERS: dict[type, Callable[[nn.Module], torch.Tensor]] = {nn.Linear: lambda layer: layer.weight}


def register_base_weight(layer_type: type, reader: Callable[[nn.Module], torch.Tensor]) -> None:
    """Teach `base_weight` a new frozen layer type (e.g. a 4-bit linear that dequantises)."""
    _WEIGHT_READERS[layer_type] = reader


@dataclass(frozen=True)
class BaseMatmul:
    """A frozen layer type's own products, in the input's dtype: forward(layer, x, bias) = x @ W^T (+ bias,
    when not None: in the product's own pass) and input_grad(layer, dout) = dout @ W (x, dout: 2-D rows)."""

    forward: Callable[[nn.Module, torch.Tensor, torch.Tensor | None], torch.Tensor]
    input_grad: Callable[[nn.Module, torch.Tensor], torch.Tensor]
    # joined_input_grad(layers, douts) = the sum of dout_i @ W_i of layers reading the same rows, in one product
    joined_input_grad: Callable[[list[nn.Module], list[torch.Tensor]], torch.Tensor] | None = None
    # repeated_input_grad(layer) = input_grad(layer, ·) for several douts in a row, preparing the weight once
    repeated_input_grad: Callable[[nn.Module], Callable[[torch.Tensor], torch.Tensor]] | None = None
    # For a base that quantises the gradient rows it multiplies (FP8): row_amax_scale(layer) is the float32 factor
    # of dout's columns before they are quantised, and joined_input_grad(..., row_amax=) takes the joined rows'
    # largest magnitudes (of each dout times its factor) as the GLU kernel found them while it wrote gate's and
    # up's gradients, in parts (rows, parts), so that the quantiser reads each row once
    row_amax_scale: Callable[[nn.Module], torch.Tensor] | None = None


_BASE_MATMULS: dict[type, BaseMatmul] = {}


def register_base_matmul(layer_type: type, forward, input_grad, joined_input_grad=None,
                         repeated_input_grad=None, row_amax_scale=None) -> None:
    """Teach the LoRA functions a frozen layer type that multiplies in its own format (e.g. FP8 on the
    tensor cores) instead of handing out a dense weight."""
    _BASE_MATMULS[layer_type] = BaseMatmul(forward, input_grad, joined_input_grad, repeated_input_grad,
                                           row_amax_scale)


def supports_base_layer(layer: nn.Module) -> bool:
    return type(layer) in _WEIGHT_READERS or type(layer) in _BASE_MATMULS


def _base_input_grad_fn(layer: nn.Module, dtype: torch.dtype) -> Callable:
    """grad(dout, dx=None, rank_r=None) = dx + dout @ W (+ rank_r[0] @ rank_r[1]) of one frozen layer. A
    dense weight is read once here, for every call of the returned function. Without dx, no second buffer
    of the output's size exists: the rank-r product is written first and the dense GEMM accumulates onto it
    (beta=1); a base with its own product (FP8, whose GEMM cannot accumulate) writes that first and the
    rank-r product accumulates onto it. With dx, such a base's product is one more buffer, added to dx. Such a
    base's weight is prepared once too where it can be (BaseMatmul.repeated_input_grad: FP8's transposed codes)."""
    matmul = _BASE_MATMULS.get(type(layer))
    if matmul is not None:
        product_of = (matmul.repeated_input_grad(layer) if matmul.repeated_input_grad is not None
                      else functools.partial(matmul.input_grad, layer))

        def grad(dout, dx=None, rank_r=None):
            product = product_of(dout)
            if rank_r is not None:
                product.addmm_(*rank_r)
            return product if dx is None else dx.add_(product)
        return grad
    weight = base_weight(layer).to(dtype)

    def dense_grad(dout, dx=None, rank_r=None):
        if rank_r is not None:
            dx = rank_r[0] @ rank_r[1] if dx is None else dx.addmm_(*rank_r)
        return dout @ weight if dx is None else dx.addmm_(dout, weight)
    return dense_grad


def base_weight(layer: nn.Module) -> torch.Tensor:
    """The dense (out_features, in_features) weight of a frozen base projection."""
    return _WEIGHT_READERS[type(layer)](layer)


@dataclass(frozen=True, eq=False)
class LoRAProjection:
    """A frozen linear projection and, when it is adapted, its LoRA factors."""

    base: nn.Module
    lora_A: torch.Tensor | None = None  # (r, in_features)
    lora_B: torch.Tensor | None = None  # (out_features, r)
    scaling: float = 1.0

    @property
    def lora_weights(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return self.lora_A, self.lora_B


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the matmuls run in: autocast's when it is on (as nn.Linear's would), else the input's.

    Not the base weight's: reading that could mean dequantising it just to learn its dtype.
    """
    device_type = x.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return x.dtype


def _rows(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1]).to(dtype)


# LoRA factors (float32 parameters under PEFT's defaults) in the compute dtype, B times its scaling: made once
# between optimizer steps and read by the forward, the checkpoint's recompute and the backward alike, instead
# of ~40 cast kernels a decoder layer a step (their launches are host time that small models and the FP8 and
# MoE steps wait on). Keyed by the factor's identity and checked against its version counter (load_state_dict,
# init and other in-place writes bump it); emptied after every optimizer step, since fused optimizers write
# the parameters without bumping it. Only made with gradients off (inside the autograd functions). The factor
# is held weakly: a model that is dropped is not kept alive by its casts.
_FACTOR_CASTS: dict[tuple[int, torch.dtype, float], tuple[weakref.ref, int, torch.Tensor]] = {}


def factor_in(factor: torch.Tensor, dtype: torch.dtype, scaling: float = 1.0) -> torch.Tensor:
    """factor * scaling in dtype, from the cache above when the factor has not changed since it was made."""
    if factor.dtype == dtype and scaling == 1:
        return factor
    cached = _factor_casts_cached and not torch.is_grad_enabled()
    key = (id(factor), dtype, scaling)
    hit = _FACTOR_CASTS.get(key) if cached else None
    if hit is not None and hit[0]() is factor and hit[1] == factor._version:
        return hit[2]
    cast = (factor if scaling == 1 else factor * scaling).to(dtype)
    if cached:
        _FACTOR_CASTS[key] = (weakref.ref(factor), factor._version, cast)
    return cast


def clear_factor_casts(*_args) -> None:
    _FACTOR_CASTS.clear()


_factor_casts_cached = True


@contextmanager
def factor_casts_uncached():
    """Inside the block every cast is made anew and none is kept: a CUDA graph captured there records its casts
    (memory/graphs.py) instead of reading a cached one that the next optimizer step lets go of."""
    global _factor_casts_cached
    clear_factor_casts()
    _factor_casts_cached = False
    try:
        yield
    finally:
        _factor_casts_cached = True


register_optimizer_step_post_hook(clear_factor_casts)


def _scaled_B(p: LoRAProjection, dtype: torch.dtype) -> torch.Tensor:
    return factor_in(p.lora_B, dtype, p.scaling)


def _factors_A(projections, dtype: torch.dtype) -> torch.Tensor:
    """The A factors of projections stacked (r_1 + r_2 + ..., in) in dtype."""
    factors = [factor_in(p.lora_A, dtype) for p in projections]
    return factors[0] if len(factors) == 1 else torch.cat(factors)


def _project(
    x2: torch.Tensor, p: LoRAProjection, xa: torch.Tensor | None = None, term_elsewhere: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Forward of one projection on rows x2; returns the output and x2 @ A^T (None when not adapted).
    xa: x2 @ A^T when the caller already has it. term_elsewhere: the output goes to a kernel that adds the
    rank-r term where _term_elsewhere(p) (gate's and up's to the GLU kernel, q's and k's to the RoPE kernel):
    the output is then returned without it.

    The rank-r term is written first and the base GEMM adds onto it (beta=1, in its epilogue, where
    it costs nearly nothing): one write of the output instead of a write and then a read-modify-write
    by a rank-r addmm_, which on the 8B shape's gate and up outputs took 0.19 ms each."""
    dtype = x2.dtype
    bias = p.base.bias
    matmul = _BASE_MATMULS.get(type(p.base))
    if matmul is not None:  # its own product (with the bias) first, then the rank-r term onto it
        out = matmul.forward(p.base, x2, None if bias is None else bias.to(dtype))
        if p.lora_A is None:
            return out, None
        if xa is None:
            xa = x2 @ factor_in(p.lora_A, dtype).t()
        return (out if term_elsewhere else out.addmm_(*_rank_r_term(p, xa))), xa
    weight = base_weight(p.base).to(dtype)
    if p.lora_A is None:
        out = x2 @ weight.t() if bias is None else torch.addmm(bias.to(dtype), x2, weight.t())
        return out, None
    if xa is None:
        xa = x2 @ factor_in(p.lora_A, dtype).t()
    B = _scaled_B(p, dtype)
    out = xa @ B.t() if bias is None else torch.addmm(bias.to(dtype), xa, B.t())
    return out.addmm_(x2, weight.t()), xa


def _term_elsewhere(p: LoRAProjection) -> bool:
    """Whether the kernel its product goes to adds p's rank-r term (the GLU kernel: gate's, up's, and the down
    projection's onto its input gradient; the RoPE kernel: q's and k's, and the residual add: o's and down's, where
    the caller asks) instead of an addmm_ onto its product: where the base multiplies in its own format (FP8), whose
    GEMM cannot accumulate onto an output, so each addmm_ would be one more pass over the output."""
    return p.lora_A is not None and type(p.base) in _BASE_MATMULS


def _rank_r_term(p: LoRAProjection, xa: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """p's rank-r term as the factors (x A^T, scaling * B^T) whose product it is, in xa's dtype."""
    return xa, _scaled_B(p, xa.dtype).t()


def _glu_terms(gate_p: LoRAProjection, up_p: LoRAProjection, xa_gate, xa_up):
    """Gate's and up's rank-r terms (_rank_r_term) for the GLU kernel; None where the output has it."""
    return tuple(_rank_r_term(p, xa) if _term_elsewhere(p) else None for p, xa in ((gate_p, xa_gate), (up_p, xa_up)))


def _glu_of_projections(activation, gate, up, gate_p, up_p, xa_gate, xa_up) -> torch.Tensor:
    """act(gate) * up of _project(..., term_elsewhere=True)'s outputs (without autograd)."""
    return glu_rank_r(gate, up, activation, *_glu_terms(gate_p, up_p, xa_gate, xa_up))


def _lora_backward(dout: torch.Tensor, xa: torch.Tensor, p: LoRAProjection):
    """(dB, dxa) of one adapted projection: dxa = scaling * dout @ B is the rank-r part of dX
    (dX += dxa @ A) and gives dA = dxa^T @ x."""
    dB = (dout.t() @ xa).mul_(p.scaling)
    return dB.to(p.lora_B.dtype), dout @ _scaled_B(p, dout.dtype)


def _input_grad(pairs, dxa: torch.Tensor | None = None, A: torch.Tensor | None = None,
                row_amax: torch.Tensor | None = None) -> torch.Tensor:
    """dX = dxa @ A + the sum of dout @ W over (dout, projection) pairs. The rank-r product goes with the
    first projection's (see _base_input_grad_fn): before a dense GEMM that accumulates onto it, or onto an
    FP8 product that then is dX, so it never costs a pass of its own over dX. Each W is read (a 4-bit one
    dequantised into the shared buffer) just before its GEMM. A base type with a joined product (FP8) gives
    the whole sum from one GEMM; row_amax: the joined douts' row maxima, for it (BaseMatmul.row_amax_scale)."""
    rank_r = None if dxa is None else (dxa, A.to(dxa.dtype))
    pairs = list(pairs)
    bases = [p.base for _, p in pairs]
    joined = _joined_input_grad(bases)
    if joined is not None:  # one product for all of them (FP8's GEMM cannot accumulate onto dX)
        douts = [dout for dout, _ in pairs]
        dx = joined(bases, douts) if row_amax is None else joined(bases, douts, row_amax=row_amax)
        return dx if rank_r is None else dx.addmm_(*rank_r)
    dx = None
    for dout, p in pairs:
        dx = _base_input_grad_fn(p.base, dout.dtype)(dout, dx, rank_r)
        rank_r = None
    return dx


def _joined_input_grad(layers) -> Callable | None:
    """The joined product of several layers of one type that has it, all reading rows of the same width."""
    matmul = _BASE_MATMULS.get(type(layers[0]))
    if (len(layers) < 2 or matmul is None or matmul.joined_input_grad is None
            or any(type(layer) is not type(layers[0]) for layer in layers)):
        return None
    return matmul.joined_input_grad


def _shared_input_backward(x2: torch.Tensor, douts, xas, projections, row_amax=None) -> tuple[torch.Tensor, list]:
    """dX and the LoRA gradients [dA, dB, dA, dB, ...] (None for an unadapted projection) of
    projections that all read the rows x2 (o_proj alone; q/k/v; gate/up). The adapted ones share
    one dA product (x2 read once) and one rank-r product into dX (_input_grad, which takes row_amax)."""
    adapted = [(dout, xa, p) for dout, xa, p in zip(douts, xas, projections) if p.lora_A is not None]
    dxa_all = A_all = None
    dBs, dAs = iter(()), iter(())
    if adapted:
        dBs, dxas = zip(*(_lora_backward(dout, xa, p) for dout, xa, p in adapted))
        dxa_all = torch.cat(dxas, dim=1)
        A_all = _factors_A([p for _, _, p in adapted], dxa_all.dtype)
        dBs = iter(dBs)
        dAs = iter((dxa_all.t() @ x2).split([p.lora_A.shape[0] for _, _, p in adapted]))
    dx = _input_grad(zip(douts, projections), dxa_all, A_all, row_amax)
    grads = []
    for p in projections:
        grads += [None, None] if p.lora_A is None else [next(dAs).to(p.lora_A.dtype), next(dBs)]
    return dx, grads


def _flat_lora_weights(projections: Sequence[LoRAProjection]) -> list[torch.Tensor | None]:
    return [w for p in projections for w in p.lora_weights]


class LoRALinearFunction(torch.autograd.Function):
    """One LoRA projection (the attention output projection, or any single adapted linear).

    deferred: a dict, or None. Given, the rank-r term is left out of the output where _term_elsewhere (an FP8
    base) and put in it as "out": (x A^T, scaling * B^T), for the residual add after it (ops.residual_add).
    The output's gradient is still the whole projection's, so backward is unchanged."""

    @staticmethod
    def forward(ctx, x, dtype, projection, deferred, lora_A, lora_B):
        x2 = _rows(x, dtype)
        defer = deferred is not None and _term_elsewhere(projection)
        out, xa = _project(x2, projection, term_elsewhere=defer)
        if defer:
            deferred["out"] = _rank_r_term(projection, xa)
        ctx.save_for_backward(x2, xa)
        ctx.projection, ctx.x_shape, ctx.x_dtype = projection, x.shape, x.dtype
        return out.view(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx, dout):
        x2, xa = ctx.saved_tensors
        dout2 = dout.reshape(-1, dout.shape[-1]).to(x2.dtype)
        dx, grads = _shared_input_backward(x2, [dout2], [xa], [ctx.projection])
        return dx.view(ctx.x_shape).to(ctx.x_dtype), None, None, None, *grads


class LoRAQKVFunction(torch.autograd.Function):
    """The query, key and value projections of one attention block, sharing one saved input.

    When all three are adapted, their A factors run as one (N, in) x (in, r_q + r_k + r_v) product
    in forward; in backward the adapted ones share one dA product, and their joint rank-r product goes
    into dX with the first base GEMM's (_input_grad): the input is read once for the three instead of
    three times, each way.

    deferred: a dict, or None. Given, q's and k's rank-r terms are left out of their outputs where
    _term_elsewhere (an FP8 base) and put in it as "q" and "k": (x A^T, scaling * B^T), for the RoPE kernel
    to add. The outputs' gradients are still those of the whole projections, so backward is unchanged.
    """

    @staticmethod
    def forward(ctx, x, dtype, projections, deferred, *lora_weights):
        x2 = _rows(x, dtype)
        ctx.fused = all(p.lora_A is not None for p in projections)
        defer = [deferred is not None and i < 2 and _term_elsewhere(p) for i, p in enumerate(projections)]
        if ctx.fused:
            xa_all = x2 @ _factors_A(projections, dtype).t()
            ctx.ranks = [p.lora_A.shape[0] for p in projections]
            xas = xa_all.split(ctx.ranks, dim=1)
            outs = [_project(x2, p, xa, term_elsewhere=d)[0] for p, xa, d in zip(projections, xas, defer)]
            ctx.save_for_backward(x2, xa_all)
        else:
            outs, xas = zip(*(_project(x2, p, term_elsewhere=d) for p, d in zip(projections, defer)))
            ctx.save_for_backward(x2, *xas)
        for name, p, xa, d in zip("qk", projections, xas, defer):
            if d:  # xa: a column block of xa_all, its rows contiguous
                deferred[name] = _rank_r_term(p, xa)
        ctx.projections, ctx.x_shape, ctx.x_dtype = projections, x.shape, x.dtype
        return tuple(out.view(*x.shape[:-1], out.shape[-1]) for out in outs)

    @staticmethod
    def backward(ctx, *douts):
        x2, *xas = ctx.saved_tensors
        if ctx.fused:
            xas = xas[0].split(ctx.ranks, dim=1)
        douts2 = [dout.reshape(-1, dout.shape[-1]).to(x2.dtype) for dout in douts]
        dx, grads = _shared_input_backward(x2, douts2, xas, ctx.projections)
        return dx.view(ctx.x_shape).to(ctx.x_dtype), None, None, None, *grads


def gated_activation(activation: str, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """act(gate) * up on the GLU kernel; activation is one of GLU_ACTIVATIONS."""
    return glu(gate, up, activation)


class MLPStash:
    """Carries some of one MLP's matmul outputs from its forward to its recompute under activation
    checkpointing, so the recompute skips their GEMMs (the memory engine's keep_mlp layers keep gate
    and up; its offloading layers keep up in host memory). `keep` names the projections kept, of
    "gate" and "up"; each comes with its rank-r product, as _project(..., term_elsewhere=True) gave them (an FP8
    base's without its rank-r term). Emptied when the recompute takes them."""

    def __init__(self, keep=("gate", "up")):
        self.keep = tuple(keep)
        self.activations: dict | None = None

    def store(self, activations: dict) -> None:
        self.activations = activations

    def take(self) -> dict | None:
        activations, self.activations = self.activations, None
        return activations


def _down_lora_input(h, down_p):
    return None if down_p.lora_A is None else h @ factor_in(down_p.lora_A, h.dtype).t()


def _mlp_forward_rows(x2, projections, activation):
    """The MLP's output on rows x2, saving nothing."""
    gate_p, up_p, down_p = projections
    (gate, xa_gate), (up, xa_up) = _project(x2, gate_p, term_elsewhere=True), _project(x2, up_p, term_elsewhere=True)
    return _project(_glu_of_projections(activation, gate, up, gate_p, up_p, xa_gate, xa_up), down_p)[0]


def _mlp_backward(projections, activation, x2, gate, up, xa_gate, xa_up, ha_down, dout2, dh_tile_rows=None):
    """dX and the six LoRA gradients of one MLP on rows x2 (ha_down: recomputed from h when None).

    The GLU backward writes the recomputed activation h over dh, and d_gate, d_up over gate, up. dh
    exists dh_tile_rows rows at a time (all rows when None): with gate and up held whole, it is the
    one more (rows, intermediate) buffer, so tiles of a quarter of the rows take 3/4 of it off the
    peak for the same FLOPs (the down weight is read, or dequantised, once for all tiles)."""
    gate_p, up_p, down_p = projections
    rows, dtype = dout2.shape[0], dout2.dtype
    step = dh_tile_rows if dh_tile_rows and rows > dh_tile_rows else max(rows, 1)
    adapted = down_p.lora_A is not None
    down_term_in_glu = _term_elsewhere(down_p)
    glu_terms = _glu_terms(gate_p, up_p, xa_gate, xa_up)
    down_input_grad = _base_input_grad_fn(down_p.base, dtype)
    # gate's and up's joined input gradient quantises what the GLU writes: the GLU finds its row maxima
    row_amax = column_scales = None
    joined = _joined_input_grad([gate_p.base, up_p.base]) is not None
    row_amax_scale = _BASE_MATMULS[type(gate_p.base)].row_amax_scale if joined else None
    if row_amax_scale is not None:
        column_scales = [row_amax_scale(p.base) for p in (gate_p, up_p)]
        row_amax = gate.new_empty((rows, glu_row_amax_parts(gate.shape[1])), dtype=torch.float32)
    dA_down = dB_down = None
    if adapted:
        A_down = factor_in(down_p.lora_A, dtype)
        dha = dout2 @ _scaled_B(down_p, dtype)
        dA_down = torch.zeros(A_down.shape, dtype=torch.float32, device=dout2.device)
        recompute_ha = ha_down is None
        if recompute_ha:
            ha_down = dout2.new_empty((rows, A_down.shape[0]))
    for start in range(0, rows, step):
        tile = slice(start, start + step)
        down_term = (dha[tile], A_down) if adapted else None
        dh = down_input_grad(dout2[tile], rank_r=None if down_term_in_glu else down_term)
        h, _, _ = glu_backward_in_place(dh, gate[tile], up[tile], activation,
                                        *(None if term is None else (term[0][tile], term[1]) for term in glu_terms),
                                        dout_term=down_term if down_term_in_glu else None,
                                        row_amax=None if row_amax is None else row_amax[tile],
                                        column_scales=column_scales)
        if adapted:
            if recompute_ha:
                ha_down[tile] = _down_lora_input(h, down_p)
            dA_down.add_(dha[tile].t() @ h)
        del dh, h
    del down_input_grad
    if adapted:
        dB_down = (dout2.t() @ ha_down).mul_(down_p.scaling).to(down_p.lora_B.dtype)
        dA_down = dA_down.to(down_p.lora_A.dtype)
    dx, grads = _shared_input_backward(x2, (gate, up), (xa_gate, xa_up), (gate_p, up_p), row_amax)  # d_gate, d_up
    return dx, (*grads, dA_down, dB_down)


def _add_grads(total, grads):
    return grads if total is None else tuple(None if t is None else t.add_(g) for t, g in zip(total, grads))


class LoRAMLPFunction(torch.autograd.Function):
    """down(act(gate(x)) * up(x)) with LoRA on any of the three projections.

    stash: an MLPStash, or None. output_needed=False (a checkpoint's recompute, when nothing after
    the MLP saves for backward) skips the down projection's GEMM, whose output backward never
    reads, and returns an uninitialised tensor of the output's shape.

    tile_rows: with more rows than this (long sequences) and no stash, the MLP runs over row tiles
    and saves only its input; backward recomputes each tile's gate and up before its gradients. The
    (rows, intermediate) tensors then exist one tile at a time instead of for the whole sequence (six
    of them at the backward's peak, 168 KB a token at the Llama-3 8B shape). Under the memory engine's
    checkpoint the recompute then skips the gate and up GEMMs, so the FLOPs are those of the untiled
    path; without a checkpoint, gate and up are computed twice.

    dh_tile_rows: backward builds the down projection's input gradient this many rows at a time (see
    _mlp_backward). after_backward: called once backward has let go of the MLP's tensors (the memory
    engine then starts bringing the previous layer's offloaded up projection back).

    deferred: as LoRALinearFunction's, for the down projection (untiled only).
    """

    @staticmethod
    def forward(ctx, x, dtype, activation, projections, stash, output_needed, tile_rows, dh_tile_rows, after_backward,
                deferred, *lora_weights):
        gate_p, up_p, down_p = projections
        x2 = _rows(x, dtype)
        ctx.projections, ctx.activation, ctx.x_shape, ctx.x_dtype = projections, activation, x.shape, x.dtype
        ctx.dh_tile_rows, ctx.after_backward = dh_tile_rows, after_backward
        ctx.tile_rows = tile_rows if stash is None and tile_rows and x2.shape[0] > tile_rows else None
        if ctx.tile_rows:
            out = x2.new_empty((x2.shape[0], down_p.base.out_features))
            if output_needed:
                for start in range(0, x2.shape[0], ctx.tile_rows):
                    rows = slice(start, start + ctx.tile_rows)
                    out[rows] = _mlp_forward_rows(x2[rows], projections, activation)
            ctx.save_for_backward(x2)
            return out.view(*x.shape[:-1], out.shape[-1])
        kept = (stash.take() if stash is not None else None) or {}
        gate, xa_gate = kept["gate"] if "gate" in kept else _project(x2, gate_p, term_elsewhere=True)
        up, xa_up = kept["up"] if "up" in kept else _project(x2, up_p, term_elsewhere=True)
        ha_down = kept.get("ha_down")
        if output_needed:
            defer = deferred is not None and _term_elsewhere(down_p)
            out, ha_down = _project(_glu_of_projections(activation, gate, up, gate_p, up_p, xa_gate, xa_up), down_p,
                                    term_elsewhere=defer)
            if defer:
                deferred["out"] = _rank_r_term(down_p, ha_down)
        else:
            if "ha_down" not in kept:
                ha_down = _down_lora_input(_glu_of_projections(activation, gate, up, gate_p, up_p, xa_gate, xa_up),
                                           down_p)
            out = x2.new_empty((x2.shape[0], down_p.base.out_features))
        if stash is not None and not kept:
            outputs = {"gate": (gate, xa_gate), "up": (up, xa_up)}
            stored = {name: outputs[name] for name in stash.keep}
            if len(stored) == 2:
                stored["ha_down"] = ha_down
            stash.store(stored)
        ctx.save_for_backward(x2, gate, up, xa_gate, xa_up, ha_down)
        return out.view(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx, dout):
        x2, *saved = ctx.saved_tensors
        dout2 = dout.reshape(-1, dout.shape[-1]).to(x2.dtype)
        if not ctx.tile_rows:
            dx, grads = _mlp_backward(ctx.projections, ctx.activation, x2, *saved, dout2, ctx.dh_tile_rows)
        else:
            gate_p, up_p, _ = ctx.projections
            dx, grads = torch.empty_like(x2), None
            for start in range(0, x2.shape[0], ctx.tile_rows):
                rows = slice(start, start + ctx.tile_rows)
                gate, xa_gate = _project(x2[rows], gate_p, term_elsewhere=True)
                up, xa_up = _project(x2[rows], up_p, term_elsewhere=True)
                dx_tile, tile_grads = _mlp_backward(ctx.projections, ctx.activation, x2[rows], gate, up, xa_gate,
                                                    xa_up, None, dout2[rows], ctx.dh_tile_rows)
                del gate, up
                dx[rows] = dx_tile
                grads = _add_grads(grads, tile_grads)
        del x2, saved, dout2
        if ctx.after_backward is not None:
            ctx.after_backward()
        return (dx.view(ctx.x_shape).to(ctx.x_dtype), None, None, None, None, None, None, None, None, None, *grads)


def lora_linear(x: torch.Tensor, projection: LoRAProjection, deferred: dict | None = None) -> torch.Tensor:
    """deferred: see LoRALinearFunction (the rank-r term left to the residual add)."""
    dtype = compute_dtype(x)
    return LoRALinearFunction.apply(x, dtype, projection, deferred, *projection.lora_weights)


def lora_qkv(
    x: torch.Tensor, q: LoRAProjection, k: LoRAProjection, v: LoRAProjection, deferred: dict | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """deferred: see LoRAQKVFunction (q's and k's rank-r terms left to the RoPE kernel)."""
    projections = (q, k, v)
    dtype = compute_dtype(x)
    return LoRAQKVFunction.apply(x, dtype, projections, deferred, *_flat_lora_weights(projections))


def lora_mlp(
    x: torch.Tensor, gate: LoRAProjection, up: LoRAProjection, down: LoRAProjection, activation: str,
    *, stash: MLPStash | None = None, output_needed: bool = True, tile_rows: int | None = None,
    dh_tile_rows: int | None = None, after_backward: Callable[[], None] | None = None, deferred: dict | None = None,
) -> torch.Tensor:
    """activation: "silu" (SwiGLU), "gelu" (exact GeGLU) or "gelu_tanh" (tanh-approximated GeGLU).

    stash, output_needed, tile_rows, dh_tile_rows and after_backward serve activation checkpointing
    and long sequences (see LoRAMLPFunction); the defaults give the plain forward and backward.
    deferred: the down projection's rank-r term left to the residual add (see LoRAMLPFunction).
    """
    if activation not in GLU_ACTIVATIONS:
        raise ValueError(f"unknown GLU activation {activation!r}; expected one of {GLU_ACTIVATIONS}")
    projections = (gate, up, down)
    dtype = compute_dtype(x)
    return LoRAMLPFunction.apply(
        x, dtype, activation, projections, stash, output_needed, tile_rows, dh_tile_rows, after_backward, deferred,
        *_flat_lora_weights(projections),
    )
