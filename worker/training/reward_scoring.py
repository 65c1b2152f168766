"""A finished reward job's model as a GRPO reward function (kind reward_model): loaded once in the
training process, on the job's device, and run on each batch of completions without gradients. A
prompt and its completion are put together and tokenized as the RewardTrainer put together a prompt
and its chosen answer, with the reward model's own tokenizer and chat template, so the policy's
tokenizer need not be the reward model's."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from trl.data_utils import _tokenize

from lanner.core.models import ArtifactKind
from lanner.core.memory_estimate import REWARD_SCORING_BATCH
from lanner.core.settings import Settings
from lanner.core.storage import get_store, local_copy
from lanner.worker.job_process import JobFailed
from lanner.worker.training.model import device, resolve_model



def trained_folder(settings: Settings, job_id: int) -> Path:
    """The reward job's saved adapter (with the score head) or whole model, from the store (fetched into
    this host's cache unless the store is the data dir)."""
    store = get_store(settings)
    for kind in (ArtifactKind.adapter, ArtifactKind.model):
        key = f"artifacts/{job_id}/{kind}"
        if store.is_folder(key):
            return local_copy(settings, key)
    raise JobFailed(f"Reward model: job {job_id}'s trained model is gone (its adapter or model artifact was deleted).")


class RewardModelScorer:
    def __init__(self, job_id: int, settings: Settings, dtype: torch.dtype, max_length: int):
        from peft import PeftModel
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from lanner.worker.train_process import TRAINING_RECORD

        folder = trained_folder(settings, job_id)
        record = json.loads((folder / TRAINING_RECORD).read_text())
        self.tokenizer = AutoTokenizer.from_pretrained(folder, truncation_side="left")  # the completion is kept
        adapter = record["saved"] == ArtifactKind.adapter
        base = resolve_model(record["base_model"], settings) if adapter else folder
        model = AutoModelForSequenceClassification.from_pretrained(base, num_labels=1, dtype=dtype)
        model.config.pad_token_id = self.tokenizer.pad_token_id
        if adapter:
            model = PeftModel.from_pretrained(model, folder)
        self.model = model.to(device()).eval()
        self.max_length = max_length

    def _ids(self, prompt, completion) -> list[int]:
        if isinstance(prompt, list):
            reply = completion if isinstance(completion, list) else [{"role": "assistant", "content": completion}]
            ids = _tokenize(self.tokenizer, prompt + reply)["input_ids"]
        else:
            text = prompt + completion
            if not text.endswith(self.tokenizer.eos_token):
                text += self.tokenizer.eos_token
            ids = _tokenize(self.tokenizer, text)["input_ids"]
        return ids[-self.max_length:]

    @torch.no_grad()
    def __call__(self, prompts: list, completions: list) -> list[float]:
        scores = []
        for start in range(0, len(completions), REWARD_SCORING_BATCH):
            ids = [{"input_ids": self._ids(p, c)}
                   for p, c in zip(prompts[start:start + REWARD_SCORING_BATCH], completions[start:start + REWARD_SCORING_BATCH])]
            batch = self.tokenizer.pad(ids, return_tensors="pt").to(self.model.device)
            scores += self.model(**batch).logits[:, 0].float().tolist()
        return scores
