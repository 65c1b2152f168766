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
