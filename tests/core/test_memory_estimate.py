"""The memory estimate: exact parameter counts for SmolLM2, and parts that move the right way."""
from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

from lanner.core.memory_estimate import NF4_BYTES_PER_WEIGHT, count_parameters, default_budget_bytes, estimate_memory

from job_specs import BUILTIN, unchecked_spec


def test_counts_match_the_real_model(smollm2_dir):
    # Shapes from the checkpoint's header: no need to load 135M parameters to count them.
    from safetensors import safe_open

    shape = json.loads((smollm2_dir / "config.json").read_text())
    with safe_open(smollm2_dir / "model.safetensors", framework="np") as weights:
        shapes = {name: weights.get_slice(name).get_shape() for name in weights.keys()}
    estimate = estimate_memory(unchecked_spec(lora={"rank": 4, "target_modules": ["q_proj", "v_proj"]}), shape, "cpu")
    assert estimate["parameters"] == sum(math.prod(s) for s in shapes.values())
    lora = sum(4 * sum(s) for name, s in shapes.items() if name.endswith(("q_proj.weight", "v_proj.weight")))
    assert estimate["lora_parameters"] == lora == 230_400  # what PEFT reported for this config
    assert estimate["weights_bytes"] == 4 * (estimate["parameters"] + lora)


def test_the_builtin_model_is_estimated_the_same_before_its_import_as_after(smollm2_dir, tmp_path):
    """Its shape is known without the import (a job created before the import landed kept a lower
    figure, counted from the parameters alone)."""
    from lanner.core import default_model
    from lanner.core.model_catalog import estimate_job_memory

    imported = json.loads((smollm2_dir / "config.json").read_text())
    assert {key: imported[key] for key in default_model.SHAPE} == default_model.SHAPE
    spec = unchecked_spec(precision="fp32", batch_size=2, max_seq_len=64).model_copy(update={"gpus": 0})
    assert not default_model.is_imported(tmp_path)
    assert estimate_job_memory(spec, tmp_path) == estimate_memory(spec, imported, "cpu")


@pytest.mark.parametrize("odd", [{"intermediate_size": None}, {"vocab_size": "49152"}, {"num_hidden_layers": -3},
                                 {"hidden_size": True}, {"num_attention_heads": [9]}, {"head_dim": 0},
                                 {"mlp_only_layers": "0"}, {"hidden_size": 1e300}],
                         ids=["null", "string", "negative", "bool", "list", "zero", "letters", "float"])
def test_a_local_config_of_an_odd_shape_has_no_estimate_rather_than_an_error(odd, smollm2_dir, tmp_path):
    """An estimate is advice: a config.json that count_parameters cannot read (another kind of model, a hand-edited
    file) gives none, wherever it is asked for (the job form, the playground's GPU session)."""
    from lanner.core.model_catalog import estimate_job_memory, model_shape

    config = {**json.loads((smollm2_dir / "config.json").read_text()), **odd}
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "config.json").write_text(json.dumps(config))
    assert model_shape("odd", tmp_path) is None
    spec = unchecked_spec().model_copy(update={"model": "odd"})
    assert estimate_job_memory(spec, tmp_path) is None


