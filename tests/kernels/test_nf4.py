"""NF4 storage and the Triton dequantisation kernel against bitsandbytes (0.50 runs NF4 on the CPU).

Stated bound: bit for bit. Dequantisation is float32 arithmetic with the same roundings as
bitsandbytes (nested absmax: one product and one sum; weight: one product; then one rounding to the
output dtype), so every element must be identical, in float32, float16 and bfloat16.
"""
import copy

import bitsandbytes.functional as bnbf
import pytest
import torch

from lanner.kernels.quant import dequantize, quantize_nf4
from lanner.kernels.quant.nf4 import (
    NF4_CODE_VALUES, block_absmax, dequantize_nf4_torch, dynamic_code, from_bnb_state, to_bnb_state,
)

# Odd sizes: partial 64-element blocks, an odd element count (a half-used last byte), and, in the
# last, more than 256 blocks so the nested absmax has several blocks of its own, the last partial.
SHAPES = [(1, 1), (3, 5), (7, 64), (33, 129), (130, 257)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture(autouse=True)
def _eager_bitsandbytes():
    # bitsandbytes' CPU dequantisation of rows of odd length is torch code under torch.compile; the
    # same code eagerly gives the same values without a compile per shape and dtype (~30 s each).
    with torch._dynamo.config.patch(disable=True):
        yield


def _random_weight(shape, dtype, device, seed):
    generator = torch.Generator().manual_seed(seed)
    # Heavy-ish tails, as real weights have, so absmax varies from block to block.
    weight = torch.randn(shape, generator=generator) * torch.rand(shape, generator=generator).pow(3) * 3
    return weight.to(dtype).to(device)


def _bnb(weight, double_quant):
    return bnbf.quantize_4bit(weight.cpu(), blocksize=64, compress_statistics=double_quant, quant_type="nf4")


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("double_quant", [True, False])
def test_dequantize_matches_bitsandbytes_bit_for_bit(shape, dtype, double_quant, device):
    packed, state = _bnb(_random_weight(shape, dtype, "cpu", seed=sum(shape)), double_quant)
    expected = bnbf.dequantize_4bit(packed, state)
    nf4 = from_bnb_state(packed, state.as_dict(packed=True)).to(device)
    assert nf4.nested == double_quant and nf4.dtype == dtype and nf4.shape == shape

    ours = dequantize(nf4)  # the Triton kernel (TRITON_INTERPRET=1 on the CPU)
    assert ours.dtype == dtype and ours.shape == expected.shape
    assert torch.equal(ours.cpu(), expected), (ours.cpu() - expected).abs().max()
    assert torch.equal(dequantize_nf4_torch(nf4).cpu(), expected)  # the no-Triton fallback too


def test_dequantize_into_a_given_buffer_in_another_dtype(device):
    shape = (33, 130)
    packed, state = _bnb(_random_weight(shape, torch.bfloat16, "cpu", seed=3), True)
    nf4 = from_bnb_state(packed, state.as_dict(packed=True)).to(device)
    buffer = torch.full((shape[0] * shape[1] + 11,), float("nan"), device=device)  # larger than needed
    ours = dequantize(nf4, torch.float32, out=buffer[: shape[0] * shape[1]])
    assert ours.data_ptr() == buffer.data_ptr() and ours.shape == shape
    as_float32 = copy.copy(state)
    as_float32.dtype = torch.float32
    assert torch.equal(ours.cpu(), bnbf.dequantize_4bit(packed, as_float32))
    assert buffer[shape[0] * shape[1]:].isnan().all()  # nothing written past the weight
    with pytest.raises(ValueError, match="contiguous"):
        dequantize(nf4, torch.float32, out=buffer[:10])


def test_dequantize_only_the_slices_needed(device):
    """A stack's experts asked for are written, bit for bit; the others' elements are left as they were (odd
    sizes: an expert's slice starts inside a 64-value block)."""
    shape = (5, 7, 19)
    nf4 = quantize_nf4(_random_weight(shape, torch.float32, device, seed=4))
    full = dequantize(nf4, torch.float32)
    needed = torch.tensor([False, True, False, False, True], device=device)
    out = torch.full(shape, float("nan"), device=device)
    dequantize(nf4, torch.float32, out=out.view(-1), needed=needed)
    assert torch.equal(out[needed], full[needed]) and out[~needed].isnan().all()
    with pytest.raises(ValueError, match="one flag per slice"):
        dequantize(nf4, torch.float32, needed=needed[:3])


@pytest.mark.parametrize("shape", [(1, 1), (33, 129), (130, 257)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantize_matches_bitsandbytes(shape, dtype, device):
    weight = _random_weight(shape, dtype, "cpu", seed=7)
    packed, state = _bnb(weight, True)
    ours = quantize_nf4(weight.to(device))
    assert torch.equal(ours.packed.cpu(), packed)
    assert torch.equal(ours.nested_absmax.cpu(), state.state2.absmax)
    assert ours.offset == state.offset.item()
    assert torch.equal(ours.code.cpu(), state.code) and torch.equal(ours.nested_code.cpu(), state.state2.code)
    # The nested absmax codes: ours is the nearest code (bitsandbytes' reference torch backend);
    # its CPU kernel (checked here) binary-searches the dynamic map and now and then lands one code off.
    # So: the same code almost everywhere, and where not, ours is the nearer absmax.
    differ = ours.absmax.cpu() != state.absmax
    if shape == (1, 1):  # one block: absmax - offset is 0, which bitsandbytes scales by 1/0; any code gives 0
        differ[:] = False
    exact = bnbf.quantize_4bit(weight, blocksize=64, compress_statistics=False, quant_type="nf4")[1].absmax
    theirs_absmax = bnbf.dequantize_blockwise(state.absmax, state.state2) + state.offset
    assert differ.float().mean() <= 0.02
    assert ((block_absmax(ours).cpu() - exact).abs() <= (theirs_absmax - exact).abs() + 1e-7 * exact).all()
    equal_blocks = ~differ.repeat_interleave(64)[: weight.numel()].view(shape)
    assert torch.equal(dequantize(ours).cpu()[equal_blocks], bnbf.dequantize_4bit(packed, state)[equal_blocks])


@pytest.mark.parametrize("chunk, blocksize", [(200, 64), (64, 64), (3, 1)])
def test_quantising_in_chunks_stores_the_same_codes(monkeypatch, chunk, blocksize):
    """quantize_nf4 works through a large weight a chunk of whole blocks at a time: the same codes and
    statistics as in one go (an odd element count, a partial last block, several nested blocks)."""
    from lanner.kernels.quant import nf4

    weight = _random_weight((130, 257), torch.bfloat16, "cpu", seed=3)
    whole = quantize_nf4(weight, blocksize)
    monkeypatch.setattr(nf4, "QUANTIZE_CHUNK", chunk)
    chunks = []
    blockwise = nf4._blockwise_absmax
    monkeypatch.setattr(nf4, "_blockwise_absmax", lambda flat, size: (chunks.append(flat.numel()), blockwise(flat, size))[1])
    chunked = quantize_nf4(weight, blocksize)
    assert max(chunks[:-1]) <= max(chunk, blocksize) + 1 and sum(chunks[:-1]) == weight.numel()  # the last: nested
    for field in ("packed", "absmax", "nested_absmax"):
        assert torch.equal(getattr(chunked, field), getattr(whole, field)), field
    assert chunked.offset == whole.offset


def test_tables_are_bitsandbytes_tables():
    assert torch.equal(torch.tensor(NF4_CODE_VALUES), bnbf.get_4bit_type("nf4", device="cpu"))
    assert torch.equal(dynamic_code(), bnbf.create_dynamic_map())


def test_state_dict_format_is_bitsandbytes(device):
    packed, state = _bnb(_random_weight((33, 129), torch.bfloat16, "cpu", seed=9), True)
    ours = to_bnb_state(quantize_nf4(_random_weight((33, 129), torch.bfloat16, device, seed=9)))
    theirs = state.as_dict(packed=True)
    assert ours.keys() == theirs.keys()
    for key in theirs:
        assert torch.equal(ours[key].cpu(), theirs[key]), key
    # and bitsandbytes reads ours back as its own
    restored = bnbf.QuantState.from_dict({k: v.cpu() for k, v in ours.items()}, device="cpu")
    assert torch.equal(bnbf.dequantize_4bit(packed, restored), bnbf.dequantize_4bit(packed, state))


def test_bad_storage_is_refused_clearly():
    packed, state = bnbf.quantize_4bit(torch.randn(8, 16), blocksize=64, quant_type="fp4")
    with pytest.raises(ValueError, match="only NF4"):
        from_bnb_state(packed, state.as_dict(packed=True))
    packed, state = _bnb(torch.randn(8, 16), True)
    with pytest.raises(ValueError, match="packed bytes"):
        from_bnb_state(packed[:10], state.as_dict(packed=True))
    with pytest.raises(ValueError, match="quant_state"):
        from_bnb_state(packed, {"absmax": state.absmax})
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        quantize_nf4(torch.ones(4, 4, dtype=torch.int32))
