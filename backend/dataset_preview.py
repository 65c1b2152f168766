"""What a model learns from a dataset: rows rendered through the model's chat template with the
trained tokens marked, and token-length statistics. The rendering follows the training process:
chat rows split into prompt and completion, loss on the completion only; plain text trains on
every token; preference rows render the chosen and the rejected answer."""
from __future__ import annotations

import statistics
import threading
from functools import lru_cache
from typing import Any

from lanner.core import default_model, tool_turns
from lanner.core.model_paths import NOT_ALLOWED, allowed_model_folder
from lanner.core.settings import Settings

MAX_ROWS_MEASURED = 2000
IMPORT_RETRY_SECONDS = 15  # how soon to ask again while the built-in model is being imported


class TokenizerUnavailable(Exception):
    pass


class BuiltinImporting(TokenizerUnavailable):
    """The built-in model is being imported (by `lanner up`, `lanner api`, a job or the command): soon there."""


def tokenizer_dir(model: str, settings: Settings) -> str:
    """Where the model's tokenizer is on this machine; the hub is never asked."""
    if model == default_model.DEFAULT_MODEL_ID:
        if default_model.is_imported(settings.models_dir):
            return str(default_model.builtin_dir(settings.models_dir))
        started = default_model.import_started_at(settings.models_dir)
        if started is not None:
            raise BuiltinImporting(f"the built-in model is being imported (since {started:%H:%M:%S} UTC; it takes "
                                   "about a minute)")
        raise TokenizerUnavailable("the built-in model is not imported: `lanner up` imports it as it starts, or run "
                                   "`lanner import-default-model`")
    path = allowed_model_folder(model, settings)
    if path is None:
        raise TokenizerUnavailable(NOT_ALLOWED)
    try:
        if (path / "tokenizer.json").is_file():
            return str(path)
    except OSError:  # a name no file system takes (too long, …) names no tokenizer either
        pass
    raise TokenizerUnavailable(f"no tokenizer of {model} on this machine (a hub model is readable once it is "
                               "downloaded into DATA_DIR/models: POST /api/models/downloads)")


_loading = threading.Lock()


def load_tokenizer(folder: str):
    """The folder's tokenizer, loaded once. One load at a time: the dataset page asks for a preview and
    token statistics at once, and two first loads raced (each loading its own copy, and one failing
    in transformers' lazy imports, a 409 for that request)."""
    with _loading:
        return _load_tokenizer(folder)


@lru_cache(maxsize=4)
def _load_tokenizer(folder: str):
    # The fast tokenizer class straight from tokenizer.json: the same tokens as AutoTokenizer, but
    # without importing torch into the API process.
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(folder)


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


class _Refused(Exception):
    """The chat template leaves the row's tool turns out: a job leaves the row out."""


def _rendered(tokenizer, prompt: list[dict] | None, answer: list[dict] | None, text: str | None = None,
              tools: list[dict] | None = None):
    """(token ids, trained mask) of one sequence (tools: the functions a conversation's model may call)."""
    reason = tool_turns.left_out(tokenizer, (prompt or []) + (answer or []), tools) if text is None else None
    if reason is not None:
        raise _Refused(reason)
    if text is not None:
        ids = _ids(tokenizer, text + (tokenizer.eos_token or ""))
        return ids, [True] * len(ids)
    prompt_text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True, tools=tools)
    if not answer:
        ids = _ids(tokenizer, prompt_text)
        return ids, [False] * len(ids)
    full_text = tokenizer.apply_chat_template(prompt + answer, tokenize=False, tools=tools)
    ids = _ids(tokenizer, full_text)
    if not full_text.startswith(prompt_text):  # a template that rewrites earlier turns: mark it all
        return ids, [True] * len(ids)
    prompt_len = len(_ids(tokenizer, prompt_text))
    return ids, [index >= prompt_len for index in range(len(ids))]


def _sequences(row: dict[str, Any], task: str):
    """(label, prompt, answer, text) for each sequence a row trains."""
    if task == "text":
        yield "text", None, None, row["text"]
    elif task == "preference":
        yield "chosen", row["prompt"], row["chosen"], None
        yield "rejected", row["prompt"], row["rejected"], None
    elif task == "prompt":  # GRPO: the model writes the completions
        yield "prompt", row["prompt"], [], None
    else:  # sft and kto: a prompt and its completion
        yield "completion", row["prompt"], row["completion"], None


def _segments(tokenizer, ids: list[int], mask: list[bool]) -> list[dict]:
    segments: list[dict] = []
    start = 0
    for index in range(1, len(ids) + 1):
        if index == len(ids) or mask[index] != mask[start]:
            segments.append({"text": tokenizer.decode(ids[start:index]), "trained": mask[start]})
            start = index
    return segments


def preview(tokenizer, rows: list[tuple[int, dict]], task: str, max_seq_len: int) -> list[dict]:
    """Each (line, row)'s sequences rendered, named by the row's line in the file (a sequence the chat template
    refuses, as a training job's is left out, with the template's reason)."""
    from jinja2.exceptions import TemplateError

    shown = []
    for line, row in rows:
        for label, prompt, answer, text in _sequences(row, task):
            try:
                ids, mask = _rendered(tokenizer, prompt, answer, text, row.get("tools"))
            except (TemplateError, _Refused) as error:
                shown.append({"line": line, "sequence": label, "tokens": 0, "trained_tokens": 0, "truncated": False,
                              "segments": [], "refused": str(error)})
                continue
            kept, kept_mask = ids[:max_seq_len], mask[:max_seq_len]
            shown.append({"line": line, "sequence": label, "tokens": len(ids), "trained_tokens": sum(kept_mask),
                          "truncated": len(ids) > max_seq_len, "segments": _segments(tokenizer, kept, kept_mask)})
    return shown


def token_stats(tokenizer, rows: list[dict], task: str, max_seq_len: int) -> dict[str, Any]:
    from jinja2.exceptions import TemplateError

    measured = rows[:MAX_ROWS_MEASURED]
    lengths, trained, refused = [], 0, 0
    for row in measured:
        for _, prompt, answer, text in _sequences(row, task):
            try:
                ids, mask = _rendered(tokenizer, prompt, answer, text, row.get("tools"))
            except (TemplateError, _Refused):
                refused += 1
                continue
            lengths.append(len(ids))
            trained += sum(mask[:max_seq_len])
    if not lengths:
        return {"rows_measured": len(measured), "sequences": 0, "refused": refused}
    ordered = sorted(lengths)
    return {"rows_measured": len(measured), "rows_total": len(rows), "sequences": len(lengths),
            "min": ordered[0], "max": ordered[-1], "mean": round(statistics.fmean(ordered), 1),
            "p50": ordered[len(ordered) // 2], "p95": ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))],
            "total_tokens": sum(ordered), "trained_tokens": trained, "max_seq_len": max_seq_len,
            "over_max_seq_len": sum(length > max_seq_len for length in ordered), "refused": refused,
            "lengths": ordered}  # sorted, for the new-job page's length histogram
