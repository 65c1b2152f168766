"""FP8 base weights: `FP8Weight` (e4m3 codes + a float32 scale per output channel) and `FP8Linear`,
the frozen layer that multiplies in FP8 in forward and backward (docs/fp8.md).

Storage: the codes as a uint8 `weight` parameter (a float8 parameter would be cast by `model.to(dtype)`,
uint8 is left alone), viewed as float8_e4m3fn on use, and one float32 scale per output row,
scale = amax(|W[n, :]|) / 448, converted from the checkpoint's 16-bit weight at load. 1 byte a weight
plus 4 bytes a row.

Forward: x quantised per token (each row's amax maps to 448), one FP8 GEMM with both row-wise scales.
Backward: dx = dy @ W with W the forward's very weight (codes * scale): the per-output-channel scale
multiplies dy's columns, then dy is quantised per token and multiplied by the codes transposed (the
FP8 GEMM takes its second operand column-major, so a tiled Triton transpose writes W^T's codes into a
buffer shared by all layers, just before the GEMM; no second copy of the weights is kept). No global
loss scale: every row of dy gets its own float32 scale.

Forward's bias goes into the GEMM's epilogue (one pass over the output, one rounding).

Nothing else changes: the LoRA factors' products, the GLU, norms, RoPE and the loss run as in bf16 LoRA.
"""
from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ..lora import register_base_matmul
from ..ops.fp8_matmul import (E4M3_MAX, FP8_DTYPE, MAX_JOINED_PARTS, fp8_backend, fp8_matmul, quantize_joined_rows,
                              quantize_rows, transpose_into)
from .quantised_linear import QuantisedLinear, shared_buffer

# cuBLAS' FP8 GEMM wants both dimensions of the weight in multiples of 16; other layers stay 16-bit.
FP8_ALIGNMENT = 16
SCALE_KEY = "weight_scale"
# The forward products (a checkpoint's recompute among them) take the tensor cores' fast accumulation: 20 ms of a
# 511 ms step on the 8B shape (an H100), and the 300-step fidelity run's worst step 0.93% from bf16's against
# 0.91% with float32 accumulation in the same call. The input gradients do not: with it their joined GEMMs were
# 8-10% faster but 4x further from the float32 sums (gate/up's 28,672-long reduction: 1.4% of the largest
# element), and the fidelity run's worst step went to 1.07%, past the 1% bar (docs/fp8.md, "Accumulation").
FORWARD_FAST_ACCUM, INPUT_GRAD_FAST_ACCUM = True, False


@dataclass
class FP8Weight:
    codes: torch.Tensor  # (out, in) uint8: e4m3 bit patterns
    scale: torch.Tensor  # (out,) float32
    dtype: torch.dtype   # the dtype it was quantised from (merging gives it back in this dtype)

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    @property
    def e4m3(self) -> torch.Tensor:
        return self.codes.view(FP8_DTYPE)

    def to(self, device) -> FP8Weight:
        return FP8Weight(self.codes.to(device), self.scale.to(device), self.dtype)


def quantize_fp8(weight: torch.Tensor) -> FP8Weight:
    """W (out, in) as e4m3 codes with one float32 scale per output row (its amax maps to 448)."""
    codes, scale = quantize_rows(weight)
    return FP8Weight(codes.view(torch.uint8), scale.view(-1), weight.dtype)


def dequantize_fp8(fp8: FP8Weight, dtype: torch.dtype | None = None) -> torch.Tensor:
    """codes * scale in float32, rounded once to dtype (default: the dtype it was quantised from)."""
    return (fp8.e4m3.float() * fp8.scale[:, None]).to(dtype or fp8.dtype)


def fp8_alignable(linear: nn.Linear) -> bool:
    return linear.in_features % FP8_ALIGNMENT == 0 and linear.out_features % FP8_ALIGNMENT == 0


class FP8Linear(QuantisedLinear):
    """y = x @ W^T + b with the frozen W in e4m3 with per-output-channel scales, multiplied in FP8."""

    def __init__(self, fp8: FP8Weight, bias: torch.Tensor | None = None):
        super().__init__(fp8.codes, tuple(fp8.shape), bias)
        self._fp8 = fp8

    @property
    def fp8(self) -> FP8Weight:
        """The storage; its codes are always the `weight` parameter's (after a move or a load too)."""
        self._fp8.codes = self.weight.data
        if self._fp8.scale.device != self.weight.device:
            self._fp8.scale = self._fp8.scale.to(self.weight.device)
        return self._fp8

    quantise = staticmethod(quantize_fp8)

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.fp8.dtype

    def dense_weight(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        return dequantize_fp8(self.fp8, dtype)

    def _matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return FP8LinearFunction.apply(x, self, bias)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        self.fp8  # noqa: B018  (moves the scales to the codes' device; they stay float32)
        return self

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination[prefix + SCALE_KEY] = self.fp8.scale

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        scale = state_dict.pop(prefix + SCALE_KEY, None)
        if scale is not None:
            self._fp8.scale = scale.to(device=self._fp8.scale.device, dtype=torch.float32)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)


