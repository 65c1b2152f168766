"""fast_path_blocker and lora_projection read PEFT's layers through their own dicts: each reason still found."""
import pytest
import torch
from peft import LoraConfig, get_peft_model
from torch import nn

from lanner.kernels.peft_projections import fast_path_blocker, lora_projection


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(16, 16, bias=True)

    def forward(self, x):
        return self.q_proj(x)


def _adapted(**config):
    model = get_peft_model(_Block(), LoraConfig(r=4, target_modules=["q_proj"], **config))
    return model, model.base_model.model.q_proj


def _hook(model, layer):
    layer.register_forward_hook(lambda *args: None)


def _disable(model, layer):
    layer.enable_adapters(False)


def _trainable_base(model, layer):
    layer.get_base_layer().bias.requires_grad_(True)


def _accelerate_hook(model, layer):
    layer.get_base_layer()._hf_hook = object()


def _offloaded(model, layer):
    base = layer.get_base_layer()
    base.weight = nn.Parameter(torch.empty(16, 16, device="meta"), requires_grad=False)


def _second_adapter(model, layer):
    model.add_adapter("other", LoraConfig(r=4, target_modules=["q_proj"]))
    model.base_model.set_adapter(["default", "other"])


CASES = {
    "hooks": (_hook, {}, "forward hooks"),
    "disabled": (_disable, {}, "disabled or merged"),
    "trainable base": (_trainable_base, {}, "base bias is trainable"),
    "accelerate": (_accelerate_hook, {}, "accelerate hooks"),
    "offloaded": (_offloaded, {}, "base weight is offloaded"),
    "two adapters": (_second_adapter, {}, "2 active adapters"),
    "dropout": (None, dict(lora_dropout=0.1), "lora_dropout > 0"),
    "lora bias": (None, dict(lora_bias=True), "LoRA bias"),
    "dora": (None, dict(use_dora=True), "DoRA"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_blocker_reasons(case):
    change, config, reason = CASES[case]
    model, layer = _adapted(**config)
    if change is None:
        assert fast_path_blocker(layer) is not None and reason in fast_path_blocker(layer)
        return
    assert fast_path_blocker(layer) is None
    change(model, layer)
    assert reason in (fast_path_blocker(layer) or "")


def test_projection_is_the_active_adapter_on_the_innermost_base():
    _, layer = _adapted()
    projection = lora_projection(layer)
    assert projection.base is layer.get_base_layer() and isinstance(projection.base, nn.Linear)
    assert projection.lora_A is layer.lora_A["default"].weight and projection.lora_B is layer.lora_B["default"].weight
    assert projection.scaling == layer.scaling["default"]
    plain = nn.Linear(16, 16).requires_grad_(False)
    assert fast_path_blocker(plain) is None and lora_projection(plain).base is plain
