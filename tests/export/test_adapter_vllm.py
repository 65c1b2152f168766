"""The adapter export refuses what vLLM's LoRA loader would reject, and normalises the rest."""
from __future__ import annotations

import json
import shutil

import pytest
from export_helpers import BASE_MODEL_NAME


def adapter_copy(trained_adapter, tmp_path, **config_changes):
    copy = tmp_path / "adapter-in"
    shutil.copytree(trained_adapter, copy)
    config = json.loads((copy / "adapter_config.json").read_text())
    config.update(config_changes)
    (copy / "adapter_config.json").write_text(json.dumps(config))
    return copy


@pytest.mark.parametrize("changes, reason", [
    ({"use_dora": True}, "DoRA"),
    ({"bias": "lora_only"}, "bias"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    ({"rank_pattern": {"q_proj": 16}}, "rank_pattern"),
])
def test_refuses_what_vllm_rejects(trained_adapter, tmp_path, changes, reason):
    from lanner.worker.export import ExportError, export_adapter

    with pytest.raises(ExportError, match=reason):
        export_adapter(adapter_copy(trained_adapter, tmp_path, **changes), tmp_path / "out", base_model=BASE_MODEL_NAME)
    assert not (tmp_path / "out").exists()


def test_regex_target_modules_become_a_list_of_what_the_file_holds(trained_adapter, tmp_path):
    from lanner.worker.export import export_adapter

    source = adapter_copy(trained_adapter, tmp_path, target_modules=r".*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)",
                          base_model_name_or_path="/some/local/path")
    info = export_adapter(source, tmp_path / "out", base_model=BASE_MODEL_NAME)
    config = json.loads((tmp_path / "out" / "adapter_config.json").read_text())
    assert config["target_modules"] == sorted(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    assert config["base_model_name_or_path"] == BASE_MODEL_NAME
    assert info["vllm"]["compatible"] and info["r"] == 8
    assert (tmp_path / "out" / "tokenizer.json").is_file()


def test_the_base_s_hub_commit_is_in_adapter_config_and_the_card(trained_adapter, tmp_path):
    from lanner.worker.export import export_adapter

    export_adapter(adapter_copy(trained_adapter, tmp_path), tmp_path / "out", base_model="org/base", revision="0123abcd")
    config = json.loads((tmp_path / "out" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "org/base" and config["revision"] == "0123abcd"  # peft loads it there
    assert "`org/base` at commit `0123abcd`" in (tmp_path / "out" / "README.md").read_text()


@pytest.mark.parametrize("missing", ["adapter_model.safetensors", "adapter_config.json"])
def test_an_adapter_folder_without_its_files_is_refused_in_words(trained_adapter, tmp_path, missing):
    from lanner.worker.export import ExportError, ExportRequest, run_export

    source = adapter_copy(trained_adapter, tmp_path)
    (source / missing).unlink()
    with pytest.raises(ExportError, match=f"has no {missing}"):
        run_export(ExportRequest(base_model_dir=tmp_path / "no-base", adapter_dir=source, out_dir=tmp_path / "export",
                                 merged=False, gguf_types=()))


def test_an_adapter_on_some_layers_only_names_exactly_those(smollm2_dir, tmp_path):
    """By their short name (q_proj) the adapter's modules would match every layer's: PEFT would add LoRA layers the
    file has no tensors for and initialise them (randomly, with init_lora_weights false), another model. Such
    modules are named in full; the exported adapter loads in plain PEFT as the trained one."""
    import torch
    from export_helpers import make_adapter, tiny_model
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from lanner.worker.export import export_adapter

    base = tiny_model("llama", smollm2_dir, tmp_path / "base", initializer_range=0.05)
    layer_1 = ["model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.v_proj"]
    adapter = make_adapter(base, tmp_path / "adapter", target_modules=layer_1 + ["o_proj"], init_lora_weights=False)
    export_adapter(adapter, tmp_path / "out", base_model=str(base), base_model_dir=base)
    config = json.loads((tmp_path / "out" / "adapter_config.json").read_text())
    assert config["target_modules"] == layer_1 + ["o_proj"]

    ids = torch.tensor([[1, 504, 3575, 282, 4649, 314]])

    def logits(adapter_dir):
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), adapter_dir)
        with torch.no_grad():
            return model.eval()(ids).logits

    assert torch.equal(logits(tmp_path / "out"), logits(adapter))
