"""Small pure checks: the Ollama Modelfile for non-ChatML templates, the tokenizer pre-type table."""
from __future__ import annotations

import pytest


def test_modelfile_without_chatml_leaves_the_template_to_the_gguf():
    from lanner.worker.export.modelfile import modelfile_text

    llama3 = "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>...{% endfor %}"
    text = modelfile_text("m-q4_k_m.gguf", llama3, ["<|eot_id|>"])
    assert text.startswith("FROM ./m-q4_k_m.gguf\n")
    assert "TEMPLATE" not in text and 'PARAMETER stop "<|eot_id|>"' in text


def test_modelfile_for_gemma_stops_at_the_end_of_a_turn():
    from lanner.worker.export.modelfile import modelfile_text

    gemma = "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
    text = modelfile_text("gemma-q8_0.gguf", gemma, ["<eos>"])
    assert 'PARAMETER stop "<end_of_turn>"' in text and 'PARAMETER stop "<eos>"' in text


@pytest.mark.parametrize("pre_tokenizer, config, expected", [
    ({"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}, {}, "smollm"),
    ({"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}, {"clean_up_tokenization_spaces": True}, "gpt-2"),
    ({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "LLAMA3"}},
                                            {"type": "ByteLevel", "use_regex": False}]}, {}, "llama-bpe"),
    ({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "QWEN2"}},
                                            {"type": "ByteLevel", "use_regex": False}]}, {}, "qwen2"),
])
def test_pre_tokenizer_names(pre_tokenizer, config, expected):
    from lanner.worker.export import gguf_tokenizer

    for step in pre_tokenizer.get("pretokenizers", []):
        if step["type"] == "Split":
            step["pattern"]["Regex"] = {"LLAMA3": gguf_tokenizer.LLAMA3_REGEX,
                                        "QWEN2": gguf_tokenizer.QWEN2_REGEX}[step["pattern"]["Regex"]]
    assert gguf_tokenizer.pre_tokenizer_name({"pre_tokenizer": pre_tokenizer}, config) == expected


def test_unknown_pre_tokenizer_regex_is_refused_not_guessed():
    from lanner.worker.export import ExportError, gguf_tokenizer

    pre = {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": r"\w+"}}]}
    with pytest.raises(ExportError, match="Unknown pre-tokenizer regex"):
        gguf_tokenizer.pre_tokenizer_name({"pre_tokenizer": pre}, {})
