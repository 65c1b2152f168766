"""Rows whose answer max_seq_len cuts off whole: left out with a count in the job's log, or the job
failed in words when none is left, for every method (TRL drops them unsaid, keeps them in packed rows
with no label to learn, or trains on them as NaN)."""
from __future__ import annotations

import pytest

from lanner.worker.job_process import JobFailed
from lanner.worker.training.callbacks import MetricsCallback
from lanner.worker.training.common import rows_the_template_takes, rows_that_fit
from lanner.worker.training.model import load_tokenizer

from training_run import logs, run_train_process
from worker_helpers import training_options_of

LONG = " ".join(f"word{i}" for i in range(120))  # far past 64 tokens once tokenised
USER, ANSWER = {"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Paris."}
# A template that refuses conversations whose roles do not alternate (Mistral's and others do)
STRICT = ("{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
          "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
          "{{ message['role'] + ': ' + message['content'] + '\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}")


class Events:
    def __init__(self):
        self.lines: list[tuple[str, str]] = []

    def log(self, message: str, level: str = "info") -> None:
        self.lines.append((level, message))


def pair(prompt: str) -> dict:
    return {"prompt": [{"role": "user", "content": prompt}], "chosen": [ANSWER],
            "rejected": [{"role": "assistant", "content": "Lyon."}]}


@pytest.fixture
def tokenizer(smollm2_dir):
    return load_tokenizer(str(smollm2_dir), training_options_of("dpo"))


def test_preference_rows_with_no_answer_within_max_seq_len_are_left_out_and_counted(tokenizer):
    options = training_options_of("dpo", {"hyperparameters": {"max_seq_len": 64}})
    events = Events()
    rows = [pair(LONG), pair("Capital of France?"), pair(LONG), pair("And of Italy?")]
    kept = rows_that_fit(rows, tokenizer, options, [MetricsCallback(events, 1)])
    assert kept == [rows[1], rows[3]]
    assert events.lines == [("warning", "2 of 4 rows were left out: none of their answer fits within max_seq_len "
                                        "(64 tokens)")]
    # the reward model scores whole sequences: a pair that does not fit whole is left out
    long_answer = {**pair("Capital of France?"), "chosen": [{"role": "assistant", "content": LONG}]}
    assert rows_that_fit([long_answer, rows[1]], tokenizer, options, [], whole=True) == [rows[1]]
    with pytest.raises(JobFailed, match=r"^No row has any of its answer within max_seq_len \(64 tokens\)"):
        rows_that_fit([pair(LONG)], tokenizer, options, [])


def test_packed_sft_leaves_out_rows_with_nothing_to_learn(smollm2_dir, tmp_path):
    # TRL packs without dropping them: they would train on nothing (a loss of 0, or nothing at all)
    from transformers import LlamaConfig, LlamaForCausalLM

    from lanner.worker.training.sft import build_trainer

    options = training_options_of("lora", {"hyperparameters": {"packing": True, "max_seq_len": 64,
                                                               "eval_fraction": 0, "before_after_eval": False}})
    tokenizer = load_tokenizer(str(smollm2_dir), options)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    rows = [{"prompt": [{"role": "user", "content": LONG}], "completion": [ANSWER]}] * 2 + \
        [{"prompt": [USER], "completion": [ANSWER]}] * 3
    events = Events()
    trainer = build_trainer(model, tokenizer, rows, options, str(tmp_path / "run"), [MetricsCallback(events, 1)])
    samples = [(labels, lengths) for labels, lengths in zip(trainer.train_dataset["labels"],
                                                            trainer.train_dataset["seq_lengths"])]
    assert sum(len(lengths) for _, lengths in samples) == 3
    for labels, lengths in samples:  # every packed sample has a label to learn
        start = 0
        for length in lengths:
            assert any(label != -100 for label in labels[start:start + length])
            start += length
    assert ("warning", "2 of 5 training rows were left out: none of their answer fits within max_seq_len "
                       "(64 tokens)") in events.lines
    assert not any("reach max_seq_len" in line for _, line in events.lines)  # the kept rows fit whole
    with pytest.raises(JobFailed, match=r"^No training row has any of its answer within max_seq_len \(64 tokens\)"):
        build_trainer(model, tokenizer, rows[:2], options, str(tmp_path / "run"), [])


