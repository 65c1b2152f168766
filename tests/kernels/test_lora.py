"""The LoRA autograd functions against PEFT's own LoRA layers (forward, dX, and the A/B gradients)."""
import pytest
import torch
from peft import LoraConfig, get_peft_model
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from lanner.kernels import LoRAProjection, lora_linear, lora_mlp, lora_qkv, register_base_weight
from lanner.kernels.peft_projections import lora_projection

# Relative to the largest reference element. float32: same math, other summation order. bfloat16:
# PEFT runs the low-rank path in float32 (its adapter weights are float32), these functions in
# bfloat16 like the base matmul, so results differ by a few bf16 roundings of O(1) values.
TOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2}
HIDDEN, INTERMEDIATE, HEADS, KV_HEADS = 48, 80, 4, 2
ACTIVATIONS = {"silu": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh"}


def _peft_layer(config_cls, model_cls, dtype, device, targets, **config):
    config = config_cls(hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_hidden_layers=1,
                        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=32, **config)
    model = model_cls(config).to(device=device, dtype=dtype)
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=targets, lora_dropout=0.0))
    # B starts at zero in PEFT; random factors make the low-rank path (and its gradients) visible.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.normal_(0, 0.2)
    return model.base_model.model.model.layers[0]


def _input(shape, dtype, device):
    return torch.randn(shape, device=device).to(dtype).requires_grad_()


def _lora_params(module):
    return {name: p for name, p in module.named_parameters() if p.requires_grad}


def _run(fn, x, module, douts):
    """Runs fn(x) -> outputs, backpropagates douts, returns outputs, dX and the LoRA grads (cleared after)."""
    x = x.detach().clone().requires_grad_()
    outs = fn(x)
    outs = outs if isinstance(outs, tuple) else (outs,)
    torch.autograd.backward(outs, douts)
    grads = {name: p.grad.clone() for name, p in _lora_params(module).items()}
    for p in _lora_params(module).values():
        p.grad = None
    return [o.detach() for o in outs], x.grad, grads


def _assert_close(actual, expected, tol):
    atol = tol * expected.abs().max().item()
    torch.testing.assert_close(actual.double(), expected.double(), rtol=tol, atol=atol)


def _assert_same_results(ours, reference, tol):
    (outs, dx, grads), (ref_outs, ref_dx, ref_grads) = ours, reference
    for out, ref in zip(outs, ref_outs, strict=True):
        assert out.dtype == ref.dtype and out.shape == ref.shape
        _assert_close(out, ref, tol)
    _assert_close(dx, ref_dx, tol)
    assert grads.keys() == ref_grads.keys() and grads
    for name in grads:
        assert grads[name].dtype == ref_grads[name].dtype, name
        _assert_close(grads[name], ref_grads[name], tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("hf_activation", list(ACTIVATIONS))
def test_lora_mlp_matches_peft(hf_activation, dtype, device):
    layer = _peft_layer(LlamaConfig, LlamaForCausalLM, dtype, device, ["gate_proj", "up_proj", "down_proj"],
                        hidden_act=hf_activation)
    mlp = layer.mlp
    x = _input((2, 5, HIDDEN), dtype, device)
    dout = torch.randn(2, 5, HIDDEN, device=device).to(dtype)
    projections = [lora_projection(m) for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj)]

    ours = _run(lambda x: lora_mlp(x, *projections, ACTIVATIONS[hf_activation]), x, mlp, (dout,))
    reference = _run(mlp, x, mlp, (dout,))
    _assert_same_results(ours, reference, TOL[dtype])


@pytest.mark.parametrize("tile_rows", [3, 4])  # 10 rows: tiles of 3, 3, 3, 1 and of 4, 4, 2
def test_lora_mlp_over_row_tiles_matches_peft(tile_rows, device):
    """Long sequences: the MLP over row tiles, saving only its input (backward recomputes each tile)."""
    layer = _peft_layer(LlamaConfig, LlamaForCausalLM, torch.float32, device, ["gate_proj", "up_proj", "down_proj"])
    mlp = layer.mlp
    x = _input((2, 5, HIDDEN), torch.float32, device)
    dout = torch.randn(2, 5, HIDDEN, device=device)
    projections = [lora_projection(m) for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj)]

    ours = _run(lambda x: lora_mlp(x, *projections, "silu", tile_rows=tile_rows), x, mlp, (dout,))
    reference = _run(mlp, x, mlp, (dout,))
    _assert_same_results(ours, reference, TOL[torch.float32])


