"""Kahneman-Tversky optimisation with TRL's KTOTrainer, on unpaired rows (prompt, completion, label:
desirable or not) or on preference pairs, split here into a desirable and an undesirable row each.
The reference is the starting model (on a LoRA model: a frozen copy of the fresh adapter)."""
from __future__ import annotations

from datasets import Dataset
from trl import KTOConfig, KTOTrainer, unpair_preference_dataset

from lanner.worker.training.common import common_args, rows_that_fit, split
from lanner.worker.training.options import TrainingOptions


def unpaired(dataset: Dataset | None, seed: int) -> Dataset | None:
    """Pairs as unpaired rows, shuffled: TRL would unpair them itself, but as all the chosen rows
    followed by all the rejected ones, and KTO reads its data in order (its KL term pairs each row
    with its neighbours), so every micro-batch would be all desirable or all undesirable."""
    if dataset is None or "chosen" not in dataset.column_names:
        return dataset
    return unpair_preference_dataset(dataset).shuffle(seed=seed)


def build_trainer(model, tokenizer, rows: list[dict], options: TrainingOptions, output_dir: str,
                  callbacks: list) -> KTOTrainer:
    rows = rows_that_fit(rows, tokenizer, options, callbacks)
    train, evaluation = (unpaired(part, options.seed) for part in split(rows, options))
    args = KTOConfig(**common_args(options, output_dir, evaluation is not None), beta=options.beta)
    return KTOTrainer(model=model, ref_model=None, args=args, train_dataset=train, eval_dataset=evaluation,
                      processing_class=tokenizer, callbacks=callbacks)
