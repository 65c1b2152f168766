"""Tokenizer -> GGUF metadata, from a Hugging Face tokenizer.json (byte-level BPE, the "gpt2"
tokenizer model in llama.cpp's terms: SmolLM, Llama 3, Qwen2/2.5/3, Mistral's Tekken).

llama.cpp chooses its pre-tokenizer (the regex that splits text before BPE) by the name in
`tokenizer.ggml.pre`. We derive it from the tokenizer's own pre-tokenizer regex, table-driven; an
unknown regex is refused rather than guessed, because a wrong one tokenizes differently. The
verification step compares llama.cpp's tokenization with Hugging Face's on the fixed prompts.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import gguf

from .files import ExportError

# Split regexes (as in tokenizer.json) -> llama.cpp pre-tokenizer names.
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPLIT_REGEX_PRE = {LLAMA3_REGEX: "llama-bpe", QWEN2_REGEX: "qwen2"}


@dataclass
class TokenizerMetadata:
    model: str
    pre: str
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    special_ids: dict[str, int]
    add_bos: bool
    add_eos: bool
    chat_template: str | None


def _token_text(value) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value


def pre_tokenizer_name(tokenizer: dict, tokenizer_config: dict) -> str:
    pre = tokenizer.get("pre_tokenizer") or {}
    if pre.get("type") == "ByteLevel" and pre.get("use_regex", True):
        # The GPT-2 regex inside ByteLevel. llama.cpp's "smollm" is that regex without
        # clean_up_tokenization_spaces at decode; "gpt-2" is the same regex with it.
        return "gpt-2" if tokenizer_config.get("clean_up_tokenization_spaces") else "smollm"
    if pre.get("type") == "Sequence":
        for step in pre.get("pretokenizers", []):
            if step.get("type") == "Split":
                regex = (step.get("pattern") or {}).get("Regex")
                if regex in SPLIT_REGEX_PRE:
                    return SPLIT_REGEX_PRE[regex]
                raise ExportError(f"Unknown pre-tokenizer regex {regex!r}: add it to gguf_tokenizer.SPLIT_REGEX_PRE.")
    raise ExportError(f"Unsupported pre-tokenizer {pre.get('type')!r} for GGUF export.")


def read_chat_template(model_dir: Path, tokenizer_config: dict) -> str | None:
    jinja = Path(model_dir) / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    template = tokenizer_config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template}
        return named.get("default") or next(iter(named.values()), None)
    return template


def read_tokenizer(model_dir: Path, vocab_size: int) -> TokenizerMetadata:
    model_dir = Path(model_dir)
    tok_file = model_dir / "tokenizer.json"
    if not tok_file.is_file():
        raise ExportError("GGUF export needs a tokenizer.json (fast tokenizer) beside the model.")
    tokenizer = json.loads(tok_file.read_text())
    config_file = model_dir / "tokenizer_config.json"
    tokenizer_config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    bpe = tokenizer["model"]
    if bpe.get("type") != "BPE" or bpe.get("byte_fallback"):
        raise ExportError("Only byte-level BPE tokenizers are supported by the GGUF export so far "
                          "(SentencePiece tokenizers such as Gemma's or Llama 2's are not).")
    pre = pre_tokenizer_name(tokenizer, tokenizer_config)

    by_id: dict[int, str] = {i: t for t, i in bpe["vocab"].items()}
    types: dict[int, int] = {i: gguf.TokenType.NORMAL for i in by_id}
    for added in tokenizer.get("added_tokens", []):
        by_id[added["id"]] = added["content"]
        types[added["id"]] = gguf.TokenType.CONTROL if added.get("special") else gguf.TokenType.USER_DEFINED
    size = max(vocab_size, max(by_id) + 1)
    tokens, token_types = [], []
    for i in range(size):
        if i in by_id:
            tokens.append(by_id[i])
            token_types.append(int(types[i]))
        else:  # the embedding has more rows than the tokenizer has tokens
            tokens.append(f"[PAD{i}]")
            token_types.append(int(gguf.TokenType.UNUSED))
    merges = [m if isinstance(m, str) else " ".join(m) for m in bpe.get("merges", [])]

    token_to_id = {t: i for i, t in by_id.items()}
    special_ids = {}
    for kind in ("bos", "eos", "unk", "pad"):
        text = _token_text(tokenizer_config.get(f"{kind}_token"))
        if text is not None and text in token_to_id:
            special_ids[kind] = token_to_id[text]

    add_bos = add_eos = False
    post = tokenizer.get("post_processor") or {}
    processors = post.get("processors", [post]) if post.get("type") == "Sequence" else [post]
    for proc in processors:
        if proc.get("type") == "TemplateProcessing":
            single = proc.get("single", [])
            add_bos = bool(single) and "SpecialToken" in single[0]
            add_eos = bool(single) and "SpecialToken" in single[-1]
    add_bos = bool(tokenizer_config.get("add_bos_token", add_bos))
    add_eos = bool(tokenizer_config.get("add_eos_token", add_eos))
    return TokenizerMetadata(model="gpt2", pre=pre, tokens=tokens, token_types=token_types, merges=merges,
                             special_ids=special_ids, add_bos=add_bos, add_eos=add_eos,
                             chat_template=read_chat_template(model_dir, tokenizer_config))


def write_tokenizer(writer: gguf.GGUFWriter, meta: TokenizerMetadata) -> None:
    writer.add_tokenizer_model(meta.model)
    writer.add_tokenizer_pre(meta.pre)
    writer.add_token_list(meta.tokens)
    writer.add_token_types(meta.token_types)
    writer.add_token_merges(meta.merges)
    adders = {"bos": writer.add_bos_token_id, "eos": writer.add_eos_token_id,
              "unk": writer.add_unk_token_id, "pad": writer.add_pad_token_id}
    for kind, token_id in meta.special_ids.items():
        adders[kind](token_id)
    writer.add_add_bos_token(meta.add_bos)
    writer.add_add_eos_token(meta.add_eos)
    if meta.chat_template:
        writer.add_chat_template(meta.chat_template)
