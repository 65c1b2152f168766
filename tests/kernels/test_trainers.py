"""Training under TRL's SFTTrainer, and the saved adapter in plain PEFT."""
import json

import torch
from datasets import Dataset
from peft import PeftModel
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer

from lanner.kernels.patching.binding import is_patched
from lora_twins import tiny_model, twins

LOSS_RTOL = 1e-4


def word_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, vocab_size)}}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def text_dataset(rows: int, vocab_size: int) -> Dataset:
    generator = torch.Generator().manual_seed(5)
    lengths = torch.randint(3, 7, (rows,), generator=generator).tolist()  # ragged: the collator pads
    texts = [" ".join(f"w{int(t)}" for t in torch.randint(3, vocab_size, (n,), generator=generator)) for n in lengths]
    return Dataset.from_dict({"text": texts})


def sft_logs(model, tokenizer, dataset, output_dir, trainer_class=SFTTrainer, **config):
    args = SFTConfig(**{
        "output_dir": str(output_dir), "max_steps": 3, "per_device_train_batch_size": 2, "learning_rate": 1e-2,
        "logging_steps": 1, "report_to": [], "save_strategy": "no", "max_length": 16, "seed": 0,
        "gradient_checkpointing": False, "use_cpu": not torch.cuda.is_available(), "bf16": False, "fp16": False,
        "dataloader_num_workers": 0, **config})
    trainer = trainer_class(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    trainer.train()
    return [entry for entry in trainer.state.log_history if "loss" in entry]


def sft_losses(model, tokenizer, dataset, output_dir):
    return [entry["loss"] for entry in sft_logs(model, tokenizer, dataset, output_dir)]


def test_sft_trainer_trains_like_plain_peft_and_the_adapter_loads_in_plain_peft(tmp_path, device):
    plain, fast = twins("llama", device=device)
    tokenizer = word_tokenizer(plain.config.vocab_size)
    dataset = text_dataset(6, plain.config.vocab_size)

    losses_plain = sft_losses(plain, tokenizer, dataset, tmp_path / "plain")
    losses_fast = sft_losses(fast, tokenizer, dataset, tmp_path / "fast")
    assert len(losses_fast) == 3 and all(torch.isfinite(torch.tensor(losses_fast)))
    layer = fast.get_base_model().model.layers[0]
    assert is_patched(layer.mlp) and is_patched(layer.self_attn)  # the trainer kept our forwards
    for ours, reference in zip(losses_fast, losses_plain, strict=True):
        assert abs(ours - reference) <= LOSS_RTOL * abs(reference)

    adapter_dir = tmp_path / "adapter"
    fast.save_pretrained(adapter_dir)
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and set(config["target_modules"]) == {
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}

    reloaded = PeftModel.from_pretrained(tiny_model("llama", device=device), adapter_dir).eval()
    fast.eval()
    ids = torch.randint(3, plain.config.vocab_size, (2, 6), device=device)
    with torch.no_grad():
        torch.testing.assert_close(fast(input_ids=ids).logits, reloaded(input_ids=ids).logits, rtol=1e-5, atol=1e-5)


def test_the_studio_sft_trainer_takes_its_loss_from_the_fused_head_with_trls_numbers(tmp_path, device, monkeypatch):
    """TRL's SFTTrainer computes the loss through a head of its own; the studio's runs the kernels'
    fused linear + cross-entropy instead, with the same loss (over accumulated micro-batches too) and
    the same token count."""
    from lanner.kernels.patching import loss as loss_module
    from lanner.worker.training.sft import KernelLossSFTTrainer

    fused = loss_module.fused_linear_cross_entropy
    calls = []
    monkeypatch.setattr(loss_module, "fused_linear_cross_entropy", lambda *a, **k: calls.append(1) or fused(*a, **k))
    plain, fast = twins("llama", device=device)
    tokenizer = word_tokenizer(plain.config.vocab_size)
    dataset = text_dataset(12, plain.config.vocab_size)

    reference = sft_logs(plain, tokenizer, dataset, tmp_path / "trl", gradient_accumulation_steps=2)
    ours = sft_logs(fast, tokenizer, dataset, tmp_path / "ours", KernelLossSFTTrainer, gradient_accumulation_steps=2)
    assert len(calls) == 6  # 3 steps of 2 micro-batches, each through the kernels' loss
    assert len(ours) == 3 and "entropy" not in ours[0]
    for entry, expected in zip(ours, reference, strict=True):
        assert abs(entry["loss"] - expected["loss"]) <= LOSS_RTOL * abs(expected["loss"])
        assert entry["num_tokens"] == expected["num_tokens"]
        # logged one step late, under the step's own number and values
        assert (entry["step"], entry["learning_rate"]) == (expected["step"], expected["learning_rate"])
        assert abs(entry["grad_norm"] - expected["grad_norm"]) <= 1e-3 * expected["grad_norm"]


def test_a_late_logged_step_is_in_its_checkpoint_and_before_the_evaluation_after_it(tmp_path, device):
    """A step that saves or evaluates is logged at once: the checkpoint's trainer state holds every
    step up to it, and the evaluation's line comes after the step's."""
    from lanner.worker.training.sft import KernelLossSFTTrainer

    _, fast = twins("llama", device=device)
    tokenizer = word_tokenizer(fast.config.vocab_size)
    dataset = text_dataset(16, fast.config.vocab_size)
    args = SFTConfig(output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=2, learning_rate=1e-2,
                     logging_steps=1, report_to=[], save_strategy="steps", save_steps=3, eval_strategy="steps",
                     eval_steps=2, max_length=16, seed=0, use_cpu=not torch.cuda.is_available(),
                     dataloader_num_workers=0)
    trainer = KernelLossSFTTrainer(model=fast, args=args, train_dataset=dataset, eval_dataset=dataset.select(range(4)),
                                   processing_class=tokenizer)
    trainer.train()
    order = [("eval" if "eval_loss" in entry else "train" if "train_runtime" in entry else "step", entry["step"])
             for entry in trainer.state.log_history]
    assert order == [("step", 1), ("step", 2), ("eval", 2), ("step", 3), ("step", 4), ("eval", 4), ("train", 4)]
    saved = json.loads((tmp_path / "checkpoint-3" / "trainer_state.json").read_text())["log_history"]
    assert [entry["step"] for entry in saved if "loss" in entry] == [1, 2, 3]
