"""Direct preference optimisation with TRL's DPOTrainer. On a LoRA model the reference is the same
network with the adapter switched off, so it costs no second copy of the weights; a whole-model run
gets TRL's frozen copy of the starting model."""
from __future__ import annotations

from trl import DPOConfig, DPOTrainer

from lanner.worker.training.common import common_args, rows_that_fit, split
from lanner.worker.training.options import TrainingOptions


def build_trainer(model, tokenizer, rows: list[dict], options: TrainingOptions, output_dir: str,
                  callbacks: list) -> DPOTrainer:
    train, evaluation = split(rows_that_fit(rows, tokenizer, options, callbacks), options)
    args = DPOConfig(**common_args(options, output_dir, evaluation is not None), beta=options.beta)
    return DPOTrainer(model=model, ref_model=None, args=args, train_dataset=train, eval_dataset=evaluation,
                      processing_class=tokenizer, callbacks=callbacks)
