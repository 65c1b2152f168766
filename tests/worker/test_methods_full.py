"""Whole-model methods on the real SmolLM2 on the CPU: full fine-tuning and continued pretraining
train every weight and save a whole model, not an adapter."""
from __future__ import annotations

import re

import pytest
import torch
from safetensors.torch import load_file
from sqlalchemy import select

from lanner.core.models import Artifact
from lanner.core.spec import DEFAULT_LEARNING_RATE

from training_run import logs, step_metrics, trained
from worker_helpers import qa_rows

TEXT_ROWS = [{"text": f"Day {i}: the river rose {i} inches and the ferry waited on the far bank."} for i in range(6)]


@pytest.mark.parametrize("method, rows", [("full", qa_rows(6)), ("pretrain", TEXT_ROWS)])
def test_whole_model_methods_train_every_weight_and_save_a_model(studio, smollm2_dir, method, rows):
    # No learning rate given: the method's default from the job spec. Checkpointing on, as by default.
    job_id = studio.job(studio.dataset("rows.jsonl", rows), {"hyperparameters": {
        "max_steps": 2, "max_seq_len": 64, "learning_rate": None, "lr_scheduler": "constant",
        "gradient_checkpointing": True}},
                        method=method)
    trained(studio, job_id)

    metrics = step_metrics(studio, job_id)
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["learning_rate"] == DEFAULT_LEARNING_RATE[method] for m in metrics)
    lines = logs(studio, job_id)
    model_line = next(line for line in lines if line.startswith("Model "))
    assert "(every weight)" in model_line and "gradient checkpointing on" in model_line, model_line
    trainable, total = re.search(r"([\d,]+) trainable of ([\d,]+) parameters", model_line).groups()
    assert trainable == total
    assert any(line.startswith("lanner.kernels: ") for line in lines), lines

    with studio.sessions() as session:
        artifacts = {a.kind: a for a in session.execute(select(Artifact).where(Artifact.job_id == job_id)).scalars()}
    assert "adapter" not in artifacts
    model_dir = studio.data_dir / artifacts["model"].path
    assert (model_dir / "config.json").is_file() and not (model_dir / "adapter_config.json").exists()
    saved, base = load_file(model_dir / "model.safetensors"), load_file(smollm2_dir / "model.safetensors")
    assert set(saved) == set(base)
    unchanged = [name for name in base if torch.equal(saved[name].float(), base[name].float())]
    assert unchanged == []