@pytest.mark.parametrize("tile_rows, dh_tile_rows", [(None, 3), (None, 4), (4, 3)])
def test_lora_mlp_backward_over_dh_tiles_matches_peft(tile_rows, dh_tile_rows, device):
    """The MLP's backward building dh a few rows at a time (10 rows: dh tiles of 3, 3, 3, 1 and 4, 4,
    2), on its own and inside row tiles of 4, with and without the rank-r product saved."""
    layer = _peft_layer(LlamaConfig, LlamaForCausalLM, torch.float32, device, ["gate_proj", "up_proj", "down_proj"])
    mlp = layer.mlp
    x = _input((2, 5, HIDDEN), torch.float32, device)
    dout = torch.randn(2, 5, HIDDEN, device=device)
    projections = [lora_projection(m) for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj)]

    ours = _run(lambda x: lora_mlp(x, *projections, "silu", tile_rows=tile_rows, dh_tile_rows=dh_tile_rows),
                x, mlp, (dout,))
    reference = _run(mlp, x, mlp, (dout,))
    _assert_same_results(ours, reference, TOL[torch.float32])


@pytest.mark.parametrize("dh_tile_rows", [None, 4])
def test_lora_mlp_on_no_rows_gives_empty_outputs_and_zero_gradients(dh_tile_rows, device):
    layer = _peft_layer(LlamaConfig, LlamaForCausalLM, torch.float32, device, ["gate_proj", "up_proj", "down_proj"])
    mlp = layer.mlp
    projections = [lora_projection(m) for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj)]
    x = _input((1, 0, HIDDEN), torch.float32, device)
    out = lora_mlp(x, *projections, "silu", dh_tile_rows=dh_tile_rows)
    out.sum().backward()
    assert out.shape == (1, 0, HIDDEN) and x.grad.shape == (1, 0, HIDDEN)
    grads = [p.grad for p in _lora_params(mlp).values()]
    assert len(grads) == 6 and all(g is not None and not g.any() for g in grads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_lora_qkv_matches_peft(family, dtype, device):
    classes = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[family]
    attention = _peft_layer(*classes, dtype, device, ["q_proj", "k_proj", "v_proj"]).self_attn
    if family == "qwen2":  # Qwen2's q/k/v biases: frozen, nonzero
        assert attention.q_proj.base_layer.bias is not None
        with torch.no_grad():
            for proj in (attention.q_proj, attention.k_proj, attention.v_proj):
                proj.base_layer.bias.normal_()
    modules = (attention.q_proj, attention.k_proj, attention.v_proj)
    x = _input((3, 4, HIDDEN), dtype, device)
    douts = tuple(torch.randn(3, 4, m.out_features, device=device).to(dtype) for m in modules)

    ours = _run(lambda x: lora_qkv(x, *(lora_projection(m) for m in modules)), x, attention, douts)
    reference = _run(lambda x: tuple(m(x) for m in modules), x, attention, douts)
    _assert_same_results(ours, reference, TOL[dtype])


def test_lora_qkv_with_an_unadapted_projection(device):
    """Targets q and v only: k is a plain frozen linear inside the same function."""
    attention = _peft_layer(LlamaConfig, LlamaForCausalLM, torch.float32, device, ["q_proj", "v_proj"]).self_attn
    modules = (attention.q_proj, attention.k_proj, attention.v_proj)
    assert type(attention.k_proj) is nn.Linear
    x = _input((2, 3, HIDDEN), torch.float32, device)
    douts = tuple(torch.randn(2, 3, m.out_features, device=device) for m in modules)

    ours = _run(lambda x: lora_qkv(x, *(lora_projection(m) for m in modules)), x, attention, douts)
    reference = _run(lambda x: tuple(m(x) for m in modules), x, attention, douts)
    _assert_same_results(ours, reference, TOL[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_lora_output_projection_matches_peft(dtype, device):
    attention = _peft_layer(LlamaConfig, LlamaForCausalLM, dtype, device, ["o_proj"]).self_attn
    x = _input((1, 7, HIDDEN), dtype, device)
    dout = torch.randn(1, 7, HIDDEN, device=device).to(dtype)

    ours = _run(lambda x: lora_linear(x, lora_projection(attention.o_proj)), x, attention, (dout,))
    reference = _run(attention.o_proj, x, attention, (dout,))
    _assert_same_results(ours, reference, TOL[dtype])


def test_base_weights_get_no_gradient(device):
    layer = _peft_layer(LlamaConfig, LlamaForCausalLM, torch.float32, device, ["gate_proj", "up_proj", "down_proj"])
    mlp = layer.mlp
    x = _input((2, 3, HIDDEN), torch.float32, device)
    lora_mlp(x, *(lora_projection(m) for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj)), "silu").sum().backward()
    assert all(m.base_layer.weight.grad is None for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))
    assert all(p.grad is not None for p in _lora_params(mlp).values())


def test_lora_mlp_saves_only_the_input_gate_up_and_rank_r_products(device):
    layer = _peft_layer(LlamaConfig, LlamaForCausalLM, torch.float32, device, ["gate_proj", "up_proj", "down_proj"])
    mlp = layer.mlp
    x = _input((2, 5, HIDDEN), torch.float32, device)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        lora_mlp(x, *(lora_projection(m) for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj)), "silu")
    tokens, rank = 10, 4
    assert sorted(tuple(t.shape) for t in saved) == sorted([
        (tokens, HIDDEN),                                # the block input
        (tokens, INTERMEDIATE), (tokens, INTERMEDIATE),  # gate and up: the activation is recomputed
        (tokens, rank), (tokens, rank), (tokens, rank),  # x @ A^T for gate and up, h @ A^T for down
    ])


