"""Helpers for the export tests (fixtures are in conftest.py)."""
from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

BASE_MODEL_NAME = "builtin/SmolLM2-135M-Instruct"
BASE_MODEL_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # what an exported adapter names as its base


def make_adapter(base_dir: Path, out_dir: Path, *, lora_b_std: float = 0.03, seed: int = 0,
                 target_modules=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
                 target_parameters=(), **lora_options) -> Path:
    """Plain PEFT LoRA (r=8) on q/k/v/o and the MLP (a mixture of experts: target_parameters, its experts'
    stacked weights), its B matrices set to small random values so it is not a no-op (a fresh LoRA has
    B = 0). Training steps would do the same, but cost minutes on this shared 2-core box. Saved the way
    the trainer saves an adapter (with the tokenizer). lora_options: more of peft.LoraConfig's fields."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)  # lora_A's initialisation
    generator = torch.Generator().manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, task_type="CAUSAL_LM", target_modules=list(target_modules),
                        target_parameters=list(target_parameters) or None, **lora_options)
    model = get_peft_model(model, config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name or "lora_embedding_" in name:  # an embedding's LoRA starts at A = 0
                param.copy_(torch.randn(param.shape, generator=generator) * lora_b_std)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


GPT_OSS_YARN = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "original_max_position_embeddings": 4096, "truncate": False}  # gpt-oss-20b/120b's own


def tiny_model(kind: str, smollm2_dir, out_dir, *, tokenizer_dir=None, vocab_size: int = 49152,
               initializer_range: float = 0.3):
    """A random-init model of `kind` with 2 small layers, saved in f16 with SmolLM2's tokenizer (or the
    one in tokenizer_dir). Large weights and non-trivial norms/biases, so a wrong mapping shows."""
    import torch
    import transformers

    common = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  tie_word_embeddings=False, initializer_range=initializer_range, bos_token_id=1, eos_token_id=2)
    tied = {**common, "tie_word_embeddings": True}
    configs = {
        "llama": lambda: transformers.LlamaConfig(**common),
        "llama-tied": lambda: transformers.LlamaConfig(**tied),
        # Llama 3.1+ RoPE scaling; a short original context so the scaling changes short prompts too.
        "llama3-rope": lambda: transformers.LlamaConfig(**common, rope_parameters={
            "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8}),
        "mistral": lambda: transformers.MistralConfig(**common, sliding_window=None),
        # A window llama.cpp's LLAMA graph does not apply, shorter than the prompt: the GGUF's context stops there.
        "mistral-window": lambda: transformers.MistralConfig(**common, sliding_window=6),
        # YaRN as transformers computes it beyond llama.cpp's own parameters: a set attention factor, betas other than
        # 32/1 and an untruncated ramp (rope.scaling.attn_factor and rope_freqs carry them).
        "llama-yarn": lambda: transformers.LlamaConfig(**common, rope_parameters={
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 512,
            "attention_factor": 0.8, "beta_fast": 8.0, "beta_slow": 2.0, "truncate": False}),
        "qwen2": lambda: transformers.Qwen2Config(**common),
        "qwen3": lambda: transformers.Qwen3Config(**common, head_dim=32),
        "gemma": lambda: transformers.GemmaConfig(**tied, head_dim=16),
        # Soft-capping low enough to bite, a window shorter than the prompt, and a query scalar other
        # than head_dim (llama.cpp fixes it to head_dim: the converter folds the ratio into the weights).
        "gemma2": lambda: transformers.Gemma2Config(**tied, head_dim=16, query_pre_attn_scalar=24, sliding_window=4,
                                                    attn_logit_softcapping=10.0, final_logit_softcapping=15.0),
        # Gemma 3: local and global layers, each with its own RoPE base, linear scaling on the global one; an
        # attention soft-cap in the config that transformers' Gemma 3 never applies (so neither may the GGUF).
        "gemma3": lambda: transformers.Gemma3TextConfig(
            **tied, head_dim=16, query_pre_attn_scalar=24, sliding_window=4, attn_logit_softcapping=10.0,
            layer_types=["sliding_attention", "full_attention"],
            rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}),
        # Gemma 3 whose layers are all global (a window set, but no layer sliding).
        "gemma3-global": lambda: transformers.Gemma3TextConfig(**tied, head_dim=16, sliding_window=4,
                                                               layer_types=["full_attention"] * 2),
        # 4 experts, top-2; the experts' width is not half the hidden size, so a gate/up split on the wrong
        # axis cannot fit, and Qwen's differs from its (unused) dense intermediate_size.
        "qwen3_moe": lambda: transformers.Qwen3MoeConfig(**common, head_dim=32, moe_intermediate_size=96, num_experts=4,
                                                         num_experts_per_tok=2, norm_topk_prob=True),
        "mixtral": lambda: transformers.MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2),
        # Experts stored [E, in, out] with biases, gate/up interleaved; attention sinks; a sliding layer; YaRN as
        # gpt-oss sets it (its untruncated ramp is written as llama.cpp's converter writes it, truncated).
        "gpt_oss": lambda: transformers.GptOssConfig(**common, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                                                     sliding_window=4, layer_types=["sliding_attention", "full_attention"],
                                                     rope_parameters=GPT_OSS_YARN),
    }
    # gpt-oss with tied embeddings: llama.cpp's graph needs output.weight (written as a copy of token_embd).
    configs["gpt_oss-tied"] = lambda: transformers.GptOssConfig(**{**configs["gpt_oss"]().to_dict(),
                                                                   "tie_word_embeddings": True})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(configs[kind]())
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1 + 0.2 * torch.randn_like(param))
            elif name.endswith((".bias", "_bias", "sinks")):  # gpt-oss: experts.*_proj_bias, self_attn.sinks
                param.copy_(0.3 * torch.randn_like(param))
    model.to(torch.float16).save_pretrained(out_dir)  # f16 weights: the f16 GGUF holds them exactly
    source = Path(tokenizer_dir or smollm2_dir)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "tokenizer.model",
                 "special_tokens_map.json"):
        if (source / name).is_file():
            shutil.copy2(source / name, Path(out_dir) / name)
    return out_dir


# The export job tests' own Redis database.
EXPORT_REDIS_URL = os.environ.get("LANNER_TEST_REDIS_URL", "redis://127.0.0.1:6379/0").rsplit("/", 1)[0] + "/10"
PASSWORD = "export-tests-password"


def new_user(settings) -> int:
    from lanner.backend import security
    from lanner.core import db
    from lanner.core.models import User

    with db.session_factory(settings.database_url)() as session:
        user = User(email=f"{uuid.uuid4().hex}@example.com", display_name="T", role="member",
                    password_hash=security.hash_password(PASSWORD))
        session.add(user)
        session.commit()
        return user.id


def signed_in_client(settings, user_id: int):
    from fastapi.testclient import TestClient

    from lanner.core import db
    from lanner.backend.app import create_app
    from lanner.core.models import User
    from lanner.core.settings import get_settings

    get_settings.cache_clear()  # the app reads the environment the settings fixture set
    client = TestClient(create_app())
    with db.session_factory(settings.database_url)() as session:
        email = session.get(User, user_id).email
    response = client.post("/api/auth/sign-in", json={"email": email, "password": PASSWORD})
    assert response.status_code == 200, response.text
    return client


def run_export_job(settings, owner: int, parent: int, options: dict):
    """Queues an export of job `parent` with these options and runs it on a CPU worker slot as a
    worker does; returns (final status, export job id)."""
    from redis import Redis

    from lanner.core import db
    from lanner.core.models import Job, JobKind, JobStatus
    from lanner.core.queue.claim import claim_next_job
    from lanner.worker.devices import cpu_device
    from lanner.worker.runner import run_job

    sessions = db.session_factory(settings.database_url)
    with sessions() as session:
        session.add(Job(owner_id=owner, kind=JobKind.export, name="export", method="export", model=BASE_MODEL_NAME,
                        parent_job_id=parent, status=JobStatus.queued, config={"export": options}))
        session.commit()
    with sessions() as session:
        job = claim_next_job(session, "cpu0@test", cpu_device())
    assert job is not None and job.kind == JobKind.export
    redis = Redis.from_url(EXPORT_REDIS_URL, decode_responses=True)
    return run_job(settings, sessions, redis, job, "cpu0@test", cpu_device()), job.id
