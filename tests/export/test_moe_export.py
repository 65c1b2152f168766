"""Mixture-of-experts export: a LoRA adapter on the attention and on the experts' stacked weights (PEFT's
target_parameters) of tiny random Qwen3-MoE and Mixtral models (hidden 64, 4 experts, top-2, 2 layers),
exported as the adapter, the merged 16-bit model and f16/q8_0 GGUFs, each checked as a dense export is,
against real llama.cpp (llama-cpp-python).

The models' weights are smaller than test_gguf_archs' (std 0.05, not 0.3): with large weights one cast
to bfloat16 flips which experts a token is routed to, a jump in the logits that would make the merged
check's bound (what one cast costs) loose, and its top-1 rule fail on the very model it is measured on."""
from __future__ import annotations

import json

import pytest
from export_helpers import make_adapter, tiny_model

MOE_KINDS = ("qwen3_moe", "mixtral")
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
EXPERTS = ("experts.gate_up_proj", "experts.down_proj")


@pytest.fixture(scope="module", params=MOE_KINDS)
def moe_export(request, smollm2_dir, tmp_path_factory):
    from lanner.worker.export import ExportRequest, run_export

    kind = request.param
    root = tmp_path_factory.mktemp(kind)
    base = tiny_model(kind, smollm2_dir, root / "base", initializer_range=0.05)
    adapter = make_adapter(base, root / "trained", target_modules=ATTENTION, target_parameters=EXPERTS)
    manifest = run_export(ExportRequest(base_model_dir=base, adapter_dir=adapter, out_dir=root / "export", name=kind,
                                        merged_dtype="bfloat16", gguf_types=("f16", "q8_0")))
    return {"kind": kind, "base": base, "adapter": adapter, "out": root / "export", "manifest": manifest}


def test_every_format_passes_its_check(moe_export):
    manifest = moe_export["manifest"]
    checks = manifest["verification"]
    print(f"\n{moe_export['kind']}:", json.dumps({name: {k: v for k, v in check.items() if k != "generated"}
                                                  for name, check in [("merged", checks["merged"]), *checks["gguf"].items()]},
                                                 indent=1))
    assert manifest["failed"] == {}
    assert {(a["kind"], a.get("type")) for a in manifest["artifacts"]} >= {("adapter", None), ("merged", None),
                                                                           ("gguf", "f16"), ("gguf", "q8_0")}
    merged = checks["merged"]
    assert merged["passed"] and merged["max_abs_logit_diff"] <= merged["noise_floor_max_abs_logit_diff"] + 1e-4
    assert merged["adapter_effect_max_abs_logit_diff"] > 5 * merged["bound_max_abs_logit_diff"]
    f16, q8_0 = checks["gguf"]["f16"], checks["gguf"]["q8_0"]
    assert f16["passed"] and f16["top1_agreement"] == 1.0 and f16["mean_kl"] < f16["kl_bound"]
    assert q8_0["passed"] and q8_0["mean_kl"] < q8_0["kl_bound"]


def test_the_adapter_keeps_its_expert_parameters_and_says_vllm_cannot_load_it(moe_export):
    adapter = next(a for a in moe_export["manifest"]["artifacts"] if a["kind"] == "adapter")
    config = json.loads((moe_export["out"] / "adapter" / "adapter_config.json").read_text())
    assert config["target_modules"] == sorted(ATTENTION) and sorted(config["target_parameters"]) == sorted(EXPERTS)
    assert not adapter["vllm"]["compatible"] and "target_parameters" in adapter["vllm"]["why_not"]


def test_merged_experts_are_the_float32_merge_rounded_once(moe_export):
    """PEFT's ParamWrapper merge is exact (each expert's W + s B_e A_e, checked against float64), and the
    export saves that float32 sum cast to bfloat16 once, bit for bit."""
    import torch
    from peft import PeftModel
    from peft.tuners.lora import ParamWrapper
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(moe_export["base"], dtype=torch.float32),
                                      moe_export["adapter"])
    expected = {}
    for wrapper in (m for m in model.modules() if isinstance(m, ParamWrapper)):
        weight = wrapper.get_param().detach().double()
        a = wrapper.lora_A["default"].weight.double().reshape(wrapper.num_experts, -1, weight.shape[-1])   # e r in
        b = wrapper.lora_B["default"].weight.double().reshape(weight.shape[1], -1, wrapper.num_experts)    # out r e
        expected[id(wrapper.get_param())] = weight + wrapper.scaling["default"] * torch.einsum("ore,eri->eoi", b, a)
    assert len(expected) == 2 * 2  # gate_up and down in each of the 2 layers
    params = {id(p): name for name, p in model.named_parameters()}
    exact = {params[key]: value for key, value in expected.items()}
    merged = model.merge_and_unload().state_dict()
    for name, value in exact.items():
        name = name.replace("base_model.model.", "").replace(".base_layer", "")
        torch.testing.assert_close(merged[name].double(), value, rtol=1e-6, atol=1e-7)
    exported = AutoModelForCausalLM.from_pretrained(moe_export["out"] / "merged", dtype=torch.bfloat16).state_dict()
    differ = [name for name, tensor in exported.items() if not torch.equal(tensor, merged[name].to(torch.bfloat16))]
    assert differ == [] and any("experts.gate_up_proj" in name for name in exported)


