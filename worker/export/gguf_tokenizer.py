"""Tokenizer -> GGUF metadata, from a Hugging Face tokenizer.json, in one of llama.cpp's two forms:

- byte-level BPE ("gpt2" in llama.cpp's terms: SmolLM, Llama 3, Qwen2/2.5/3, gpt-oss's o200k, Mistral's Tekken).
  llama.cpp chooses its pre-tokenizer (the regex that splits text before BPE) by the name in
  `tokenizer.ggml.pre`. We derive it from the tokenizer's own pre-tokenizer regex, table-driven; an
  unknown regex is refused rather than guessed, because a wrong one tokenizes differently.
- SentencePiece BPE with byte fallback ("llama": Llama 2, Mistral v0.1-0.3, Gemma 1/2/3). llama.cpp
  merges the adjacent pair whose joined piece has the highest score, so the scores are written: read
  from tokenizer.model with the sentencepiece library when it is there (what llama.cpp's own
  converter does), else derived from tokenizer.json's merge ranks (the earlier the merge, the
  higher the score). Whether a space is put before the text ("add_space_prefix": Llama/Mistral yes,
  Gemma no) is read from how the Hugging Face tokenizer does it (a Prepend normalizer or Metaspace).

The verification step compares llama.cpp's tokenization with Hugging Face's on the fixed prompts.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import gguf

from .files import ExportError

# Split regexes (as in tokenizer.json) -> llama.cpp pre-tokenizer names.
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# OpenAI's o200k (GPT-4o; gpt-oss's o200k_harmony): upper-case runs split from the lower-case words they start,
# contractions kept on their word, "/" and line breaks kept after punctuation.
GPT4O_REGEX = "|".join((
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}", r" ?[^\s\p{L}\p{N}]+[\r\n/]*", r"\s*[\r\n]+", r"\s+(?!\S)", r"\s+"))
# Mistral's Tekken (Mistral NeMo, Mistral Small 3): o200k's cases without the contractions, one digit a piece.
TEKKEN_REGEX = "|".join((
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*",
    r"\p{N}", r" ?[^\s\p{L}\p{N}]+[\r\n/]*", r"\s*[\r\n]+", r"\s+(?!\S)", r"\s+"))
SPLIT_REGEX_PRE = {LLAMA3_REGEX: "llama-bpe", QWEN2_REGEX: "qwen2", GPT4O_REGEX: "gpt-4o", TEKKEN_REGEX: "tekken"}


@dataclass
class TokenizerMetadata:
    model: str                   # "gpt2" (byte-level BPE) or "llama" (SentencePiece)
    pre: str                     # llama.cpp pre-tokenizer name ("default" for SentencePiece)
    tokens: list[str]
    token_types: list[int]
    merges: list[str]            # byte-level BPE only
    special_ids: dict[str, int]
    add_bos: bool
    add_eos: bool
    chat_template: str | None
    scores: list[float] | None = None      # SentencePiece only
    add_space_prefix: bool | None = None   # SentencePiece only
    scores_from: str | None = None         # "tokenizer.model" or "merges"


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
    model = tokenizer["model"]
    if model.get("type") != "BPE":
        raise ExportError(f"{model.get('type')} tokenizers are not supported by the GGUF export "
                          "(byte-level BPE and SentencePiece BPE are).")
    if model.get("byte_fallback"):
        kind, pre = "llama", "default"
        by_id, types, scores, scores_from = _sentencepiece_vocab(model_dir, model)
        merges: list[str] = []
    else:
        kind, pre = "gpt2", pre_tokenizer_name(tokenizer, tokenizer_config)
        by_id = {i: t for t, i in model["vocab"].items()}
        types = {i: int(gguf.TokenType.NORMAL) for i in by_id}
        scores, scores_from = None, None
        merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    for added in tokenizer.get("added_tokens", []):
        by_id[added["id"]] = added["content"]
        types[added["id"]] = int(gguf.TokenType.CONTROL if added.get("special") else gguf.TokenType.USER_DEFINED)

    size = max(vocab_size, max(by_id) + 1)
    tokens, token_types, token_scores = [], [], []
    for i in range(size):
        if i in by_id:
            tokens.append(by_id[i])
            token_types.append(types[i])
            token_scores.append(scores.get(i, 0.0) if scores is not None else 0.0)
        else:  # the embedding has more rows than the tokenizer has tokens
            tokens.append(f"[PAD{i}]")
            token_types.append(int(gguf.TokenType.UNUSED))
            token_scores.append(-1000.0)

    token_to_id = {t: i for i, t in by_id.items()}
    special_ids = {}
    for kind_name in ("bos", "eos", "unk", "pad"):
        text = _token_text(tokenizer_config.get(f"{kind_name}_token"))
        if text is not None and text in token_to_id:
            special_ids[kind_name] = token_to_id[text]
    if kind == "llama" and "unk" not in special_ids and model.get("unk_token") in token_to_id:
        special_ids["unk"] = token_to_id[model["unk_token"]]

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
    return TokenizerMetadata(model=kind, pre=pre, tokens=tokens, token_types=token_types, merges=merges,
                             special_ids=special_ids, add_bos=add_bos, add_eos=add_eos,
                             chat_template=read_chat_template(model_dir, tokenizer_config),
                             scores=token_scores if kind == "llama" else None,
                             add_space_prefix=_adds_space_prefix(tokenizer) if kind == "llama" else None,
                             scores_from=scores_from)


_BYTE_PIECE = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")


def _sentencepiece_vocab(model_dir: Path, model: dict) -> tuple[dict[int, str], dict[int, int], dict[int, float], str]:
    """Pieces, token types and scores of a SentencePiece BPE vocabulary (ids as in tokenizer.json)."""
    by_id = {i: t for t, i in model["vocab"].items()}
    sp_file = model_dir / "tokenizer.model"
    if sp_file.is_file():
        import sentencepiece

        sp = sentencepiece.SentencePieceProcessor(model_file=str(sp_file))
        pieces = {i: sp.id_to_piece(i) for i in range(sp.get_piece_size())}
        differ = [i for i, piece in pieces.items() if by_id.get(i, piece) != piece]
        if differ:
            raise ExportError(f"tokenizer.model and tokenizer.json disagree on token {differ[0]} "
                              f"({pieces[differ[0]]!r} vs {by_id[differ[0]]!r}); the export cannot tell which is used.")
        types, scores = {}, {}
        for i in pieces:
            if sp.is_unknown(i):
                kind = gguf.TokenType.UNKNOWN
            elif sp.is_control(i):
                kind = gguf.TokenType.CONTROL
            elif sp.is_unused(i):
                kind = gguf.TokenType.UNUSED
            elif sp.is_byte(i):
                kind = gguf.TokenType.BYTE
            else:
                kind = gguf.TokenType.NORMAL
            types[i], scores[i] = int(kind), float(sp.get_score(i))
        for i, piece in by_id.items():  # pieces tokenizer.json has beyond tokenizer.model
            if i not in pieces:
                types[i], scores[i] = int(gguf.TokenType.NORMAL), 0.0
        by_id.update(pieces)
        return by_id, types, scores, "tokenizer.model"

    # No tokenizer.model: the earlier a piece's first merge, the higher its score (llama.cpp merges
    # the best-scored pair first, Hugging Face the lowest-ranked merge: the same order).
    first_merge: dict[str, int] = {}
    for rank, merge in enumerate(model.get("merges", [])):
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        first_merge.setdefault(left + right, rank)
    unk = model.get("unk_token")
    types, scores = {}, {}
    for i, piece in by_id.items():
        if _BYTE_PIECE.match(piece):
            types[i] = int(gguf.TokenType.BYTE)
        elif piece == unk:
            types[i] = int(gguf.TokenType.UNKNOWN)
        else:
            types[i] = int(gguf.TokenType.NORMAL)
        scores[i] = -float(first_merge[piece]) if piece in first_merge else -1e9
    return by_id, types, scores, "merges"


def _adds_space_prefix(tokenizer: dict) -> bool:
    """Does the Hugging Face tokenizer put "▁" before the text (SentencePiece's add_dummy_prefix)?
    Legacy conversions do it with a Prepend normalizer, newer ones with Metaspace's prepend_scheme."""
    def steps(part: dict | None, key: str) -> list[dict]:
        part = part or {}
        return part.get(key, []) if part.get("type") == "Sequence" else [part]

    for step in steps(tokenizer.get("normalizer"), "normalizers"):
        if step.get("type") == "Prepend" and step.get("prepend") == "\u2581":
            return True
    for step in steps(tokenizer.get("pre_tokenizer"), "pretokenizers"):
        if step.get("type") == "Metaspace":
            return step.get("prepend_scheme", "always" if step.get("add_prefix_space", True) else "never") != "never"
    return False


def write_tokenizer(writer: gguf.GGUFWriter, meta: TokenizerMetadata) -> None:
    writer.add_tokenizer_model(meta.model)
    writer.add_tokenizer_pre(meta.pre)
    writer.add_token_list(meta.tokens)
    writer.add_token_types(meta.token_types)
    if meta.scores is not None:
        writer.add_token_scores(meta.scores)
    if meta.merges:
        writer.add_token_merges(meta.merges)
    if meta.add_space_prefix is not None:
        writer.add_add_space_prefix(meta.add_space_prefix)
    adders = {"bos": writer.add_bos_token_id, "eos": writer.add_eos_token_id,
              "unk": writer.add_unk_token_id, "pad": writer.add_pad_token_id}
    for kind, token_id in meta.special_ids.items():
        adders[kind](token_id)
    writer.add_add_bos_token(meta.add_bos)
    writer.add_add_eos_token(meta.add_eos)
    if meta.chat_template:
        writer.add_chat_template(meta.chat_template)