def test_parts_follow_the_config(smollm2_dir):
    shape = json.loads((smollm2_dir / "config.json").read_text())
    base = {"precision": "bf16", "batch_size": 4, "max_seq_len": 1024}
    lora = estimate_memory(unchecked_spec(**base), shape)
    full = estimate_memory(unchecked_spec("full", **base), shape)
    qlora = estimate_memory(unchecked_spec("qlora", **base), shape)
    no_checkpointing = estimate_memory(unchecked_spec(**base, gradient_checkpointing=False), shape)
    double_batch = estimate_memory(unchecked_spec(**{**base, "batch_size": 8}), shape)
    assert qlora["weights_bytes"] < lora["weights_bytes"] and full["weights_bytes"] == 2 * full["parameters"]
    assert full["optimizer_bytes"] == 8 * full["parameters"] and full["trainable_parameters"] == full["parameters"]
    assert no_checkpointing["activations_bytes"] > 5 * lora["activations_bytes"]
    assert double_batch["activations_bytes"] == 2 * lora["activations_bytes"]
    assert lora["logits_bytes"] == 0 and estimate_memory(unchecked_spec(**base, use_kernels=False), shape)["logits_bytes"] > 0
    assert all(value >= 0 for value in lora.values())
    assert lora["total_bytes"] == sum(v for k, v in lora.items() if k.endswith("_bytes") and k != "total_bytes")
    assert estimate_memory(unchecked_spec(**base), {"parameters": 1_000_000})["weights_bytes"] == 2_000_000
    plain = estimate_memory(unchecked_spec(**base, use_kernels=False), shape)
    reward = estimate_memory(unchecked_spec("reward", **base), shape)  # no kernels for a classifier
    assert reward["logits_bytes"] == 0 and reward["activations_bytes"] == 2 * plain["activations_bytes"]


def test_an_fp8_base_takes_a_byte_a_weight_and_one_transposed_copy():
    base = {"precision": "bf16", "batch_size": 4, "max_seq_len": 2048}
    lora, qlora, fp8 = (estimate_memory(unchecked_spec(method, **base), LLAMA_8B)
                        for method in ("lora", "qlora", "lora_fp8"))
    linear = 32 * (4096 * (4096 + 1024 + 1024 + 4096) + 3 * 4096 * 14336)
    other = lora["weights_bytes"] - 2 * linear  # embeddings, lm_head and norms stay 16-bit
    scales = 32 * 4 * (4096 + 1024 + 1024 + 4096 + 14336 + 14336 + 4096)
    assert fp8["weights_bytes"] == linear + scales + 2 * 14336 * 4096 + other  # gate and up transposed together
    assert qlora["weights_bytes"] < fp8["weights_bytes"] < lora["weights_bytes"]
    assert fp8["activations_bytes"] == lora["activations_bytes"]


LLAMA_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, vocab_size=128256,
                num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False)
LLAMA_1B = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, vocab_size=128256,
                num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True)
# Peaks measured on the H200 (docs/benchmarks.md, 2026-11-29): LoRA r16 on all seven projections,
# bf16, sequence 2048, batch 4, gradient checkpointing; with lanner.kernels and with plain HF + PEFT.
MEASURED_PEAKS_GIB = [(LLAMA_8B, True, 18.77), (LLAMA_1B, True, 3.70), (LLAMA_8B, False, 31.31), (LLAMA_1B, False, 16.75)]


@pytest.mark.parametrize("shape,use_kernels,measured_gib", MEASURED_PEAKS_GIB)
def test_estimate_is_within_15_percent_of_measured_gpu_peaks(shape, use_kernels, measured_gib):
    spec = unchecked_spec(lora={"rank": 16}, precision="bf16", batch_size=4, max_seq_len=2048,
                          gradient_checkpointing=True, use_kernels=use_kernels)
    estimate = estimate_memory(spec, shape, "cuda")["total_bytes"] / 2**30
    assert abs(estimate - measured_gib) / measured_gib < 0.15, (estimate, measured_gib)


def test_a_gpu_job_without_a_budget_plans_for_most_of_the_free_memory():
    # 16 GiB held, 100 GiB free: 16 + 90; a memory_limit_mb cap of 8 GiB above what is held wins.
    GIB = 2**30
    assert default_budget_bytes(16 * GIB, 100 * GIB, None) == 106 * GIB
    assert default_budget_bytes(16 * GIB, 100 * GIB, 8 * 1024) == 24 * GIB
    assert default_budget_bytes(16 * GIB, 0, None) == 16 * GIB


