"""lanner.kernels' memory engine and padding-free packing in studio jobs, on the CPU with the real
SmolLM2: the engine built with the job's budget and its plan in the job's log, offloading refused in
words on the CPU, packed rows that train, and packed batches whose samples do not see each other on
the kernels (Triton's interpreter)."""
from __future__ import annotations

import json
import os
from dataclasses import replace
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lanner.core.dataset_formats import examine
from lanner.core.db import session_factory
from lanner.core.streams import job_stream, read_after
from lanner.kernels import get_lora_model, memory_engine_of
from lanner.worker.events import JobEvents
from lanner.worker.training.model import load_model, load_tokenizer

from job_specs import merged
from training_run import logs, step_metrics, trained
from worker_helpers import REPO, qa_rows, training_options_of

HERE = Path(__file__).resolve().parent

GIB = 2**30
SMALL = {"lora": {"rank": 4, "target_modules": ["q_proj", "v_proj"]}, "hyperparameters": {"precision": "fp32"}}


def _log_lines(studio, job_id: int) -> list[tuple[str, str]]:
    return [(data["level"], data["message"]) for _, kind, data in read_after(studio.redis, job_stream(job_id))
            if kind == "log"]


def test_the_job_builds_the_engine_with_its_budget_and_says_what_it_ignores(studio, smollm2_dir, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the CPU as a studio runs it: no kernels
    events = JobEvents(1, studio.redis, session_factory(studio.database_url))
    options = training_options_of("lora", merged(SMALL, {"hyperparameters": {"memory_budget_gib": 1.5,
                                                                             "offload_checkpoints": True}}))
    model = load_model(str(smollm2_dir), options, events)
    engine = memory_engine_of(model)
    assert engine is not None and (engine.budget_bytes, engine.offload) == (int(1.5 * GIB), None)
    del model, engine

    # A budget with the kernels off: the API refuses that spec; the model still loads, and says so.
    off = load_model(str(smollm2_dir), replace(options, use_kernels=False), events)
    assert memory_engine_of(off) is None
    del off
    no_budget = load_model(str(smollm2_dir), training_options_of("lora", SMALL), events)
    assert memory_engine_of(no_budget) is None  # without the kernels nor a budget, transformers' checkpointing

    lines = [(level, line) for level, line in _log_lines(studio, 1) if line.startswith("Memory engine")]
    assert lines == [
        ("warning", "Memory engine (lanner.kernels): offload_checkpoints ignored on the CPU (it moves layer inputs "
                    "from the GPU to host memory)"),
        ("info", "Memory engine (lanner.kernels): on (budget 1.5 GiB, offloading if the budget needs it); the plan "
                 "follows at the first training step"),
        ("warning", "Memory engine (lanner.kernels): memory_budget_gib and offload_checkpoints ignored; they need "
                    "a LoRA adapter, use_kernels and gradient_checkpointing on"),
    ], lines


def test_with_the_kernels_every_lora_job_runs_on_the_engine(studio, smollm2_dir, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # lets patch_model patch a CPU model; nothing runs here
    events = JobEvents(1, studio.redis, session_factory(studio.database_url))
    lora = load_model(str(smollm2_dir), training_options_of("lora", SMALL), events)
    assert memory_engine_of(lora) is not None and memory_engine_of(lora).budget_bytes is None
    del lora
    full = load_model(str(smollm2_dir), training_options_of("full", {"hyperparameters": {"precision": "fp32"}}), events)
    assert memory_engine_of(full) is None
    assert [line for _, line in _log_lines(studio, 1) if line.startswith("Memory engine")] == [
        "Memory engine (lanner.kernels): on (no budget: every layer recomputed); the plan follows at the first "
        "training step"]


def test_a_packed_job_on_a_budget_trains_packed_rows_and_logs_the_engine_plan(studio):
    # 12 chats of about 50 tokens: unpacked, 6 steps of 2; packed into rows of 256 tokens, 4 or 5 a row.
    job_id = studio.job(studio.dataset("qa.jsonl", qa_rows(12)), {"hyperparameters": {
        "max_steps": None, "epochs": 1, "max_seq_len": 256, "batch_size": 2,
        "packing": True, "gradient_checkpointing": True, "memory_budget_gib": 0.6, "offload_checkpoints": True,
        "before_after_eval": False, "save_steps": 100}})
    trained(studio, job_id)
    lines = logs(studio, job_id)

    packing = next(line for line in lines if line.startswith("Packing: "))
    found = re.match(r"Packing: (\d+) samples in (\d+) rows of up to 256 tokens, each sample attending only to "
                     r"itself; ([\d,]+) tokens an epoch", packing)
    samples, rows, tokens = int(found[1]), int(found[2]), int(found[3].replace(",", ""))
    assert samples == 12 and rows <= 4, packing
    metrics = step_metrics(studio, job_id)
    assert [m["step"] for m in metrics] == list(range(1, (rows + 1) // 2 + 1))  # unpacked: 6 steps
    assert metrics[-1]["num_tokens"] == tokens  # every token of the epoch, and no padding
    assert metrics[0]["num_tokens"] >= 4 * tokens / samples  # a micro-batch of 2 rows: 4 samples' worth or more
    assert all(m["loss"] > 0 for m in metrics)
    # Samples, not rows, a second: 2 rows a step of samples / rows samples each.
    assert metrics[0]["samples_per_second"] * metrics[0]["step_time"] == pytest.approx(2 * samples / rows)

    assert "Memory engine (lanner.kernels): on (budget 0.6 GiB, offloading if the budget needs it); the plan follows " \
           "at the first training step" in lines
    plan = next(line for line in lines if line.startswith("lanner.kernels memory plan"))
    assert plan.startswith("lanner.kernels memory plan (30 layers, budget 0.60 GiB): predicted peak"), plan
    # The budget holds a part of the layers' activations: some layers are kept whole, the others not.
    modes = plan.split("per layer: ")[1].split()
    assert len(modes) == 30 and "K" in modes and any(mode != "K" for mode in modes), plan


def test_a_packed_batch_keeps_each_sample_to_itself_on_the_kernels(smollm2_dir, tmp_path):
    """The batch the studio's SFT trainer feeds when packing, through a Llama patched with the kernels
    (Triton's interpreter, which must be on before the kernels are first imported: a process of its
    own): each sample's logits in the packed row equal its logits alone."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    code = (f"import sys; sys.path[:0] = [{str(HERE)!r}, {str(HERE.parent)!r}]; "
            f"from test_memory_engine_jobs import check_packed_batch; "
            f"check_packed_batch({str(smollm2_dir)!r}, {str(tmp_path)!r})")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "samples kept to themselves: " in done.stdout, done.stdout[-3000:]


def check_packed_batch(smollm2_dir: str, out: str) -> None:
    from lanner.kernels.patching.binding import is_patched
    from lanner.worker.training.sft import build_trainer

    options = training_options_of("lora", merged(SMALL, {"hyperparameters": {"packing": True, "max_seq_len": 24,
                                                                             "batch_size": 2}}))
    tokenizer = load_tokenizer(smollm2_dir, options)
    model = get_lora_model(_tiny_llama(len(tokenizer)), r=4, target_modules=["q_proj", "v_proj"])
    assert any(is_patched(module) for module in model.modules())
    path = Path(out) / "qa.jsonl"
    words = "the quick brown fox jumps over the lazy dog".split()
    texts = [" ".join(words[:n]) for n in (3, 8, 5, 2, 6, 4)]  # short text rows: few tokens for the interpreter
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    trainer = build_trainer(model, tokenizer, examine(path)[1], options, str(Path(out) / "run"), [])
    batch = next(iter(trainer.get_train_dataloader()))
    assert "attention_mask" not in batch and batch["input_ids"].shape[0] == 1
    positions = batch["position_ids"][0].tolist()
    starts = [i for i, p in enumerate(positions) if p == 0] + [len(positions)]
    assert len(starts) > 3  # several samples in the batch
    assert all(batch["labels"][0, start] == -100 for start in starts[:-1])  # no sample predicts the next one

    model.eval()
    with torch.no_grad():
        packed = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits[0]
        unmasked = model(input_ids=batch["input_ids"]).logits[0]
        for start, end in zip(starts, starts[1:]):
            alone = model(input_ids=batch["input_ids"][:, start:end]).logits[0]
            torch.testing.assert_close(packed[start:end], alone, rtol=1e-4, atol=1e-4)
        # Fed without its position ids, the same row lets samples see each other: the check can fail.
        second = slice(starts[1], starts[2])
        assert (unmasked[second] - model(input_ids=batch["input_ids"][:, second]).logits[0]).abs().max() > 1e-2
    print(f"samples kept to themselves: {len(starts) - 1}")


def _tiny_llama(vocab_size: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    return LlamaForCausalLM(config).float()