def test_llama_cpp_gives_the_merged_model_s_next_token(moe_export):
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lanner.inference.generation import open_llama

    merged_dir = moe_export["out"] / "merged"
    ids = AutoTokenizer.from_pretrained(merged_dir)("The lanner falcon hunts small birds over open")["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = int(model(torch.tensor([ids])).logits[0, -1].argmax())
    llm = open_llama(str(moe_export["out"] / "gguf" / f"{moe_export['kind']}-f16.gguf"), logits_all=True, n_ctx=64)
    try:
        llm.eval(ids)
        got = int(np.argmax(llm.scores[len(ids) - 1]))
    finally:
        llm.close()
    assert got == expected


def test_the_adapter_loads_with_peft_in_a_fresh_process(moe_export, tmp_path):
    import subprocess
    import sys

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    ids = [1, 504, 3575, 282, 4649, 314]
    script = ("import sys, torch; from peft import PeftModel; from transformers import AutoModelForCausalLM; "
              "base = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32); "
              "model = PeftModel.from_pretrained(base, sys.argv[2]).eval(); "
              f"torch.save(model(torch.tensor([{ids}])).logits, sys.argv[3])")
    done = subprocess.run([sys.executable, "-c", script, str(moe_export["base"]), str(moe_export["out"] / "adapter"),
                           str(tmp_path / "logits.pt")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    base = AutoModelForCausalLM.from_pretrained(moe_export["base"], dtype=torch.float32)
    model = PeftModel.from_pretrained(base, moe_export["adapter"]).eval()
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits
        with model.disable_adapter():
            without = model(torch.tensor([ids])).logits
    got = torch.load(tmp_path / "logits.pt")
    assert torch.allclose(got, expected, rtol=0, atol=1e-4) and not torch.allclose(got, without, rtol=0, atol=1e-2)


def test_a_checkpoint_with_stacked_experts_converts_to_the_same_gguf(moe_export, tmp_path):
    """transformers 5 holds the experts stacked (gate_up_proj [experts, 2 x intermediate, hidden], gate rows
    first; down_proj [experts, hidden, intermediate]); save_pretrained writes them one per expert. A checkpoint
    saved in the stacked form gives the same GGUF tensors."""
    import shutil

    import numpy as np
    import torch
    from gguf import GGUFReader
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from lanner.worker.export import convert_to_gguf

    merged_dir = moe_export["out"] / "merged"
    stacked_dir = tmp_path / "stacked"
    shutil.copytree(merged_dir, stacked_dir)
    for file in stacked_dir.glob("*.safetensors"):
        file.unlink()
    state = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.bfloat16).state_dict()
    assert state["model.layers.0.mlp.experts.gate_up_proj"].shape == (4, 2 * 96 if moe_export["kind"] == "qwen3_moe"
                                                                         else 2 * 128, 64)
    save_file({name: tensor.contiguous() for name, tensor in state.items()}, str(stacked_dir / "model.safetensors"),
              metadata={"format": "pt"})
    convert_to_gguf(stacked_dir, tmp_path / "stacked.gguf", out_type="f16")
    tensors = {t.name: np.asarray(t.data) for t in GGUFReader(str(tmp_path / "stacked.gguf")).tensors}
    reference = GGUFReader(str(moe_export["out"] / "gguf" / f"{moe_export['kind']}-f16.gguf")).tensors
    assert {t.name for t in reference} == set(tensors)
    for tensor in reference:
        assert np.array_equal(np.asarray(tensor.data), tensors[tensor.name]), tensor.name
    assert {"blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight", "blk.0.ffn_down_exps.weight",
            "blk.0.ffn_gate_inp.weight"} <= set(tensors)


@pytest.mark.parametrize("model_type, changes, words", [
    ("qwen3_moe", {"norm_topk_prob": False}, "always does"),
    ("qwen3_moe", {"mlp_only_layers": [0]}, "dense MLP layers"),
    ("gpt_oss", {"swiglu_limit": 5.0}, "fixes it at 7.0"),
    ("gpt_oss", {"num_hidden_layers": 2, "sliding_window": 4, "layer_types": ["full_attention", "sliding_attention"]},
     "every other layer"),
    ("gpt_oss", {"num_hidden_layers": 2, "sliding_window": None}, "sets no sliding window"),
])
def test_what_llama_cpp_cannot_run_is_refused_in_words(model_type, changes, words):
    from lanner.worker.export import ExportError
    from lanner.worker.export.gguf_arch import arch_for

    config = {"model_type": model_type, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
              **changes}
    with pytest.raises(ExportError, match=words):
        arch_for(config)


def test_a_qlora_adapter_on_16_bit_experts_merges_into_them(moe_export, tmp_path):
    """A QLoRA record without `experts` (before Lanner held experts in NF4, or a job with the kernels off): the
    base that adapter saw has NF4 linears and 16-bit experts, and the merge rebuilds exactly that."""
    from lanner.worker.export import ExportRequest, run_export

    # In float16, the checkpoint's dtype: in bfloat16 one cast of these NF4-rebuilt weights routes a token to
    # another expert (a top-1 change the check refuses, on the one-cast model as on the merged one, bit-equal).
    manifest = run_export(ExportRequest(base_model_dir=moe_export["base"], adapter_dir=moe_export["adapter"],
                                        out_dir=tmp_path / "export", adapter=False, gguf_types=(),
                                        merged_dtype="float16", base_quantization={}))
    assert manifest["failed"] == {}
    check = manifest["verification"]["merged"]
    assert check["passed"] and "4-bit base" in check["check"], check
    assert check["adapter_effect_max_abs_logit_diff"] > check["bound_max_abs_logit_diff"]

    # The experts: the checkpoint's 16-bit weights plus PEFT's delta, summed in float32 and rounded once.
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "export" / "merged", dtype=torch.float16).state_dict()
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(moe_export["base"], dtype=torch.float32),
                                      moe_export["adapter"])
    wrappers = [(name.removeprefix("base_model.model.").replace(".base_layer", ""), m)
                for name, m in model.named_modules() if type(m).__name__ == "ParamWrapper"]
    assert len(wrappers) == 4  # two layers, gate_up and down
    for owner, wrapper in wrappers:
        expected = (wrapper.get_param() + wrapper.get_delta_weight("default")).half()
        assert torch.equal(merged[f"{owner}.{wrapper.parameter_name}"], expected), owner


