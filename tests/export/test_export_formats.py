"""One full export of a non-trivial adapter on the real SmolLM2, then each artifact opened by the
tool users will open it with: peft, transformers, llama.cpp (llama-cpp-python)."""
from __future__ import annotations

import json
from pathlib import Path

from export_helpers import BASE_MODEL_HUB_ID

TEMPLATE_TOKENS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")


def artifact(full_export, kind: str, type_: str | None = None) -> dict:
    for item in full_export["manifest"]["artifacts"]:
        if item["kind"] == kind and (type_ is None or item.get("type") == type_):
            return item
    raise AssertionError(f"no {kind} {type_ or ''} artifact in {full_export['manifest']['artifacts']}")


def test_manifest_lists_every_artifact_with_its_size(full_export):
    out: Path = full_export["out"]
    manifest = json.loads((out / "export.json").read_text())
    kinds = sorted((a["kind"], a.get("type")) for a in manifest["artifacts"])
    assert ("adapter", None) in kinds and ("merged", None) in kinds
    assert {t for k, t in kinds if k == "gguf"} == {"f16", "bf16", "q8_0", "q4_k_m"}
    for item in manifest["artifacts"]:
        assert (out / item["path"]).exists() and item["bytes"] > 0
    assert not [p for p in out.parent.iterdir() if ".partial-" in p.name]
    print("\nexport took %.0f s; verification:\n%s" % (full_export["seconds"], json.dumps(manifest["verification"], indent=1)))


def test_progress_reports_each_stage_in_order(full_export):
    stages = [stage for stage, _ in full_export["events"]]
    for expected in ("check", "adapter", "merge", "verify-merged", "gguf-f16", "gguf-q8_0", "quantize-q4_k_m",
                     "verify-gguf", "done"):
        assert expected in stages
    assert all(0.0 <= fraction <= 1.0 for _, fraction in full_export["events"])
    assert stages[-1] == "done"


def test_merged_model_equals_base_with_adapter_within_16bit_noise(full_export):
    check = full_export["manifest"]["verification"]["merged"]
    assert check["passed"], check
    # 16-bit rounding may flip the top token only where the reference itself is a near-tie.
    assert check["top1_mismatches"] == check["top1_mismatches_near_ties"]
    assert check["top1_agreement"] >= 0.95
    # The adapter really changes the model, far beyond the 16-bit noise the merge is allowed.
    assert check["adapter_effect_max_abs_logit_diff"] > 5 * check["bound_max_abs_logit_diff"]


def test_f16_gguf_matches_merged_model_at_every_position(full_export):
    check = full_export["manifest"]["verification"]["gguf"]["f16"]
    assert check["passed"], check
    assert check["top1_agreement"] == 1.0
    assert check["mean_kl"] < check["kl_bound"]
    assert all(check["tokenization_matches"].values())


def test_q8_0_and_q4_k_m_load_and_generate(full_export):
    checks = full_export["manifest"]["verification"]["gguf"]
    assert checks["q8_0"]["passed"] and checks["q8_0"]["mean_kl"] < checks["q8_0"]["kl_bound"]
    assert checks["q4_k_m"]["passed"] and checks["q4_k_m"]["generated"].strip()
    sizes = {t: artifact(full_export, "gguf", t)["bytes"] for t in ("f16", "q8_0", "q4_k_m")}
    assert sizes["q4_k_m"] < sizes["q8_0"] < sizes["f16"]


def test_adapter_loads_in_plain_peft_with_base_recorded(full_export, smollm2_dir, trained_adapter):
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    adapter_dir = full_export["out"] / artifact(full_export, "adapter")["path"]
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == BASE_MODEL_HUB_ID  # issue 25: was BASE_MODEL_NAME, Lanner's own name
    assert isinstance(config["target_modules"], list) and not config["use_dora"]
    assert config["bias"] == "none" and not config["modules_to_save"]
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32), adapter_dir)
    original = load_file(str(trained_adapter / "adapter_model.safetensors"))
    loaded = dict(model.named_parameters())
    for key, value in original.items():
        name = key.replace(".lora_A.weight", ".lora_A.default.weight").replace(".lora_B.weight", ".lora_B.default.weight")
        assert torch.equal(loaded[name].detach(), value), key


def test_merged_model_loads_in_plain_transformers_with_chat_template(full_export):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    merged_dir = full_export["out"] / artifact(full_export, "merged")["path"]
    model = AutoModelForCausalLM.from_pretrained(merged_dir)
    tokenizer = AutoTokenizer.from_pretrained(merged_dir)
    assert model.dtype == torch.bfloat16
    assert not any("lora" in name for name, _ in model.named_parameters())
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                                           tokenize=False)
    assert prompt.endswith("<|im_start|>assistant\n")


