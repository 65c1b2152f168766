"""NF4 storage in bitsandbytes' format: quantise, dequantise, and translate to and from its state dict.

An `NF4Weight` holds exactly what bitsandbytes' `Params4bit` + `QuantState` hold for quant_type
"nf4": the packed codes (uint8, shape (ceil(n/2), 1)), the per-block absmax, and with double
quantisation the absmax as 8-bit codes into bitsandbytes' dynamic map with their own float32
scales and offset. Quantisation follows bitsandbytes' reference algorithm (its torch backend):
scale each block by 1/absmax, clamp to [-1, 1], take the nearest code by the midpoints between
codes (a value on a midpoint goes down). Dequantisation runs on the Triton kernel
(`ops.nf4.dequantize_nf4`) on a GPU or under TRITON_INTERPRET=1, else in plain torch with the
same float32 arithmetic.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace

import torch

# bitsandbytes' NF4 table (functional.get_4bit_type("nf4")), in code order.
NF4_CODE_VALUES = (
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
    0.7229568362236023, 1.0,
)
BLOCKSIZE = 64
# Elements quantize_nf4 quantises at a time (rounded down to whole blocks, and even); tests may shrink it.
QUANTIZE_CHUNK = 1 << 26
NESTED_BLOCKSIZE = 256
QUANT_STATE_KEY = "quant_state.bitsandbytes__nf4"
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def nf4_code(device=None) -> torch.Tensor:
    return torch.tensor(NF4_CODE_VALUES, dtype=torch.float32, device=device)


def dynamic_code(device=None) -> torch.Tensor:
    """bitsandbytes' signed 8-bit dynamic map (functional.create_dynamic_map()), used for the nested absmax."""
    data = []
    max_exponent_bits, non_sign_bits = 7, 7
    for i in range(max_exponent_bits):
        fraction_items = 2 ** (i + non_sign_bits - max_exponent_bits) + 1
        boundaries = torch.linspace(0.1, 1, fraction_items, dtype=torch.float32)
        means = (boundaries[:-1] + boundaries[1:]) / 2.0
        data += ((10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
        data += (-(10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
    data += [0, 1.0]
    data += [0] * (256 - len(data))
    return torch.tensor(sorted(data), dtype=torch.float32, device=device)


@dataclass
class NF4Weight:
    """One weight in NF4: packed codes and the statistics that scale them (see the module docstring)."""

    packed: torch.Tensor  # uint8, (ceil(n / 2), 1)
    absmax: torch.Tensor  # float32 per block, or uint8 codes when nested
    code: torch.Tensor  # the 16 float32 NF4 values
    shape: torch.Size
    dtype: torch.dtype  # the dtype the weight had, and dequantises to by default
    blocksize: int = BLOCKSIZE
    nested_absmax: torch.Tensor | None = None  # float32, one per NESTED_BLOCKSIZE blocks
    nested_code: torch.Tensor | None = None  # the 256 float32 values of the dynamic map
    offset: float = 0.0  # the mean absmax, subtracted before the nested quantisation

    @property
    def nested(self) -> bool:
        return self.nested_absmax is not None

    @property
    def device(self) -> torch.device:
        return self.packed.device

    def to(self, device) -> NF4Weight:
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return replace(self, packed=move(self.packed), absmax=move(self.absmax), code=move(self.code),
                       nested_absmax=move(self.nested_absmax), nested_code=move(self.nested_code))

    def over(self, packed: torch.Tensor) -> NF4Weight:
        """This weight over `packed` (its codes, wherever a move of their module put them): the statistics
        follow them to their device."""
        self.packed = packed
        return self if self.absmax.device == packed.device else self.to(packed.device)

    def numel(self) -> int:
        return self.shape.numel()

    def nbytes(self) -> int:
        tensors = (self.packed, self.absmax, self.code, self.nested_absmax, self.nested_code)
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def _blockwise_absmax(flat: torch.Tensor, blocksize: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(absmax per block, flat scaled into [-1, 1]); a last partial block gets its own absmax.
    An all-zero block stores absmax 0 (as bitsandbytes' CUDA and CPU kernels do) and scales by 1e38."""
    n = flat.numel()
    full = n - n % blocksize
    blocks = flat[:full].view(-1, blocksize)
    absmax = blocks.abs().amax(dim=1)
    scaled = torch.clamp(blocks * (1.0 / absmax.clamp(min=1e-38)).view(-1, 1), -1, 1).reshape(-1)
    if full < n:
        tail_max = flat[full:].abs().max()
        absmax = torch.cat([absmax, tail_max.view(1)])
        scaled = torch.cat([scaled, torch.clamp(flat[full:] / tail_max.clamp(min=1e-38), -1, 1)])
    return absmax, scaled


def _nearest_code(scaled: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
    midpoints = (code[:-1] + code[1:]) / 2
    return torch.bucketize(scaled, midpoints, out_int32=True).to(torch.uint8)


@torch.no_grad()
def quantize_nf4(weight: torch.Tensor, blocksize: int = BLOCKSIZE, double_quant: bool = True) -> NF4Weight:
    """`weight` (float32/float16/bfloat16, any shape) in NF4 on its own device, as bitsandbytes'
    quantize_4bit(weight, blocksize, compress_statistics=double_quant, quant_type="nf4") stores it."""
    if weight.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"NF4 quantises float32, float16 or bfloat16 weights, not {weight.dtype}")
    if blocksize <= 0 or blocksize & (blocksize - 1):
        raise ValueError(f"blocksize must be a power of two, not {blocksize}")
    device = weight.device
    code = nf4_code(device)
    flat = weight.reshape(-1)
    # A chunk of whole blocks at a time (the same codes as all at once): the float32 temporaries, ~16 bytes
    # an element, stay near a GiB for a stacked expert weight of billions of elements too.
    chunk = max(QUANTIZE_CHUNK // blocksize, 1) * blocksize
    chunk += chunk % 2  # a chunk's last byte holds two of its own codes
    packed, absmax = [], []
    for start in range(0, flat.numel(), chunk):
        block_absmax, scaled = _blockwise_absmax(flat[start:start + chunk].float(), blocksize)
        if scaled.numel() % 2:
            scaled = torch.nn.functional.pad(scaled, (0, 1))
        q = _nearest_code(scaled, code)
        packed.append((q[::2] << 4) | q[1::2])
        absmax.append(block_absmax)
        del scaled, q
    absmax = torch.cat(absmax) if len(absmax) > 1 else absmax[0]
    packed = (torch.cat(packed) if len(packed) > 1 else packed[0]).unsqueeze(1)
    nf4 = NF4Weight(packed=packed, absmax=absmax, code=code, shape=weight.shape, dtype=weight.dtype,
                    blocksize=blocksize)
    if not double_quant:
        return nf4
    offset = absmax.mean()
    nested_code = dynamic_code(device)
    nested_absmax, scaled_absmax = _blockwise_absmax(absmax - offset, NESTED_BLOCKSIZE)
    return replace(nf4, absmax=_nearest_code(scaled_absmax, nested_code), nested_absmax=nested_absmax,
                   nested_code=nested_code, offset=offset.item())


def triton_available(device: torch.device) -> bool:
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def block_absmax(nf4: NF4Weight) -> torch.Tensor:
    """The float32 absmax of every block (the nested codes dequantised, as bitsandbytes does)."""
    if not nf4.nested:
        return nf4.absmax
    nested = nf4.nested_code[nf4.absmax.long()]
    blocks = nested.numel()
    scales = nf4.nested_absmax.repeat_interleave(NESTED_BLOCKSIZE)[:blocks]
    return nested * scales + torch.tensor(nf4.offset, dtype=torch.float32, device=nested.device)


def dequantize_nf4_torch(nf4: NF4Weight, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The dense weight in plain torch (for CPUs without the Triton interpreter); same float32 arithmetic."""
    n = nf4.numel()
    packed = nf4.packed.reshape(-1)
    codes = torch.stack([packed >> 4, packed & 0xF], dim=1).reshape(-1)[:n].long()
    scales = block_absmax(nf4).repeat_interleave(nf4.blocksize)[:n]
    return (nf4.code[codes] * scales).to(dtype or nf4.dtype).view(nf4.shape)


def dequantize(nf4: NF4Weight, dtype: torch.dtype | None = None, out: torch.Tensor | None = None,
               needed: torch.Tensor | None = None) -> torch.Tensor:
    """The dense weight (nf4.dtype unless told), on the Triton kernel when it can run, else in torch. needed (a
    bool per slice of the first dimension, on the Triton kernel): only those slices are written into out."""
    dtype = dtype or nf4.dtype
    if not triton_available(nf4.device):
        dense = dequantize_nf4_torch(nf4, dtype)
        return dense if out is None else out.view(nf4.shape).copy_(dense)
    from ..ops.nf4 import dequantize_nf4

    return dequantize_nf4(nf4.packed, nf4.absmax, nf4.code, tuple(nf4.shape), dtype, nf4.blocksize,
                          nf4.nested_absmax, nf4.nested_code, nf4.offset, out, needed)


# bitsandbytes' state-dict format: "<prefix>weight" holds the packed codes, and these keys beside it.
def to_bnb_state(nf4: NF4Weight) -> dict[str, torch.Tensor]:
    """The tensors bitsandbytes' Linear4bit writes after "<prefix>weight." (QuantState.as_dict(packed=True))."""
    state = {"absmax": nf4.absmax, "quant_map": nf4.code}
    meta = {"quant_type": "nf4", "blocksize": nf4.blocksize, "dtype": str(nf4.dtype).removeprefix("torch."),
            "shape": list(nf4.shape)}
    if nf4.nested:
        state["nested_absmax"] = nf4.nested_absmax
        state["nested_quant_map"] = nf4.nested_code.clone()
        meta.update(nested_blocksize=NESTED_BLOCKSIZE, nested_dtype="float32", nested_offset=nf4.offset)
    state[QUANT_STATE_KEY] = torch.tensor(list(json.dumps(meta).encode("utf-8")), dtype=torch.uint8)
    return state


def from_bnb_state(packed: torch.Tensor, state: dict[str, torch.Tensor]) -> NF4Weight:
    """An NF4Weight from the packed codes and the tensors bitsandbytes saved after "<prefix>weight."."""
    packed_meta = [k for k in state if k.startswith("quant_state.bitsandbytes__")]
    if len(packed_meta) != 1:
        raise ValueError(f"expected one quant_state.bitsandbytes__* entry, found {packed_meta or 'none'}")
    if packed_meta[0] != QUANT_STATE_KEY:
        raise ValueError(f"only NF4 is supported, not {packed_meta[0].rsplit('__', 1)[-1]!r}")
    meta = json.loads(bytes(state[QUANT_STATE_KEY].cpu().tolist()).decode("utf-8"))
    if packed.dtype != torch.uint8:
        raise ValueError(f"only uint8 storage of NF4 codes is supported, not {packed.dtype}")
    shape = torch.Size(meta["shape"])
    if packed.numel() != (shape.numel() + 1) // 2:
        raise ValueError(f"{packed.numel()} packed bytes do not hold a weight of shape {tuple(shape)}")
    nested = "nested_absmax" in state
    if nested and meta.get("nested_blocksize", NESTED_BLOCKSIZE) != NESTED_BLOCKSIZE:
        raise ValueError(f"nested blocksize {meta['nested_blocksize']} is not supported (only {NESTED_BLOCKSIZE})")
    return NF4Weight(
        packed=packed.reshape(-1, 1),
        absmax=state["absmax"],
        code=state["quant_map"].float(),
        shape=shape,
        dtype=getattr(torch, meta["dtype"]),
        blocksize=int(meta["blocksize"]),
        nested_absmax=state["nested_absmax"].float() if nested else None,
        nested_code=state["nested_quant_map"].float() if nested else None,
        offset=float(meta["nested_offset"]) if nested else 0.0,
    )


BNB_STATE_KEYS = ("absmax", "quant_map", "nested_absmax", "nested_quant_map", QUANT_STATE_KEY)