def test_gpt_oss_exports_its_adapter_a_merged_model_and_gguf_checked_by_logits(smollm2_dir, tmp_path):
    """gpt-oss (experts stored [E, in, out] with biases, gate/up interleaved, attention sinks, sliding and global
    layers, YaRN): the adapter, the merged bf16 model and f16/q8_0 GGUFs, each checked as a dense export is (the
    GGUFs by real llama.cpp's logits)."""
    from lanner.worker.export import ExportRequest, run_export

    base = tiny_model("gpt_oss", smollm2_dir, tmp_path / "base", initializer_range=0.05)
    # B larger than the others' (0.03): the adapter's effect well past what one bf16 cast of the base moves
    adapter = make_adapter(base, tmp_path / "trained", target_modules=ATTENTION, target_parameters=EXPERTS,
                           lora_b_std=0.2)
    manifest = run_export(ExportRequest(base_model_dir=base, adapter_dir=adapter, out_dir=tmp_path / "export",
                                        name="gpt-oss", merged_dtype="bfloat16", gguf_types=("f16", "q8_0")))
    checks = manifest["verification"]
    print("\ngpt-oss:", json.dumps({name: {k: v for k, v in check.items() if k != "generated"}
                                   for name, check in [("merged", checks["merged"]), *checks["gguf"].items()]}, indent=1))
    assert manifest["failed"] == {}
    assert {(a["kind"], a.get("type")) for a in manifest["artifacts"]} >= {("adapter", None), ("merged", None),
                                                                           ("gguf", "f16"), ("gguf", "q8_0")}
    merged = checks["merged"]
    assert merged["passed"] and merged["max_abs_logit_diff"] <= merged["noise_floor_max_abs_logit_diff"] + 1e-4
    assert merged["adapter_effect_max_abs_logit_diff"] > 5 * merged["bound_max_abs_logit_diff"]
    f16, q8_0 = checks["gguf"]["f16"], checks["gguf"]["q8_0"]
    assert f16["passed"] and f16["top1_agreement"] == 1.0 and f16["mean_kl"] < f16["kl_bound"]
    assert q8_0["passed"] and q8_0["mean_kl"] < q8_0["kl_bound"]


