"""LoRA over a quantised base on the real SmolLM2 on the CPU: qlora (linear layers stored in 4-bit NF4,
get_lora_model(load_in_4bit=True)) and lora_fp8 (stored and multiplied in FP8, get_lora_model(load_in_fp8=True),
here through the exact float32 emulation of the FP8 GEMM); the result is an ordinary adapter."""
from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from training_run import logs, step_metrics, trained
from worker_helpers import qa_rows


@pytest.mark.parametrize("method, base", [("qlora", "a 4-bit NF4 base"), ("lora_fp8", "an FP8 base")])
def test_lora_trains_an_adapter_over_a_quantised_base(studio, method, base):
    job_id = studio.job(studio.dataset("qa.jsonl", qa_rows(6)),
                        {"hyperparameters": {"max_steps": 2, "max_seq_len": 48, "before_after_eval": False}}, method=method)
    trained(studio, job_id)

    metrics = step_metrics(studio, job_id)
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["loss"] > 0 and m["grad_norm"] > 0 for m in metrics)
    lines = logs(studio, job_id)
    model_line = next(line for line in lines if line.startswith("Model "))
    assert f"(LoRA over {base})" in model_line, model_line
    assert any(line.startswith("lanner.kernels: ") for line in lines), lines

    adapter = studio.data_dir / "artifacts" / str(job_id) / "adapter"
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert (config["r"], sorted(config["target_modules"])) == (4, ["q_proj", "v_proj"])
    weights = load_file(adapter / "adapter_model.safetensors")
    lora_b = [tensor for name, tensor in weights.items() if "lora_B" in name]
    assert lora_b and all(tensor.abs().sum() > 0 for tensor in lora_b)  # zero at the start: trained
    assert not any("base_layer" in name or name.endswith("proj.weight") for name in weights)