class _LastQuantised:
    """The rows quantised last, until different rows come or the tensor they were taken from dies (held by a
    weak reference): q, k and v, and gate and up, multiply the same rows and quantise them once. Rows match by
    where they are (address, shape, strides, device) and by their version counter, so a view of the same
    memory matches too: the norm that produced the rows may offer their codes (`offer_quantised`), made in
    its own pass, and the projections that read them take those."""

    key: tuple | None = None
    owner: weakref.ref | None = None
    token = 0
    quantised: tuple[torch.Tensor, torch.Tensor] | None = None

    @staticmethod
    def _key(rows: torch.Tensor) -> tuple:
        return rows.data_ptr(), rows.shape, rows.stride(), rows.device, rows.dtype, rows._version

    @classmethod
    def of(cls, x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if x2.is_inference():  # no version counter to tell a change in place: quantised every time
            return quantize_rows(x2)
        if cls.quantised is None or cls.key != cls._key(x2):
            cls.offer(x2, x2, quantize_rows(x2))
        return cls.quantised

    @classmethod
    def offer(cls, owner: torch.Tensor, rows: torch.Tensor, quantised: tuple[torch.Tensor, torch.Tensor]) -> None:
        if rows.is_inference():
            return
        cls.token += 1
        token = cls.token
        # while the owner lives its memory holds these rows (a version bump aside, which the key sees)
        cls.owner = weakref.ref(owner, lambda _: cls._drop(token))
        cls.key, cls.quantised = cls._key(rows), quantised

    @classmethod
    def _drop(cls, token: int) -> None:
        if cls.token == token:
            cls.key = cls.owner = cls.quantised = None


def offer_quantised(owner: torch.Tensor, rows: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor) -> None:
    """quantize_rows(rows) as a kernel that produced them made it (the norm before q/k/v or gate/up): the next FP8
    forward product of these rows (or of a view of the same memory, unchanged) takes it instead of quantising
    them again. owner: the tensor rows views; the offer lasts while it lives."""
    _LastQuantised.offer(owner, rows, (codes, scale))


def fp8_forward(layer: FP8Linear, x2: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x2 @ W^T (+ bias) in x2's dtype: x2 quantised per token, one FP8 GEMM with both row-wise scales and
    the bias in its epilogue, with fast accumulation (FORWARD_FAST_ACCUM)."""
    fp8 = layer.fp8
    codes, scale = _LastQuantised.of(x2)
    return fp8_matmul(codes, scale, fp8.e4m3, fp8.scale, x2.dtype, fp8_backend(x2.device), bias,
                      fast_accum=FORWARD_FAST_ACCUM)


def fp8_input_grad(layer: FP8Linear, dout: torch.Tensor) -> torch.Tensor:
    """dout @ W in dout's dtype, W = codes * scale exactly as forward used it: the scale goes onto dout's
    columns, which are then quantised per token and multiplied by the codes transposed (fp8_joined_input_grad
    of one layer)."""
    return fp8_joined_input_grad([layer], [dout])


def fp8_joined_input_grad(layers: list[FP8Linear], douts: list[torch.Tensor], row_amax: torch.Tensor | None = None
                          ) -> torch.Tensor:
    """The sum of dout_i @ W_i over projections that read the same rows (q/k/v, gate/up) as one FP8 GEMM: the
    douts, each scaled by its weight's column scale, quantised as one row (one scale per token over all of
    them), times the weights' codes stacked and transposed. Not a pass over dX per further projection to add
    its product, and one GEMM with a long reduction instead of k/v's short ones. The shared scale coarsens
    only elements below e4m3's normal range of the joined row's largest (2^-6 of 448 times smaller): their error
    stays within 2^-10 of the row's scale, the bound of every element (docs/fp8.md). row_amax: the joined rows'
    maxima in parts (of each dout times its column scale), as the GLU kernel found them writing gate's and up's."""
    if len(layers) > MAX_JOINED_PARTS:
        return fp8_joined_input_grad(layers[:MAX_JOINED_PARTS], douts[:MAX_JOINED_PARTS]).add_(
            fp8_joined_input_grad(layers[MAX_JOINED_PARTS:], douts[MAX_JOINED_PARTS:]))
    return _joined_input_grad(layers, douts, holder=None, row_amax=row_amax)


def fp8_repeated_input_grad(layer: FP8Linear) -> Callable[[torch.Tensor], torch.Tensor]:
    """fp8_input_grad(layer, ·) for several douts in a row (the row tiles of one gradient: the MLP backward's dh
    tiles): W^T's codes are transposed into the shared buffer at the first call and reused by the next ones while
    no other product has written there since (one 56 MiB transpose of the 8B shape's down weight a layer instead
    of one a tile)."""
    holder = object()
    return lambda dout: _joined_input_grad([layer], [dout], holder)


class _TransposedBuffer:
    """Which caller's codes the shared buffer of transposed codes holds: (its token, the buffer's address)."""

    holding = None


def _joined_input_grad(layers: list[FP8Linear], douts: list[torch.Tensor], holder, row_amax=None) -> torch.Tensor:
    fp8s = [layer.fp8 for layer in layers]
    backend = fp8_backend(douts[0].device)
    codes, scale = quantize_joined_rows(douts, [fp8.scale for fp8 in fp8s], row_amax)
    width, k = codes.shape[1], fp8s[0].shape[1]
    if backend == "scaled_mm":  # the GEMM's second operand column-major: the codes transposed side by side
        transposed = shared_buffer(width * k, fp8s[0].codes.device, torch.uint8, "fp8_transposed").view(k, width)
        holding = None if holder is None else (holder, transposed.data_ptr())
        if holding is None or _TransposedBuffer.holding != holding:
            start = 0
            for fp8 in fp8s:
                transpose_into(fp8.codes, transposed[:, start:start + fp8.shape[0]])
                start += fp8.shape[0]
        _TransposedBuffer.holding = holding
        weight_t = transposed.view(FP8_DTYPE)
    else:
        stacked = fp8s[0].codes if len(fp8s) == 1 else torch.cat([fp8.codes for fp8 in fp8s])
        weight_t = stacked.view(FP8_DTYPE).t()
    return fp8_matmul(codes, scale, weight_t, None, douts[0].dtype, backend, fast_accum=INPUT_GRAD_FAST_ACCUM)


# Projections whose input gradients one joined GEMM computes (they read the same rows; lora.py's q/k/v and MLP)
JOINED_PROJECTIONS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def reserve_transposed_buffer(model: nn.Module) -> None:
    """Allocates now the buffer backward transposes FP8 codes into, sized for the largest product: a joined group's
    stacked codes or one layer's. Backward would allocate it at its first product, after the memory engine has
    planned from what is allocated; here the plan counts it (112 MiB at the 8B shape, gate and up together)."""
    largest, device = 0, None
    for parent in model.modules():
        sizes = {}
        for name, child in parent.named_children():
            layer = getattr(child, "base_layer", child)  # PEFT's wrapper
            if isinstance(layer, FP8Linear):
                sizes[name], device = layer.weight.numel(), layer.weight.device
        groups = [sum(sizes.get(name, 0) for name in group) for group in JOINED_PROJECTIONS]
        largest = max([largest, *groups, *sizes.values()])
    if largest:
        shared_buffer(largest, device, torch.uint8, "fp8_transposed")


class FP8LinearFunction(torch.autograd.Function):
    """The layer's own matmul (PEFT's plain path): FP8 in forward and for dx; nothing weight-sized saved."""

    @staticmethod
    def forward(ctx, x, layer, bias):
        ctx.layer, ctx.has_bias = layer, bias is not None
        out = fp8_forward(layer, x.reshape(-1, x.shape[-1]), bias)
        return out.view(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx, dout):
        dout2 = dout.reshape(-1, dout.shape[-1])
        dx = (fp8_input_grad(ctx.layer, dout2).view(*dout.shape[:-1], -1)
              if ctx.needs_input_grad[0] else None)
        dbias = dout2.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, None, dbias


register_base_matmul(FP8Linear, fp8_forward, fp8_input_grad, fp8_joined_input_grad, fp8_repeated_input_grad,
                     row_amax_scale=lambda layer: layer.fp8.scale)

__all__ = ["E4M3_MAX", "FP8Linear", "FP8Weight", "dequantize_fp8", "fp8_alignable", "quantize_fp8"]