def test_f16_gguf_chat_reply_follows_the_chat_template(full_export):
    from lanner.inference.generation import open_llama

    path = full_export["out"] / artifact(full_export, "gguf", "f16")["path"]
    llm = open_llama(str(path), n_ctx=256)
    try:
        assert llm.metadata.get("tokenizer.chat_template"), "chat template missing from GGUF metadata"
        reply = llm.create_chat_completion(
            messages=[{"role": "user", "content": "What is the capital of France?"}], max_tokens=32, temperature=0.0)
    finally:
        llm.close()
    choice = reply["choices"][0]
    text = choice["message"]["content"]
    print("\nf16 GGUF chat reply:", repr(text), choice["finish_reason"])
    assert "Paris" in text
    assert not any(token in text for token in TEMPLATE_TOKENS)
    assert not text.lstrip().startswith(("assistant", "user"))
    assert choice["finish_reason"] == "stop"  # ended at <|im_end|>, the template's end of turn


def test_q4_k_m_gguf_generates(full_export):
    from lanner.inference.generation import open_llama

    path = full_export["out"] / artifact(full_export, "gguf", "q4_k_m")["path"]
    llm = open_llama(str(path), n_ctx=128)
    try:
        text = llm.create_completion("The capital of France is", max_tokens=6, temperature=0.0)["choices"][0]["text"]
    finally:
        llm.close()
    assert text.strip()


def test_ollama_modelfile_translates_chatml(full_export):
    out = full_export["out"]
    modelfile = (out / "gguf" / "Modelfile").read_text()
    assert modelfile.startswith("FROM ./smollm2-lanner-q4_k_m.gguf\n")
    assert "{{ range .Messages }}" in modelfile.replace("{{- range", "{{ range")
    assert "<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>" in modelfile
    assert 'PARAMETER stop "<|im_end|>"' in modelfile
    assert 'SYSTEM """You are a helpful AI assistant named SmolLM' in modelfile
    for gguf_type in ("f16", "bf16", "q8_0", "q4_k_m"):
        assert (out / "gguf" / f"smollm2-lanner-{gguf_type}.Modelfile").read_text().startswith(
            f"FROM ./smollm2-lanner-{gguf_type}.gguf")


def assert_same_bits(gguf_path, gguf_name, merged_dir, hf_name):
    import numpy as np
    from gguf import GGUFReader
    from safetensors import safe_open

    tensor = next(t for t in GGUFReader(str(gguf_path)).tensors if t.name == gguf_name)
    with safe_open(str(merged_dir / "model.safetensors"), framework="pt") as handle:
        expected = handle.get_tensor(hf_name)
    import torch

    assert expected.dtype == torch.bfloat16
    got = np.asarray(tensor.data).view(np.uint16).reshape(expected.shape)
    assert np.array_equal(got, expected.view(torch.int16).numpy().view(np.uint16))


def test_bf16_gguf_holds_the_merged_weights_exactly_and_matches(full_export):
    check = full_export["manifest"]["verification"]["gguf"]["bf16"]
    assert check["passed"] and check["top1_agreement"] == 1.0 and check["mean_kl"] < check["kl_bound"]
    bf16 = artifact(full_export, "gguf", "bf16")
    assert abs(bf16["bytes"] - artifact(full_export, "gguf", "f16")["bytes"]) < 4096  # 2 bytes a weight, too
    assert_same_bits(full_export["out"] / bf16["path"], "blk.3.ffn_up.weight", full_export["out"] / "merged",
                     "model.layers.3.mlp.up_proj.weight")


def test_several_llama_cpp_types_from_the_one_f16_conversion(full_export, tmp_path):
    from lanner.inference.generation import open_llama

    from lanner.worker.export import quantize_gguf

    f16 = full_export["out"] / artifact(full_export, "gguf", "f16")["path"]
    sizes = {}
    for qtype in ("q4_0", "q5_k_m", "q6_k"):
        info = quantize_gguf(f16, tmp_path / f"m-{qtype}.gguf", qtype)
        sizes[qtype] = info["bytes"]
        llm = open_llama(info["path"], n_ctx=64)
        try:
            assert llm.create_completion("The capital of France is", max_tokens=4, temperature=0.0)["choices"][0]["text"].strip()
        finally:
            llm.close()
    assert sizes["q4_0"] < sizes["q5_k_m"] < sizes["q6_k"] < artifact(full_export, "gguf", "q8_0")["bytes"]
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


