"""Every method's model goes on lanner.kernels unless the job's use_kernels option says not. The
model is built as the training process builds it; TRITON_INTERPRET=1 lets patch_model patch a CPU
model (nothing runs on the kernels here, so the interpreter's slowness costs nothing)."""
from __future__ import annotations

import pytest

from lanner.core.db import session_factory
from lanner.core.streams import job_stream, read_after
from lanner.kernels.patching.binding import is_patched
from lanner.worker.events import JobEvents
from lanner.worker.training.model import load_model

from worker_helpers import training_options_of


@pytest.mark.parametrize("method", ["lora", "full"])
def test_the_model_goes_on_the_kernels_unless_the_job_switches_them_off(studio, smollm2_dir, monkeypatch, method):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    events = JobEvents(1, studio.redis, session_factory(studio.database_url))
    on = load_model(str(smollm2_dir), training_options_of(method, {"hyperparameters": {"use_kernels": True}}), events)
    assert any(is_patched(module) for module in on.modules())
    del on
    off = load_model(str(smollm2_dir), training_options_of(method, {"hyperparameters": {"use_kernels": False}}), events)
    assert not any(is_patched(module) for module in off.modules())

    lines = [data["message"] for _, kind, data in read_after(studio.redis, job_stream(1))
             if kind == "log" and data["message"].startswith("lanner.kernels")]
    assert len(lines) == 2
    assert lines[0].startswith("lanner.kernels: on for llama ({") and "'rms_norm': 61" in lines[0], lines
    assert lines[1] == "lanner.kernels: off (the job's use_kernels option); plain PyTorch and PEFT"
