"""SentencePiece tokenizers in the GGUF (llama.cpp's "llama" tokenizer model): Llama 2, Mistral
v0.1-0.3 and Gemma. A real SentencePiece BPE model is trained here on a few hundred lines with the
families' own settings (byte fallback, split digits, no normalisation; a dummy prefix for Llama and
Mistral, none for Gemma), wrapped as the Hugging Face tokenizer each family uses, converted with a
tiny model of that family. llama.cpp must then tokenize every test string (ASCII, accents, digits,
whitespace runs, byte fallback) exactly as SentencePiece and as Hugging Face do (leading whitespace
aside: docs/export.md), add BOS as Hugging Face does, and carry the chat template and special tokens."""
from __future__ import annotations

import json
import random

import pytest
from export_helpers import tiny_model

WORDS = ("the falcon hunts over open country and small birds rise from the grass while wind moves "
         "café crème brûlée naïve façade über straße señor jalapeño déjà vu résumé coöperate "
         "hello world tokenizer export model weights python function return value").split()

TEXTS = (
    "Hello world, the falcon hunts.",
    "Café crème brûlée, naïve façade — déjà vu!",
    "Numbers 1234567 and 3.14159, year 2026.",
    "spaces   between    words",
    "  leading and trailing  ",
    "tabs\tand\nnew lines\n\nend",
    "unseen: 🦅 ñandú 日本語 ǅ",  # characters the model never saw: byte fallback
    "def add(a, b):\n    return a + b",
)

LLAMA2_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
                   "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% else %}{{ ' ' + message['content'] + eos_token }}"
                   "{% endif %}{% endfor %}")
GEMMA_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{{ '<start_of_turn>' + ('model' if message['role'] == "
                  "'assistant' else message['role']) + '\n' + message['content'] + '<end_of_turn>\n' }}{% endfor %}"
                  "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")


def corpus() -> list[str]:
    rng = random.Random(0)
    lines = []
    for i in range(400):
        line = " ".join(rng.sample(WORDS, 8))
        lines.append(f"{line} {i * 37} {i % 7}.{i % 13}" if i % 3 else line.capitalize() + ".")
    lines += ["    indented code(x) = x + 1", "a  b   c    d", "tabs\tare here"] * 5
    return lines


def train_sentencepiece(path, *, gemma: bool) -> None:
    import sentencepiece as spm

    if gemma:  # Gemma's ids and piece names, its turn markers as user-defined pieces
        ids = dict(pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>",
                   user_defined_symbols=["<start_of_turn>", "<end_of_turn>"])
    else:
        ids = dict(unk_id=0, bos_id=1, eos_id=2, pad_id=-1)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus()), model_prefix=str(path.with_suffix("")), model_type="bpe",
        vocab_size=600, character_coverage=1.0, byte_fallback=True, split_digits=True,
        normalization_rule_name="identity", remove_extra_whitespaces=False, add_dummy_prefix=not gemma,
        allow_whitespace_only_pieces=True, num_threads=1, minloglevel=2, **ids)


TOKENIZER_CONFIGS = {  # tokenizer_config.json as each family's checkpoints ship it
    "llama": {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
              "pad_token": None, "add_bos_token": True, "add_eos_token": False, "legacy": True,
              "chat_template": LLAMA2_TEMPLATE},
    "mistral": {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                "pad_token": None, "add_bos_token": True, "add_eos_token": False, "legacy": False,
                "chat_template": LLAMA2_TEMPLATE},
    "gemma": {"tokenizer_class": "GemmaTokenizer", "bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>",
              "pad_token": "<pad>", "add_bos_token": True, "add_eos_token": False,
              "additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"], "chat_template": GEMMA_TEMPLATE},
}


def hf_tokenizer(family: str, tmp_path):
    """The family's Hugging Face tokenizer, loaded the way a checkpoint's is (tokenizer.model +
    tokenizer_config.json, converted by transformers) and saved as a checkpoint's (+ tokenizer.json)."""
    import transformers

    source = tmp_path / "sp"
    source.mkdir()
    train_sentencepiece(source / "tokenizer.model", gemma=family == "gemma")
    (source / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIGS[family]))
    tokenizer = transformers.AutoTokenizer.from_pretrained(source)
    out = tmp_path / "tokenizer"
    tokenizer.save_pretrained(out)
    (out / "tokenizer.model").write_bytes((source / "tokenizer.model").read_bytes())
    return transformers.AutoTokenizer.from_pretrained(out), out


@pytest.mark.parametrize("family, arch, keep_sp_model", [
    ("llama", "llama", True),
    ("mistral", "mistral", True),
    ("gemma", "gemma", True),
    ("llama", "llama", False),  # only tokenizer.json: scores from the merge ranks
])
def test_llama_cpp_tokenizes_like_hugging_face(family, arch, keep_sp_model, smollm2_dir, tmp_path):
    from llama_cpp import Llama
    from sentencepiece import SentencePieceProcessor

    from lanner.worker.export import convert_to_gguf

    tokenizer, tokenizer_dir = hf_tokenizer(family, tmp_path)
    if not keep_sp_model:
        (tokenizer_dir / "tokenizer.model").unlink()
    model_dir = tiny_model(arch, smollm2_dir, tmp_path / "model", tokenizer_dir=tokenizer_dir,
                           vocab_size=len(tokenizer))
    info = convert_to_gguf(model_dir, tmp_path / "model.gguf", out_type="f16")
    assert info["tokenizer"] == "llama"
    assert info["tokenizer_scores_from"] == ("tokenizer.model" if keep_sp_model else "merges")

    sentencepiece = SentencePieceProcessor(model_file=str(tmp_path / "sp" / "tokenizer.model"))
    llm = Llama(model_path=str(tmp_path / "model.gguf"), vocab_only=True, verbose=False)
    try:
        for text in TEXTS:
            got = llm.tokenize(text.encode(), add_bos=False, special=False)
            # llama.cpp tokenizes as SentencePiece itself does, always.
            assert got == sentencepiece.encode(text), text
            if text[0].isspace() and family != "gemma":
                # Known difference: transformers' Metaspace conversion puts no dummy prefix before
                # text that already starts with a space; SentencePiece and llama.cpp do.
                continue
            expected = tokenizer(text, add_special_tokens=False)["input_ids"]
            assert got == expected, (text, tokenizer.convert_ids_to_tokens(expected))
            assert llm.tokenize(text.encode(), add_bos=True, special=False) == tokenizer(text)["input_ids"], text
        metadata = llm.metadata
    finally:
        llm.close()
    byte_pieces = tokenizer.convert_ids_to_tokens(tokenizer(TEXTS[6], add_special_tokens=False)["input_ids"])
    assert any(piece.startswith("<0x") for piece in byte_pieces)  # byte fallback was exercised

    assert metadata["tokenizer.ggml.model"] == "llama"
    assert metadata["tokenizer.chat_template"] == tokenizer.chat_template
    assert json.loads(metadata["tokenizer.ggml.add_space_prefix"]) is (family != "gemma")
    for kind, key in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding")):
        key = f"tokenizer.ggml.{key}_token_id"
        assert (int(metadata[key]) if key in metadata else None) == getattr(tokenizer, f"{kind}_token_id"), kind
