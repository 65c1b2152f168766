"""Padding-free packing: the layout pack_samples builds, and packed training equal to unpacked."""
import pytest
import torch

from lanner.kernels import get_lora_model
from lanner.kernels.packing import IGNORE_INDEX, pack_samples, padded_tokens
from lora_twins import lora_grads, max_relative_error, randomise_lora, tiny_model

LOSS_RTOL, GRAD_RTOL = 1e-5, 1e-4


def _samples(lengths, vocab=96, seed=4):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=generator).tolist() for n in lengths]


def test_layout_positions_and_labels():
    samples = _samples([5, 2, 7, 3, 1])
    labels = [list(s) for s in samples]
    labels[2][:3] = [IGNORE_INDEX] * 3  # a masked prompt survives packing
    packed = pack_samples(samples, max_length=9, labels=labels, pad_token_id=0)
    assert packed.input_ids.shape == (2, 9)
    seen = sorted(i for row in packed.samples for i, _, _ in row)
    assert seen == list(range(5))
    for r, row in enumerate(packed.samples):
        for i, start, n in row:
            assert packed.input_ids[r, start:start + n].tolist() == samples[i]
            assert packed.position_ids[r, start:start + n].tolist() == list(range(n))
            assert packed.labels[r, start].item() == IGNORE_INDEX  # never predicted from the previous sample
            assert packed.labels[r, start + 1:start + n].tolist() == labels[i][1:]
    assert packed.real_tokens == 18 and packed.padding_fraction == pytest.approx(0.0)
    assert padded_tokens([5, 2, 7, 3, 1], batch_size=2) == 2 * 5 + 2 * 7 + 1


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="more than max_length"):
        pack_samples([[1, 2, 3]], max_length=2)
    with pytest.raises(ValueError, match="is empty"):
        pack_samples([[1], []], max_length=4)
    with pytest.raises(ValueError, match="labels"):
        pack_samples([[1, 2]], max_length=4, labels=[[1]])
    with pytest.raises(ValueError, match="pad_to"):
        pack_samples([[1, 2, 3]], max_length=4, pad_to=2)


def test_packed_training_equals_unpacked(device):
    """Per-sample losses from one packed row equal each sample run alone; so do the training loss and gradients."""
    model = get_lora_model(tiny_model("llama", device=device), gradient_checkpointing=True)
    randomise_lora(model)
    samples = _samples([6, 3, 8])
    packed = pack_samples(samples, max_length=32)
    assert packed.input_ids.shape[0] == 1
    inputs = {k: v.to(device) for k, v in packed.as_model_inputs().items()}

    model.eval()
    with torch.no_grad():
        packed_logits = model(input_ids=inputs["input_ids"], position_ids=inputs["position_ids"]).logits[0]
        for i, start, n in packed.samples[0]:
            ids = torch.tensor([samples[i]], device=device)
            alone = model(input_ids=ids).logits[0]
            torch.testing.assert_close(packed_logits[start:start + n], alone, rtol=1e-5, atol=1e-5)

    model.train()
    n_items = sum(len(s) - 1 for s in samples)
    loss = model(**inputs, num_items_in_batch=torch.tensor(n_items, device=device)).loss
    loss.backward()
    packed_grads = lora_grads(model)
    model.zero_grad(set_to_none=True)
    unpacked = 0.0
    for s in samples:
        ids = torch.tensor([s], device=device)
        one = model(input_ids=ids, labels=ids, num_items_in_batch=torch.tensor(n_items, device=device)).loss
        one.backward()
        unpacked += one.detach()
    torch.testing.assert_close(loss.detach(), unpacked, rtol=LOSS_RTOL, atol=0)
    assert max_relative_error(packed_grads, lora_grads(model)) < GRAD_RTOL


def test_without_position_ids_samples_would_see_each_other(device):
    """The check above can fail: with positions 0..T-1 and one causal mask, later samples change."""
    model = get_lora_model(tiny_model("llama", device=device), gradient_checkpointing=False).eval()
    samples = _samples([6, 5])
    packed = pack_samples(samples, max_length=16)
    (i, start, n) = next(p for p in packed.samples[0] if p[1] > 0)
    with torch.no_grad():
        crossing = model(input_ids=packed.input_ids.to(device)).logits[0, start:start + n]
        alone = model(input_ids=torch.tensor([samples[i]], device=device)).logits[0]
    assert not torch.allclose(crossing, alone, atol=1e-3)
