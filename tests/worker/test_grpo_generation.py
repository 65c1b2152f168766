"""LannerGRPOTrainer generates on the model's own forwards and trains on the kernels: a tiny random
Llama with LoRA on the kernels (Triton's interpreter on the CPU), one GRPO step in this process."""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before anything imports triton
    os.environ.setdefault("TRITON_INTERPRET", "1")

from datasets import Dataset  # noqa: E402
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from lanner.kernels import get_lora_model, patch_model  # noqa: E402
from lanner.kernels.patching.binding import is_patched  # noqa: E402
from lanner.worker.training.grpo import LannerGRPOTrainer  # noqa: E402


def test_generation_runs_the_models_own_forwards_and_training_the_kernels(smollm2_dir, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    model = get_lora_model(LlamaForCausalLM(config), r=4, lora_alpha=8, use_kernels=False)
    assert patch_model(model).active
    base = model.get_base_model()
    layer = base.model.layers[0]
    calls = []  # (tokens in the call, grad on, norm and MLP patched, attention implementation)

    def record(module, args, kwargs):
        calls.append((args[0].shape[1], torch.is_grad_enabled(), is_patched(layer.input_layernorm),
                      is_patched(layer.mlp), base.config._attn_implementation))

    layer.mlp.register_forward_pre_hook(record, with_kwargs=True)
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2,
                      max_completion_length=3, max_steps=1, beta=0.0, report_to=[], save_strategy="no",
                      logging_steps=1, bf16=False, use_cpu=True, generation_kwargs={"min_new_tokens": 3})
    trainer = LannerGRPOTrainer(model=model, args=args, processing_class=tokenizer,
                                reward_funcs=[lambda prompts, completions, **_: [float(len(c)) for c in completions]],
                                train_dataset=Dataset.from_list([{"prompt": "one two three"}] * 2),
                                on_samples=None, samples_logged=0)
    trainer.train()

    decoding = [call for call in calls if call[0] == 1]
    training = [call for call in calls if call[1]]
    assert len(decoding) == 2 and training  # two tokens decoded after the prefill; a forward and its recompute
    assert all(call[2:] == (False, False, "sdpa") for call in decoding)
    assert all(call[2:] == (True, True, "lanner") for call in training)
