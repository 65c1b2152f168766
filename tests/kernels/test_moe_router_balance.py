"""The studio's per-step router load balance (lanner.worker.training.router_balance) on a tiny Qwen3-MoE:
the same figures on lanner.kernels (the experts on the grouped kernels, checkpointed layers recomputing
their routers) as on plain PEFT, and padding left out."""
import pytest
import torch

from lanner.kernels.patching.binding import is_patched
from lanner.worker.training.router_balance import RouterBalance

from lora_twins import token_batches, twins

# On a GPU the sums stay there and each step's figures come back behind the step (a CUDA event).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def one_step(model, balance: RouterBalance, step: int, input_ids, attention_mask) -> dict[str, float]:
    model.train()
    model(input_ids=input_ids, attention_mask=attention_mask, labels=input_ids).loss.backward()
    balance.end_step(step)
    return balance.step_values(step)


def test_the_kernels_path_counts_the_balance_plain_peft_counts():
    plain, fast = twins("qwen3_moe", device=DEVICE, gradient_checkpointing=True)
    assert any(is_patched(module) for module in fast.modules())
    balances = RouterBalance.of(plain), RouterBalance.of(fast)
    assert balances[0].layers == balances[1].layers == 2
    for step, ids in enumerate(token_batches(2, 3, 16, 96, device=DEVICE), start=1):
        mask = torch.ones_like(ids)
        plain_values, fast_values = (one_step(model, balance, step, ids, mask)
                                     for model, balance in zip((plain, fast), balances))
        assert set(plain_values) == {"router_aux_loss", "router_max_load"}
        assert 1 <= plain_values["router_aux_loss"] and 1 <= plain_values["router_max_load"] <= 2
        for key, value in plain_values.items():
            assert fast_values[key] == pytest.approx(value, abs=1e-4), (key, step)


def test_padding_is_not_counted_and_eval_forwards_are_not_either():
    plain, _ = twins("qwen3_moe")
    balance = RouterBalance.of(plain)
    ids = token_batches(1, 2, 16, 96)[0]
    alone = one_step(plain, balance, 1, ids[:1], torch.ones_like(ids[:1]))
    mask = torch.ones_like(ids)
    mask[1] = 0  # the second row is all padding
    plain.eval()
    with torch.no_grad():
        plain(input_ids=ids)
    padded = one_step(plain, balance, 2, ids, mask)
    assert padded == alone
    assert balance.step_values(3) == {}