def test_without_a_budget_the_estimate_follows_the_default_plan_of_the_gpu_it_gets():
    # What the worker's engine does with no budget: on a large GPU every layer is kept; on a small one,
    # or under a memory_limit_mb cap, the activations fill what the default budget leaves.
    spec = unchecked_spec(lora={"rank": 16}, precision="bf16", batch_size=4, max_seq_len=2048)
    unknown = estimate_memory(spec, LLAMA_8B, "cuda")
    large = estimate_memory(spec, LLAMA_8B, "cuda", 141 * 2**30)
    small = estimate_memory(spec, LLAMA_8B, "cuda", 24 * 2**30)
    capped = estimate_memory(unchecked_spec(lora={"rank": 16}, precision="bf16", batch_size=4, max_seq_len=2048,
                                            memory_limit_mb=6 * 1024), LLAMA_8B, "cuda", 141 * 2**30)
    no_checkpointing = estimate_memory(unchecked_spec(lora={"rank": 16}, precision="bf16", batch_size=4, max_seq_len=2048,
                                                      gradient_checkpointing=False), LLAMA_8B, "cuda")
    assert large["activations_bytes"] == no_checkpointing["activations_bytes"] > 5 * unknown["activations_bytes"]
    assert unknown["activations_bytes"] < small["activations_bytes"] < large["activations_bytes"]
    assert small["total_bytes"] < large["total_bytes"] and capped["total_bytes"] < large["total_bytes"]
    assert estimate_memory(spec, LLAMA_8B, "cpu", 141 * 2**30) == estimate_memory(spec, LLAMA_8B, "cpu")


def test_a_grpo_estimate_counts_generation_and_its_reward_models():
    """Issue 26: a GRPO job holds its generation's KV cache between steps and its reward models all along."""
    from lanner.core.memory_estimate import REWARD_SCORING_BATCH, reward_model_bytes
    from lanner.core.model_catalog import estimate_job_memory
    from lanner.core.default_model import SHAPE

    def grpo(rewards=(), **hp):
        spec = unchecked_spec(**{"precision": "bf16", "batch_size": 4, "max_seq_len": 1024, "gradient_accumulation": 1, **hp})
        return estimate_memory(spec.model_copy(update={"method": "grpo"}), LLAMA_8B, "cuda", reward_models=list(rewards))

    plain = grpo()
    lora = estimate_memory(unchecked_spec(precision="bf16", batch_size=4, max_seq_len=1024, gradient_accumulation=1),
                           LLAMA_8B, "cuda")
    # 4 sequences of 1,024 tokens: 32 layers × (k, v) × 1,024 values × 2 bytes each, and the last token's logits.
    assert plain["generation_bytes"] == 32 * 2 * 1024 * 2 * 4 * 1024 + 4 * 128256 * (2 + 4)
    assert plain["reward_models_bytes"] == 0 and lora["generation_bytes"] == lora["reward_models_bytes"] == 0
    # TRL generates a whole optimizer step's completions at once: gradient accumulation multiplies them.
    assert grpo(gradient_accumulation=4)["generation_bytes"] > 3 * plain["generation_bytes"]
    # Generation and the step take turns: the peak holds the larger, which here is the step's activations ...
    assert plain["total_bytes"] == lora["total_bytes"]
    # ... until the generation batch outgrows them.
    big = grpo(gradient_accumulation=64)
    assert big["generation_bytes"] > big["activations_bytes"] + big["logits_bytes"]
    assert big["total_bytes"] > plain["total_bytes"] + big["generation_bytes"] // 2

    with_scorers = grpo([LLAMA_1B, SHAPE])
    scorers = with_scorers["reward_models_bytes"]
    assert scorers == reward_model_bytes(LLAMA_1B, 2, 1024) + reward_model_bytes(SHAPE, 2, 1024)
    # A reward model's weights (a one-output score head instead of lm_head) and one layer's tensors for a
    # forward of REWARD_SCORING_BATCH rows: the tied 1B keeps its embeddings, the untied 8B drops its lm_head.
    working = REWARD_SCORING_BATCH * 1024 * (4 * 2048 + 2 * 512 + 2 * 8192) * 2
    assert reward_model_bytes(LLAMA_1B, 2, 1024) == 2 * (count_parameters_of(LLAMA_1B) + 2048) + working
    assert reward_model_bytes(LLAMA_8B, 2, 1) == 2 * (count_parameters_of(LLAMA_8B) - 128256 * 4096 + 4096) + \
        REWARD_SCORING_BATCH * (4 * 4096 + 2 * 1024 + 2 * 14336) * 2
    assert with_scorers["total_bytes"] - plain["total_bytes"] >= scorers  # (the overhead's 5% on top)

    # From a job's spec: the reward jobs' base models by name (the built-in one here).
    spec = unchecked_spec(precision="fp32", batch_size=2, max_seq_len=64).model_copy(update={"method": "grpo", "gpus": 0})
    with_builtin = estimate_job_memory(spec, Path("/nonexistent"), reward_models=[BUILTIN])
    assert with_builtin["reward_models_bytes"] == reward_model_bytes(SHAPE, 4, 64) > 0
    assert estimate_job_memory(spec, Path("/nonexistent"), reward_models=["someone/unknown-model"]) is None