def test_a_gguf_llama_cpp_cannot_load_is_a_failed_check_in_words(full_export, tmp_path):
    from lanner.worker.export.pipeline import check_figures
    from lanner.worker.export.verify import F16_KL_BOUND, verify_gguf

    f16 = full_export["out"] / artifact(full_export, "gguf", "f16")["path"]
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(f16.read_bytes()[: f16.stat().st_size // 2])  # its tensors end past the file
    reference = {"ids": [[1, 2, 3]], "logits": [None]}  # not reached: the file does not load
    check = verify_gguf(cut, reference, kl_bound=F16_KL_BOUND, require_top1=True)
    assert not check["passed"] and check["load_error"]
    [figure] = check_figures(check)
    assert figure.figure == "loads in llama.cpp" and not figure.passed and "refused to load" in figure.meaning


# Unlike the check's own prompts (English, code, a short chat turn): German, numbers, markup, SQL.
OTHER_PROMPTS = ("Die Hauptstadt von Deutschland ist Berlin, und die von Spanien ist",
                 "1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144,",
                 "<html><body><h1>Lanner</h1><p>A studio for fine-tuning language models on your own GPU.</p>",
                 "SELECT name, COUNT(*) FROM jobs WHERE status = 'failed' GROUP BY name ORDER BY 2 DESC;")


def test_merged_weights_are_the_float32_merge_rounded_once(full_export, smollm2_dir, trained_adapter):
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    expected = PeftModel.from_pretrained(base, trained_adapter).merge_and_unload().state_dict()
    exported = load_file(full_export["out"] / "merged" / "model.safetensors")
    differ = [name for name, tensor in exported.items() if not torch.equal(tensor, expected[name].to(torch.bfloat16))]
    assert exported and differ == []


def test_the_merged_bound_holds_on_prompts_unlike_the_checks(full_export, smollm2_dir, trained_adapter, tmp_path):
    """The bound is one cast of the float32 merge to the merged dtype (docs/export.md): a right merge
    sits on it, on any prompts; one rounded twice (the base on load, the sum again) does not."""
    from lanner.worker.export import export_merged, verify_merged

    merged_dirs = {"bfloat16": full_export["out"] / "merged"}
    merged_dirs["float16"] = export_merged(smollm2_dir, trained_adapter, tmp_path / "merged-f16", dtype="float16")["path"]
    for dtype, merged_dir in merged_dirs.items():
        check = verify_merged(smollm2_dir, trained_adapter, merged_dir, texts=OTHER_PROMPTS)
        print(f"\n{dtype} on other prompts: max |logit diff| {check['max_abs_logit_diff']:.4f}, one cast "
              f"{check['noise_floor_max_abs_logit_diff']:.4f}, bound {check['bound_max_abs_logit_diff']:.4f}")
        assert check["merged_dtype"] == dtype and check["passed"], check
        assert check["max_abs_logit_diff"] <= check["noise_floor_max_abs_logit_diff"] + 1e-4


def test_the_adapter_loads_with_peft_alone_by_the_base_it_names(full_export, smollm2_dir, trained_adapter, tmp_path):
    """As a user outside Lanner loads it: AutoPeftModelForCausalLM finds the base by the name in
    adapter_config.json. No hub here: the base is put in a Hugging Face cache under its hub id, read
    offline, in a fresh interpreter."""
    import os
    import subprocess
    import sys

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    adapter_dir = full_export["out"] / artifact(full_export, "adapter")["path"]
    card = (adapter_dir / "README.md").read_text()
    assert f"base_model: {BASE_MODEL_HUB_ID}" in card and "AutoPeftModelForCausalLM.from_pretrained(adapter)" in card
    snapshot = tmp_path / "hub" / f"models--{BASE_MODEL_HUB_ID.replace('/', '--')}" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for file in smollm2_dir.iterdir():
        (snapshot / file.name).symlink_to(file)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("0" * 40)
    ids = [1, 504, 3575, 282, 4649, 314]
    script = ("import sys, torch; from peft import AutoPeftModelForCausalLM; "
              "model = AutoPeftModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32); "
              f"torch.save(model(torch.tensor([{ids}])).logits, sys.argv[2])")
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", script, str(adapter_dir), str(tmp_path / "logits.pt")], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    base = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    with torch.no_grad():
        expected = PeftModel.from_pretrained(base, trained_adapter).eval()(torch.tensor([ids])).logits
    # the same weights; the other interpreter's thread count may order the float32 sums differently
    assert torch.allclose(torch.load(tmp_path / "logits.pt"), expected, rtol=0, atol=1e-4)


def test_an_adapter_names_a_local_base_by_its_path_and_a_hub_base_by_its_id(tmp_path):
    from lanner.worker.export import ExportRequest
    from lanner.worker.export.pipeline import loadable_base_name

    local = tmp_path / "models" / "my-model"
    downloaded = tmp_path / "models" / "org" / "hub-model"  # where the studio downloads a hub model
    for folder in (local, downloaded):
        folder.mkdir(parents=True)
    expected = [("my-model", local, str(local.resolve())), (str(local), local, str(local.resolve())),
                ("org/hub-model", "org/hub-model", "org/hub-model"), ("org/hub-model", downloaded, "org/hub-model"),
                ("builtin/SmolLM2-135M-Instruct", local, BASE_MODEL_HUB_ID)]
    for model, path, name in expected:
        request = ExportRequest(base_model_dir=path, adapter_dir=None, out_dir=tmp_path, base_model_name=model)
        assert loadable_base_name(request) == name, model