def test_a_qlora_adapter_on_nf4_experts_merges_into_the_base_it_trained_on(smollm2_dir, tmp_path, monkeypatch):
    """QLoRA through lanner.kernels holds a mixture's stacked experts in NF4 too. Its adapter (made on that
    model: PEFT's wrappers over NF4 experts) merges into the base rebuilt by the same rule (the training
    record's experts: true) and passes the merged check, the rebuilt base with the adapter being the NF4 model
    training ran."""
    import torch
    from transformers import AutoTokenizer

    from lanner.kernels import dequantize_model, get_lora_model
    from lanner.worker.export import ExportRequest, Quantization, run_export
    from lanner.worker.export.verify import _logits, compare_logits, prompt_ids

    base = tiny_model("qwen3_moe", smollm2_dir, tmp_path / "base", initializer_range=0.05)
    # The experts are stored in NF4 where the grouped kernels can run (a GPU): this CPU stands in for one at
    # quantisation (nothing runs them here; their dense reads dequantise in torch).
    monkeypatch.setattr("lanner.kernels.quant.convert.triton_available", lambda device: True)
    model = get_lora_model(str(base), r=8, lora_alpha=16, target_modules=ATTENTION + ("gate_proj", "up_proj", "down_proj"),
                           use_kernels=False, gradient_checkpointing=False, load_in_4bit=True)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.03)
    assert any("experts.lora_B" in name for name, _ in model.named_parameters())
    assert ".parametrizations.gate_up_proj.original" in " ".join(name for name, _ in model.named_parameters())
    adapter = tmp_path / "adapter"
    model.save_pretrained(adapter)
    AutoTokenizer.from_pretrained(base).save_pretrained(adapter)

    record = Quantization(experts=True).as_dict()
    manifest = run_export(ExportRequest(base_model_dir=base, adapter_dir=adapter, out_dir=tmp_path / "export",
                                        gguf_types=(), base_quantization=record))
    assert manifest["failed"] == {}
    # The exported adapter is for 16-bit bases: without the NF4 stacks' parametrisation modules training excluded.
    assert ".parametrizations." in (adapter / "adapter_config.json").read_text()
    assert ".parametrizations." not in (tmp_path / "export" / "adapter" / "adapter_config.json").read_text()
    check = manifest["verification"]["merged"]
    assert check["passed"] and "4-bit base" in check["check"], check

    # The model training ran (its NF4 weights dequantised, with the adapter) against the base rebuilt by the rule
    # with the exported adapter loaded onto it (its wrappers nested as over 16-bit experts), both in float32: the
    # same model, to float32's summation order.
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from lanner.worker.export.dequantize import dequantise_base_

    ids = prompt_ids(AutoTokenizer.from_pretrained(adapter))
    trained = dequantize_model(model).float().eval()  # in float16, as training read them
    rebuilt = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float16)
    layers = rebuilt.config.num_hidden_layers  # each: q, k, v, o and the two expert stacks
    assert dequantise_base_(rebuilt, Quantization(experts=True), torch.float16) == layers * (4 + 2)
    exported = tmp_path / "export" / "adapter"  # with PEFT's rank pattern for Qwen3-MoE's fused gate_up (2r)
    assert json.loads((exported / "adapter_config.json").read_text())["rank_pattern"] == {r".*\.gate_up_proj": 16}
    reference = PeftModel.from_pretrained(rebuilt.float(), exported).eval()
    result = compare_logits(_logits(reference, ids), _logits(trained, ids))
    assert result["max_abs_logit_diff"] < 1e-4 and result["top1_agreement"] == 1.0, result

    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "export" / "merged", dtype=torch.float32).eval()
    result = compare_logits(_logits(trained, ids), _logits(merged, ids))
    assert result["max_abs_logit_diff"] <= check["bound_max_abs_logit_diff"], (result, check)


def test_a_top1_change_the_one_cast_model_makes_too_is_what_one_rounding_costs():
    """Routing makes a right export's top-1 token differ from the reference's outside a near-tie where one cast moves
    a token to another expert; the one-cast model (bit for bit the right export) does the same. Only such changes
    are excused: another token, or a change the one-cast model does not make, still counts."""
    import numpy as np

    from lanner.worker.export.verify import _top1_changes_as_one_cast

    reference = [np.array([[3.0, 1.0, 0.0], [0.0, 2.0, 1.0]])]
    one_cast = [np.array([[1.0, 3.0, 0.0], [0.0, 2.0, 1.0]])]                 # flips position 0 to token 1
    assert _top1_changes_as_one_cast(reference, one_cast, one_cast) == 1
    assert _top1_changes_as_one_cast(reference, [np.array([[1.0, 0.0, 3.0], [0.0, 2.0, 1.0]])], one_cast) == 0
    assert _top1_changes_as_one_cast(reference, [np.array([[1.0, 3.0, 0.0], [3.0, 2.0, 1.0]])], one_cast) == 1
