"""The layers of a local checkpoint that LoRA can adapt, read from its safetensors header (no tensor loaded), and
the check of a job's lora.target_modules against them."""
from __future__ import annotations

import json

import numpy as np
from safetensors.numpy import save_file

from lanner.core.model_modules import adaptable_layers, target_modules_problem, weight_shapes
from lanner.core.settings import Settings

LAYER = "model.layers.0"
WEIGHTS = {  # a dense attention, per-expert MLPs (Qwen3-MoE's and Mixtral's names), a stacked mixture (gpt-oss's)
    "model.embed_tokens.weight": (16, 4), f"{LAYER}.input_layernorm.weight": (4,), "model.norm.weight": (4,),
    f"{LAYER}.self_attn.q_proj.weight": (4, 4), f"{LAYER}.self_attn.q_proj.bias": (4,),
    f"{LAYER}.self_attn.c_attn.qweight": (4, 4),  # GPTQ's
    f"{LAYER}.mlp.gate.weight": (2, 4),
    f"{LAYER}.mlp.experts.0.gate_proj.weight": (3, 4), f"{LAYER}.mlp.experts.1.w1.weight": (3, 4),
    "model.layers.1.mlp.experts.gate_up_proj": (2, 4, 6), "model.layers.1.mlp.experts.gate_up_proj_bias": (2, 6),
    "model.layers.1.mlp.experts.down_proj_blocks": (2, 4, 1, 16),
}


def write_checkpoint(folder, weights=WEIGHTS) -> None:
    folder.mkdir(parents=True)
    save_file({name: np.zeros(shape, np.float32) for name, shape in weights.items()}, str(folder / "model.safetensors"))


def test_the_layers_are_read_from_the_header_dense_and_experts(tmp_path):
    write_checkpoint(tmp_path / "model")
    assert weight_shapes(tmp_path / "model") == WEIGHTS
    assert adaptable_layers(WEIGHTS) == {
        "model.embed_tokens", f"{LAYER}.self_attn.q_proj", f"{LAYER}.self_attn.c_attn", f"{LAYER}.mlp.gate", f"{LAYER}.mlp.experts.0.gate_proj",
        f"{LAYER}.mlp.experts.1.w1", "model.layers.1.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.down_proj"}
    # A shard index gives the names, its shards the shapes; a .bin index the names alone (every one taken).
    (tmp_path / "model" / "model.safetensors").rename(tmp_path / "model" / "model-00001-of-00001.safetensors")
    index = {"weight_map": dict.fromkeys(WEIGHTS, "model-00001-of-00001.safetensors")}
    (tmp_path / "model" / "model.safetensors.index.json").write_text(json.dumps(index))
    assert weight_shapes(tmp_path / "model") == WEIGHTS
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    assert weight_shapes(tmp_path / "bin") == dict.fromkeys(WEIGHTS)
    assert weight_shapes(tmp_path) is None


def test_targets_are_checked_against_a_local_checkpoint_and_a_hub_model_not_downloaded_is_not(tmp_path):
    settings = Settings(data_dir=tmp_path)
    write_checkpoint(settings.models_dir / "org" / "moe")  # a hub model downloaded into DATA_DIR/models

    def problem(targets, model="org/moe"):
        return target_modules_problem(model, targets, settings)

    for accepted in (["q_proj", "v_proj"], ["gate_proj", "up_proj", "down_proj"], ["w1", "gate"], ["gate_up_proj"],
                     ["c_attn"], ["experts.down_proj"], ["self_attn.q_proj"], [f"{LAYER}.mlp.experts.0.gate_proj"],
                     ["lm_head", "embed_tokens"], []):
        assert problem(accepted) is None, accepted
    assert problem(["nonexistent_proj", "q_projx", "nonexistent_proj"]) == (
        "lora.target_modules: 'nonexistent_proj', 'q_projx' name no layer of moe that LoRA can adapt; its linear and "
        "embedding layers are q_proj, gate_proj, down_proj, embed_tokens, lm_head, c_attn, gate, gate_up_proj, w1 "
        "(or all-linear)")
    for refused in ([""], ["proj"], ["_proj"], ["layers.0"], ["experts"], ["mlp.experts.0.q_proj"]):
        assert "that LoRA can adapt" in problem(refused), refused
    assert "(input_layernorm names only layers with no 2-D weight, such as norms)" in problem(["input_layernorm"])
    assert problem(["nonexistent_proj"], model=str(settings.models_dir / "org" / "moe")) is not None  # a local path
    assert problem(["nonexistent_proj"], model="org/elsewhere") is None  # not downloaded: the worker tells
    assert problem(["nonexistent_proj"], model="builtin/SmolLM2-135M-Instruct") is None  # not imported yet
