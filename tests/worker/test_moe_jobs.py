"""Mixture-of-experts jobs on a tiny random Qwen3-MoE (SmolLM2's tokenizer), on the CPU: the form's LoRA
targets choice adapts what it names, and every logged step carries the routers' load balance."""
from __future__ import annotations

import json

import pytest
import torch
import transformers

from lanner.core.db import session_factory
from lanner.core.spec import LORA_TARGET_CHOICES
from lanner.worker.events import JobEvents
from lanner.worker.training.model import load_model

from training_run import step_metrics, trained
from worker_helpers import qa_rows, training_options_of

EXPERTS, TOP_K = 4, 2


def save_tiny_moe(studio, smollm2_dir, name: str, skewed: bool = False, **config) -> str:
    """A tiny Qwen3-MoE under the studio's models (as "tiny/<name>"). Skewed: every token's hidden state
    leans one way (a large first embedding column) and every router sends that way to experts 0 and 1."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2_dir)
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**{
        "hidden_size": 48, "intermediate_size": 64, "moe_intermediate_size": 24, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": len(tokenizer),
        "num_experts": EXPERTS, "num_experts_per_tok": TOP_K, "max_position_embeddings": 128, **config}))
    if skewed:
        with torch.no_grad():
            model.model.embed_tokens.weight[:, 0] = 10.0
            for layer in model.model.layers:
                layer.mlp.gate.weight.zero_()
                layer.mlp.gate.weight[:, 0] = torch.tensor([5.0, 5.0, -5.0, -5.0])
    folder = studio.data_dir / "models" / "tiny" / name
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return f"tiny/{name}"


def test_the_lora_targets_choice_adapts_attention_experts_or_both(studio, smollm2_dir, monkeypatch):
    """attention: q/k/v/o only; experts: the experts' stacked weights (PEFT target_parameters) only, which
    on a Qwen-MoE leaves a dense layer's MLP unadapted (PEFT maps the MLP names onto the experts); all:
    both."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    folder = studio.data_dir / "models" / save_tiny_moe(studio, smollm2_dir, "dense-middle", num_hidden_layers=3,
                                                        mlp_only_layers=[1])
    events = JobEvents(1, studio.redis, session_factory(studio.database_url))
    adapted = {}
    for choice, targets in LORA_TARGET_CHOICES.items():
        options = training_options_of("lora", {"lora": {"target_modules": targets}})
        model = load_model(str(folder), options, events)
        adapted[choice] = {name.split(".lora_")[0].removeprefix("base_model.model.model.")
                           for name, param in model.named_parameters() if param.requires_grad}
    attention = {f"layers.{layer}.self_attn.{name}" for layer in range(3) for name in ("q_proj", "k_proj", "v_proj", "o_proj")}
    experts = {f"layers.{layer}.mlp.experts{inner}" for layer in (0, 2) for inner in ("", ".base_layer")}
    assert adapted == {"attention": attention, "experts": experts, "all": attention | experts}


def run_job(studio, model: str) -> list[dict]:
    dataset = studio.dataset(f"qa-{model.replace('/', '-')}.jsonl", qa_rows(16))
    job = studio.job(dataset, {"hyperparameters": {"max_steps": 3, "eval_fraction": 0}}, model=model)
    trained(studio, job)
    return step_metrics(studio, job)


def test_each_step_of_an_moe_job_carries_its_routers_load_balance(studio, smollm2_dir):
    """Balanced routers (random ones, near-uniform probabilities) give an aux loss near 1 and a busiest
    expert under E / top_k times the mean; routers that send every token to experts 0 and 1 give 2 and 2
    (E / top_k, the most top-2 of 4 experts can give). Plain PEFT here (the CPU without the interpreter);
    tests/kernels/test_moe_router_balance.py has the kernels' path count the same."""
    balanced = run_job(studio, save_tiny_moe(studio, smollm2_dir, "balanced"))
    skewed = run_job(studio, save_tiny_moe(studio, smollm2_dir, "skewed", skewed=True))
    assert [m["step"] for m in balanced] == [m["step"] for m in skewed] == [1, 2, 3]
    for metric in balanced:
        assert 1 <= metric["router_aux_loss"] < 1.1
        assert 1 <= metric["router_max_load"] < EXPERTS / TOP_K
    for metric in skewed:
        assert metric["router_aux_loss"] == pytest.approx(EXPERTS / TOP_K, rel=1e-3)
        assert metric["router_max_load"] == pytest.approx(EXPERTS / TOP_K)


def test_a_gpt_oss_shipped_in_mxfp4_loads_dequantised_for_lora(studio, smollm2_dir):
    """gpt-oss's experts as its checkpoints ship them (MXFP4 blocks and scales, hidden 64 and 2I 128 so that
    a transposed read shows): loaded for LoRA as 32-bit stacked weights equal to transformers' own
    dequantisation, adapted through target_parameters, with no quantization config left. The explicit
    request (base_load_kwargs) is what keeps them off MXFP4 where transformers' MXFP4 kernels are
    installed; on this CPU transformers would dequantise on its own."""
    from safetensors.torch import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from lanner.worker.checkpoints import base_load_kwargs

    tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2_dir)
    torch.manual_seed(0)
    model = transformers.GptOssForCausalLM(transformers.GptOssConfig(
        hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, num_local_experts=EXPERTS, num_experts_per_tok=TOP_K, vocab_size=len(tokenizer),
        max_position_embeddings=128, sliding_window=4, layer_types=["sliding_attention", "full_attention"]))
    folder = studio.data_dir / "models" / "tiny" / "gpt-oss-mxfp4"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    assert base_load_kwargs(folder) == {}
    state = load_file(folder / "model.safetensors")
    generator = torch.Generator().manual_seed(1)
    for name in [name for name in state if name.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        experts, n_in, n_out = state.pop(name).shape  # stored [E, in, out]; MXFP4 blocks [E, out, in / 32, 16]
        state[f"{name}_blocks"] = torch.randint(0, 256, (experts, n_out, n_in // 32, 16), dtype=torch.uint8,
                                                generator=generator)
        state[f"{name}_scales"] = torch.randint(124, 130, (experts, n_out, n_in // 32), dtype=torch.uint8,
                                                generator=generator)
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (folder / "config.json").write_text(json.dumps(config))
    assert base_load_kwargs(folder)["quantization_config"].dequantize

    events = JobEvents(1, studio.redis, session_factory(studio.database_url))
    loaded = load_model(str(folder), training_options_of("lora", {"hyperparameters": {"precision": "fp32"}}), events)
    base = loaded.get_base_model()
    assert getattr(base.config, "quantization_config", None) is None
    for layer in range(2):
        experts = base.model.layers[layer].mlp.experts.base_layer.base_layer  # under PEFT's two ParamWrappers
        for name in ("gate_up_proj", "down_proj"):
            prefix = f"model.layers.{layer}.mlp.experts.{name}"
            expected = convert_moe_packed_tensors(state[f"{prefix}_blocks"], state[f"{prefix}_scales"],
                                                  dtype=torch.float32)
            assert getattr(experts, name).dtype == torch.float32
            assert torch.equal(getattr(experts, name).detach(), expected)
    assert any("experts.lora_A" in name for name, _ in loaded.named_parameters())