def count_parameters_of(shape) -> int:
    return count_parameters(shape)["total"]


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_a_mixture_of_experts_is_counted_with_its_experts_and_their_adapters(family):
    """Parameters and LoRA parameters of MoE configs as transformers builds them and PEFT adapts them
    (the experts' stacked weights; the fused gate_up at rank r for each of gate and up)."""
    import torch
    import transformers

    from lanner.kernels import get_lora_model

    common = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, vocab_size=96,
                  num_experts_per_tok=2, tie_word_embeddings=False)
    if family == "mixtral":
        config = transformers.MixtralConfig(**common, intermediate_size=48, num_local_experts=4)
    else:  # the middle layer dense, with its own (wider) MLP
        config = transformers.Qwen3MoeConfig(**common, head_dim=16, intermediate_size=80, moe_intermediate_size=24,
                                             num_experts=4, mlp_only_layers=[1])
    model = getattr(transformers, {"mixtral": "MixtralForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}[family])(config)
    qk_norms = sum(p.numel() for name, p in model.named_parameters() if name.endswith(("q_norm.weight", "k_norm.weight")))
    shape = config.to_dict()
    estimate = estimate_memory(unchecked_spec(lora={"rank": 4, "target_modules": "all-linear"}), shape, "cpu")
    assert estimate["parameters"] == sum(p.numel() for p in model.parameters()) - qk_norms

    # The routers stay in 16 bits under a quantised base, the routed experts too under FP8; QLoRA stores these
    # families' experts in NF4 (and reads them through one layer's dequantised buffer). The estimate counts them so.
    from lanner.kernels.quant import quantize_model
    parts = count_parameters(shape)
    routers = parts["routers"]
    for quant_type, dense in (("nf4", routers), ("fp8", routers + parts["experts"])):
        quantised = quantize_model(copy.deepcopy(model), quant_type=quant_type)
        sixteen_bit = sum(p.numel() for name, p in quantised.named_parameters()
                          if p.is_floating_point() and (".experts." in name or name.endswith(".mlp.gate.weight")))
        assert sixteen_bit == dense > 0
    qlora = estimate_memory(unchecked_spec("qlora", lora={"rank": 4}), shape)
    one_layer = parts["experts"] // (config.num_hidden_layers - (family == "qwen3_moe"))
    assert qlora["weights_bytes"] - qlora["lora_parameters"] * 4 == int(
        (parts["linear"] - routers) * NF4_BYTES_PER_WEIGHT + (routers + parts["other"]) * 2 + one_layer * 2)

    torch.manual_seed(0)
    adapted = get_lora_model(model, r=4, lora_alpha=4)
    assert estimate["lora_parameters"] == sum(p.numel() for p in adapted.parameters() if p.requires_grad)
    attention_only = estimate_memory(unchecked_spec(lora={"rank": 4, "target_modules": ["q_proj", "v_proj"]}), shape, "cpu")
    assert attention_only["lora_parameters"] == 3 * 4 * ((64 + config.num_attention_heads * (64 // 4 if family == "mixtral" else 16))
                                                         + (64 + 2 * (64 // 4 if family == "mixtral" else 16)))


def test_gpt_oss_is_counted_with_its_experts_and_their_adapters():
    """gpt-oss: experts stored [E, in, out] (PEFT's factors take the same count); every parameter counted but
    the biases and sinks (as Qwen2's attention biases are not); its LoRA parameters exact."""
    import torch
    import transformers

    from lanner.kernels import get_lora_model

    config = transformers.GptOssConfig(hidden_size=64, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                                       vocab_size=96, layer_types=["sliding_attention", "full_attention"])
    model = transformers.GptOssForCausalLM(config)
    estimate = estimate_memory(unchecked_spec(lora={"rank": 4, "target_modules": "all-linear"}), config.to_dict(), "cpu")
    unbiased = sum(p.numel() for name, p in model.named_parameters() if not name.endswith(("bias", "sinks")))
    assert estimate["parameters"] == unbiased
    torch.manual_seed(0)
    adapted = get_lora_model(model, r=4, lora_alpha=4)
    assert estimate["lora_parameters"] == sum(p.numel() for p in adapted.parameters() if p.requires_grad)


def test_the_qwen3_30b_a3b_shape_has_the_lora_parameters_peft_made_on_the_gpu():
    import transformers

    shape = transformers.Qwen3MoeConfig(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                                        num_hidden_layers=6, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                                        num_experts=128, num_experts_per_tok=8, vocab_size=151936).to_dict()
    estimate = estimate_memory(unchecked_spec(lora={"rank": 16, "target_modules": "all-linear"}), shape, "cuda")
    assert estimate["lora_parameters"] == 124_354_560  # moe_bench.py on the H200, docs/benchmarks.md twelfth round


def test_the_form_s_lora_targets_choice_changes_an_moe_estimate(smollm2_dir):
    """The choice (attention only, experts, all) is the spec's target_modules, which the estimate follows:
    attention and experts add up to all; a dense model's estimate says it has no experts."""
    import transformers

    from lanner.core.spec import LORA_TARGET_CHOICES

    shape = transformers.Qwen3MoeConfig(hidden_size=64, intermediate_size=80, moe_intermediate_size=24, num_hidden_layers=3,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=96,
                                        num_experts=4, num_experts_per_tok=2).to_dict()
    by_choice = {choice: estimate_memory(unchecked_spec(lora={"rank": 4, "target_modules": targets}), shape, "cpu")
                 for choice, targets in LORA_TARGET_CHOICES.items()}
    lora = {choice: estimate["lora_parameters"] for choice, estimate in by_choice.items()}
    assert 0 < lora["attention"] < lora["experts"] < lora["all"] == lora["attention"] + lora["experts"]
    assert by_choice["attention"]["total_bytes"] < by_choice["experts"]["total_bytes"] < by_choice["all"]["total_bytes"]
    assert {estimate["experts"] for estimate in by_choice.values()} == {4}
    assert estimate_memory(unchecked_spec(), json.loads((smollm2_dir / "config.json").read_text()), "cpu")["experts"] == 0


def test_qlora_stores_in_nf4_the_experts_of_the_kernels_families():
    from lanner.core.memory_estimate import NF4_EXPERT_MODEL_TYPES
    from lanner.kernels.patching import FAMILIES

    assert set(NF4_EXPERT_MODEL_TYPES) == {name for name, family in FAMILIES.items() if family.moe}
