"""Byte-level BPE behind the case-splitting regexes in the GGUF: OpenAI's o200k (gpt-oss; llama.cpp's "gpt-4o"
pre-tokenizer) and Mistral's Tekken (Mistral NeMo, Small 3; "tekken"). A byte-level BPE is trained here behind each
regex, saved as a Hugging Face tokenizer, converted with a tiny model of a family that ships it; llama.cpp must
tokenize every test string as transformers does. The strings are ones where these splits differ from Llama 3's
(CamelCase words, upper-case runs, contractions, digits, "/" after punctuation)."""
from __future__ import annotations

import pytest
from export_helpers import tiny_model

TEXTS = (
    "Hello world, the falcon hunts.",
    "CamelCaseWords and HTTPServerError in JSONData",
    "They'RE here, isn't it? DON'T stop; we'll see",
    "path/to/file.txt, a/b/c and x+=1;/* note */",
    "Numbers 1234567 and 3.14159, year 2026.",
    "Café crème brûlée, naïve façade — déjà vu!",
    "spaces   between    words\ttabs\nnew lines\n\nend  ",
    "def add(a, b):\n    return a + b",
)


def byte_level_tokenizer(regex: str, out_dir):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|startoftext|>", "<|endoftext|>"], show_progress=False)
    tokenizer.train_from_iterator([text * 3 for text in TEXTS] * 20, trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<|startoftext|>",
                                      eos_token="<|endoftext|>")
    wrapped.save_pretrained(out_dir)
    return wrapped


@pytest.mark.parametrize("regex_name, pre, kind", [("GPT4O_REGEX", "gpt-4o", "gpt_oss"),
                                                   ("TEKKEN_REGEX", "tekken", "mistral")])
def test_llama_cpp_tokenizes_a_case_splitting_tokenizer_like_hugging_face(regex_name, pre, kind, smollm2_dir, tmp_path):
    from llama_cpp import Llama
    from tokenizers import Regex, pre_tokenizers

    from lanner.worker.export import convert_to_gguf, gguf_tokenizer

    regex = getattr(gguf_tokenizer, regex_name)
    tokenizer = byte_level_tokenizer(regex, tmp_path / "tokenizer")
    model_dir = tiny_model(kind, smollm2_dir, tmp_path / "model", tokenizer_dir=tmp_path / "tokenizer",
                           vocab_size=len(tokenizer))
    info = convert_to_gguf(model_dir, tmp_path / "model.gguf", out_type="f16")
    assert (info["tokenizer"], info["tokenizer_pre"]) == ("gpt2", pre)
    llm = Llama(model_path=str(tmp_path / "model.gguf"), vocab_only=True, verbose=False)
    try:
        for text in TEXTS:
            expected = tokenizer(text, add_special_tokens=False)["input_ids"]
            assert llm.tokenize(text.encode(), add_bos=False, special=False) == expected, \
                (text, tokenizer.convert_ids_to_tokens(expected))
    finally:
        llm.close()
    # The strings do tell the regexes apart: split as Llama 3 would, CamelCase stays one piece.
    split = {r: [piece for piece, _ in pre_tokenizers.Split(Regex(r), behavior="isolated").pre_tokenize_str(TEXTS[1])]
             for r in (gguf_tokenizer.LLAMA3_REGEX, regex)}
    assert "CamelCaseWords" in split[gguf_tokenizer.LLAMA3_REGEX] and "Camel" in split[regex]