def test_a_dpo_job_whose_prompts_all_overflow_fails_in_words(studio):
    # TRL's DPOTrainer dropped every row unsaid, then failed on "num_samples=0"
    rows = [{"prompt": LONG, "chosen": "Yes.", "rejected": "No."}] * 4
    job_id = studio.job(studio.dataset("pairs.jsonl", rows), {"hyperparameters": {"max_steps": 1}}, method="dpo")
    done = run_train_process(studio, job_id)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert studio.get_job(job_id).error == (
        "No row has any of its answer within max_seq_len (64 tokens) once the chat template is applied: raise "
        "max_seq_len or shorten the prompts (or set preference.max_prompt_len).")
    assert any(line.startswith("Dataset pairs.jsonl: preference, 4 usable of 4 rows") for line in logs(studio, job_id))


def test_rows_the_chat_template_refuses_are_left_out_with_its_reason(smollm2_dir):
    # one such row ended the whole job with the template's error, wherever it was in the file
    tokenizer = load_tokenizer(str(smollm2_dir), training_options_of("lora", {"chat_template": STRICT}))
    good = {"prompt": [USER], "completion": [ANSWER]}
    twice = {"prompt": [USER, USER], "completion": [ANSWER]}
    events = Events()
    assert rows_the_template_takes([good, twice, good, {"text": "Paris."}], tokenizer,
                                   [MetricsCallback(events, 1)]) == [good, good, {"text": "Paris."}]
    assert events.lines == [("warning", "1 of 4 rows were left out: the chat template refuses them (first: "
                                        "Conversation roles must alternate user/assistant/user/assistant/...)")]
    with pytest.raises(JobFailed, match=r"^The chat template refuses every row: Conversation roles must alternate"):
        rows_the_template_takes([twice], tokenizer, [])


def test_pretraining_splits_long_texts_into_rows_and_other_methods_count_the_cut_ones(smollm2_dir, tmp_path):
    # pretrain: every token of a text past max_seq_len is trained on, in rows of up to max_seq_len (it was cut
    # and lost); full fine-tuning on text rows still cuts them, and says so
    from transformers import LlamaConfig, LlamaForCausalLM

    from lanner.worker.training.sft import build_trainer

    texts = [{"text": LONG}, {"text": "Short text."}, {"text": LONG + " end"}]
    built = {}
    for method in ("pretrain", "full"):
        options = training_options_of(method, {"hyperparameters": {"max_seq_len": 64, "eval_fraction": 0,
                                                                    "before_after_eval": False}})
        tokenizer = load_tokenizer(str(smollm2_dir), options)
        model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
        events = Events()
        trainer = build_trainer(model, tokenizer, texts, options, str(tmp_path / method), [MetricsCallback(events, 1)])
        built[method] = trainer, events.lines
    whole = [tokenizer(row["text"])["input_ids"] + [tokenizer.eos_token_id] for row in texts]
    assert [len(ids) > 64 for ids in whole] == [True, False, True]

    trainer, lines = built["pretrain"]
    pieces = [ids[start:start + 64] for ids in whole for start in range(0, len(ids), 64) if len(ids) - start > 1]
    assert sorted(trainer.train_dataset["input_ids"]) == sorted(pieces)  # (not packed: a row a piece, shuffled)
    split = len(pieces) - 1  # (the short text's row is its own)
    assert ("info", f"2 of 3 training texts are longer than max_seq_len (64 tokens): split into {split} rows of up "
                    "to 64 tokens, every token trained on") in lines
    assert not any("reach max_seq_len" in line for _, line in lines)

    _, lines = built["full"]
    assert ("warning", "2 of 3 training rows reach max_seq_len (64 tokens): what is past it is not trained on") \
        in lines