class Int8Linear(nn.Module):
    """A frozen linear kept as int8 with per-row scales: its dense weight exists only while in use."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        scale = weight.abs().amax(dim=1, keepdim=True) / 127
        self.register_buffer("qweight", torch.round(weight / scale).to(torch.int8))
        self.register_buffer("scale", scale)
        self.bias = None
        self.dequantised = 0

    def dense_weight(self) -> torch.Tensor:
        self.dequantised += 1
        return self.qweight.float() * self.scale


def test_base_weight_is_read_on_demand_in_forward_and_backward(device):
    """The hook a quantised base plugs into: the dense weight is made in forward and again in backward."""
    register_base_weight(Int8Linear, Int8Linear.dense_weight)
    weight = torch.randn(24, 16, device=device)
    base = Int8Linear(weight).to(device)
    A = (torch.randn(4, 16, device=device) * 0.2).requires_grad_()
    B = (torch.randn(24, 4, device=device) * 0.2).requires_grad_()
    projection = LoRAProjection(base, A, B, scaling=2.0)
    x = _input((3, 16), torch.float32, device)

    out = lora_linear(x, projection)
    assert base.dequantised == 1
    out.backward(torch.ones_like(out))
    assert base.dequantised == 2

    dense = base.qweight.float() * base.scale
    x_ref = x.detach().clone().requires_grad_()
    A_ref, B_ref = A.detach().clone().requires_grad_(), B.detach().clone().requires_grad_()
    ref = x_ref @ dense.t() + 2.0 * (x_ref @ A_ref.t()) @ B_ref.t()
    ref.backward(torch.ones_like(ref))
    for actual, expected in ((out, ref), (x.grad, x_ref.grad), (A.grad, A_ref.grad), (B.grad, B_ref.grad)):
        _assert_close(actual.detach(), expected.detach(), TOL[torch.float32])


def test_factor_casts_are_made_once_and_follow_every_update(device):
    """bf16 compute over float32 factors: one cast a factor until the factor changes, whether by a fused
    optimizer's step (which does not bump the version counter), by an in-place write (which does), or never."""
    from lanner.kernels.lora import factor_in

    layer = _peft_layer(LlamaConfig, LlamaForCausalLM, torch.float32, device, ["o_proj"]).self_attn.o_proj
    A, B = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    with torch.no_grad():
        B.normal_()  # PEFT starts B at zero
        first = factor_in(A, torch.bfloat16)
        assert factor_in(A, torch.bfloat16) is first and factor_in(B, torch.bfloat16, 2.0) is factor_in(B, torch.bfloat16, 2.0)
        torch.testing.assert_close(factor_in(B, torch.bfloat16, 2.0), (B * 2).bfloat16(), rtol=0, atol=0)
    assert factor_in(A, torch.float32) is A
    assert torch.is_grad_enabled() and factor_in(A, torch.bfloat16) is not first  # gradients on: never cached

    x = _input((2, 5, HIDDEN), torch.float32, device).bfloat16()

    def output():
        with torch.no_grad():
            return lora_linear(x, lora_projection(layer))

    def fresh():  # the same product from factors cast now, not from any cache
        with torch.no_grad():
            base = x @ layer.base_layer.weight.bfloat16().t()
            return base + (x @ A.bfloat16().t()) @ (B * layer.scaling["default"]).bfloat16().t()

    optimizer = torch.optim.AdamW([A, B], lr=0.1, fused=True)
    before = output()
    lora_linear(x.detach().requires_grad_(), lora_projection(layer)).float().square().sum().backward()
    version = A._version
    optimizer.step()
    assert A._version == version  # the fused step leaves the counter: the cache is emptied by the step instead
    after = output()
    assert not torch.equal(after, before)
    torch.testing.assert_close(after, fresh(), rtol=1e-2, atol=1e-2)
    with torch.no_grad():
        A.mul_(-1)  # an in-place write between steps: the version counter moves
    torch.testing.assert_close(output(), fresh(), rtol=1e-2, atol=1e-2)
