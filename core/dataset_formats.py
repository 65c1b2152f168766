"""Dataset files in, one canonical row shape out.

Reads jsonl, json, csv and parquet; detects the format from the rows' fields; checks every row and
reports the ones that cannot be used with their line number and the reason. The API calls
`inspect_dataset` on upload; the training process calls `load_rows`.

Detected formats and what they become (the canonical shapes TRL's trainers take):
- alpaca (instruction, input?, output, system?)      -> sft: {"prompt": [messages], "completion": [assistant]}
- sharegpt (conversations: [{from, value}])          -> sft
- messages (OpenAI style: [{role, content}])          -> sft
- prompt_completion (prompt, completion)             -> sft
- text (text)                                        -> text: {"text": str}
- preference (prompt, chosen, rejected)              -> preference: {"prompt": [...], "chosen": [...], "rejected": [...]}
- kto (prompt, completion, label)                    -> kto: {"prompt": [...], "completion": [...], "label": bool}

Conversations become prompt/completion pairs split before the last assistant turn, so that "loss
on the completion only" is TRL's plain prompt-completion masking and needs no generation tags in
the chat template (earlier assistant turns are context, not targets).

"line" in a bad-row report is the line in the file for jsonl, csv and json, and the row number
(1-based) for parquet.
"""
from __future__ import annotations

import codecs
import csv
import io
import json
from pathlib import Path
from typing import Any

from lanner.core import strict_json

BAD_ROWS_REPORTED = 100
ROLES = ("system", "user", "assistant")
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant",
                  "assistant": "assistant", "bot": "assistant", "model": "assistant"}
EXTENSIONS = (".jsonl", ".json", ".csv", ".parquet")

# format -> (task, fields that identify it). Checked in this order: the most specific first.
FORMATS: dict[str, tuple[str, frozenset[str]]] = {
    "preference": ("preference", frozenset({"prompt", "chosen", "rejected"})),
    "kto": ("kto", frozenset({"prompt", "completion", "label"})),
    "messages": ("sft", frozenset({"messages"})),
    "sharegpt": ("sft", frozenset({"conversations"})),
    "alpaca": ("sft", frozenset({"instruction", "output"})),
    "prompt_completion": ("sft", frozenset({"prompt", "completion"})),
    "text": ("text", frozenset({"text"})),
}


class DatasetError(ValueError):
    """The file cannot be used for training; `report` holds what inspection found (may be None)."""

    def __init__(self, message: str, report: dict | None = None):
        super().__init__(message)
        self.report = report


class BadRow(ValueError):
    pass


# ---------------------------------------------------------------------------------------- reading

def _decode(raw: bytes, path: Path) -> str:
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return raw.decode("utf-16")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = raw[:error.start].count(b"\n") + 1
        raise DatasetError(f"{path.name} is not UTF-8 text: byte 0x{raw[error.start]:02x} on line {line} "
                           f"cannot be decoded. Save the file as UTF-8.") from None


def _read_jsonl(path: Path) -> tuple[list[tuple[int, Any]], list[dict]]:
    """(line, parsed value) for each non-blank line, plus the lines that are not JSON or not UTF-8.
    Lines are decoded one by one so that one badly encoded line costs one row, not the file."""
    raw = path.read_bytes()
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raw = raw.decode("utf-16").encode("utf-8")
    raw = raw.removeprefix(codecs.BOM_UTF8)
    records, bad = [], []
    for number, line_bytes in enumerate(raw.split(b"\n"), start=1):
        try:
            line = line_bytes.decode("utf-8").strip()
        except UnicodeDecodeError as error:
            bad.append({"line": number, "reason": f"not UTF-8 text (byte 0x{line_bytes[error.start]:02x} "
                                                  f"at column {error.start + 1})"})
            continue
        if not line:
            continue
        try:
            records.append((number, strict_json.loads(line)))
        except json.JSONDecodeError as error:
            bad.append({"line": number, "reason": f"malformed JSON: {error.msg} at column {error.colno}"})
        except strict_json.UnstorableJson as error:
            bad.append({"line": number, "reason": str(error)})
    return records, bad


def _read_json(path: Path) -> tuple[list[tuple[int, Any]], list[dict]]:
    text = _decode(path.read_bytes(), path)
    if not text.strip():
        return [], []
    try:
        value = strict_json.loads(text)
    except json.JSONDecodeError as error:
        raise DatasetError(f"{path.name} is not valid JSON: {error.msg} on line {error.lineno}, "
                           f"column {error.colno}.") from None
    except strict_json.UnstorableJson as error:
        raise DatasetError(f"{path.name}: {error}") from None
    if isinstance(value, dict):
        lists = [key for key, item in value.items() if isinstance(item, list)]
        if len(lists) != 1:
            raise DatasetError(f"{path.name} holds a JSON object; expected a list of rows "
                               f"(or an object with exactly one list of rows).")
        key_at = text.find(json.dumps(lists[0]))
        return _with_lines(text, value[lists[0]], max(key_at, 0)), []
    if not isinstance(value, list):
        raise DatasetError(f"{path.name} holds a JSON {type(value).__name__}; expected a list of rows.")
    return _with_lines(text, value, 0), []


def _with_lines(text: str, items: list, search_from: int) -> list[tuple[int, Any]]:
    """The line each element of the top-level list starts on, found by decoding it in place."""
    decoder = json.JSONDecoder()
    start = text.find("[", search_from)
    position, result = start + 1, []
    for item in items:
        while text[position] in " \t\r\n,":
            position += 1
        _, end = decoder.raw_decode(text, position)
        result.append((text.count("\n", 0, position) + 1, item))
        position = end
    return result


def _read_csv(path: Path) -> tuple[list[tuple[int, Any]], list[dict]]:
    text = _decode(path.read_bytes(), path)
    reader = csv.DictReader(io.StringIO(text, newline=""))
    records, bad = [], []
    try:
        for row in reader:
            if None in row:
                bad.append({"line": reader.line_num, "reason": f"{len(row[None])} more cell(s) than the header has"})
                continue
            if all(value in (None, "") for value in row.values()):
                continue
            records.append((reader.line_num, {key: _cell(value) for key, value in row.items() if value is not None}))
    except csv.Error as error:
        raise DatasetError(f"{path.name} is not valid CSV: {error} (line {reader.line_num}).") from None
    return records, bad


def _cell(value: str) -> Any:
    """CSV cells are strings; a cell holding a JSON list or object (a conversation) is parsed."""
    stripped = value.strip()
    if stripped[:1] in ("[", "{"):
        try:
            return strict_json.loads(stripped)
        except ValueError:  # not JSON, or JSON that cannot be kept: the cell stays text
            pass
    return value


def _read_parquet(path: Path) -> tuple[list[tuple[int, Any]], list[dict]]:
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as error:  # pyarrow raises several types for a damaged file
        # pyarrow's message names the file by its path on the server: only the reason is shown
        reason = str(error).replace(str(path), path.name).replace(str(path.parent), "")
        raise DatasetError(f"{path.name} is not a readable Parquet file: {reason}") from None
    return list(enumerate(rows, start=1)), []


READERS = {".jsonl": _read_jsonl, ".json": _read_json, ".csv": _read_csv, ".parquet": _read_parquet}


def _read(path: Path) -> tuple[list[tuple[int, Any]], list[dict]]:
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in READERS:
        raise DatasetError(f"{path.name}: unsupported file type {suffix or '(none)'}; use {', '.join(EXTENSIONS)}.")
    if not path.is_file():
        raise DatasetError(f"{path} does not exist.")
    return READERS[suffix](path)


# --------------------------------------------------------------------------------------- detecting

def _detect(records: list[tuple[int, Any]]) -> str | None:
    """The format whose identifying fields most rows carry (ties go to the more specific format)."""
    counts = {name: 0 for name in FORMATS}
    for _, row in records[:1000]:
        if not isinstance(row, dict):
            continue
        keys = {key for key, value in row.items() if value is not None}
        for name, (_, fields) in FORMATS.items():
            if fields <= keys:
                counts[name] += 1
                break
    best = max(FORMATS, key=lambda name: counts[name])
    return best if counts[best] else None


# ---------------------------------------------------------------------------------- normalising

def _text(row: dict, field: str, required: bool = True) -> str:
    value = row.get(field)
    if value is None or value == "":
        if required:
            raise BadRow(f"missing or empty '{field}'")
        return ""
    if not isinstance(value, str):
        raise BadRow(f"'{field}' is a {type(value).__name__}, not text")
    if required and not value.strip():
        raise BadRow(f"'{field}' is blank")
    return value


def _messages(value: Any, field: str, role_key: str = "role", content_key: str = "content",
              roles: dict[str, str] | None = None) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise BadRow(f"'{field}' is not a non-empty list of messages")
    messages = []
    for index, message in enumerate(value):
        if not isinstance(message, dict):
            raise BadRow(f"{field}[{index}] is not an object")
        role, content = message.get(role_key), message.get(content_key)
        role = (roles or {r: r for r in ROLES}).get(role) if isinstance(role, str) else None
        if role is None:
            raise BadRow(f"{field}[{index}] has role {message.get(role_key)!r}; expected one of "
                         f"{', '.join(sorted(roles or ROLES))}")
        if not isinstance(content, str):
            raise BadRow(f"{field}[{index}] has no text '{content_key}'")
        messages.append({"role": role, "content": content})
    return messages


def _split_conversation(messages: list[dict], field: str) -> dict:
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
    if last is None:
        raise BadRow(f"'{field}' has no assistant message to learn from")
    if last == 0:
        raise BadRow(f"'{field}' starts with the assistant's answer; nothing prompts it")
    if not messages[last]["content"].strip():
        raise BadRow(f"'{field}': the last assistant message is empty")
    return {"prompt": messages[:last], "completion": [messages[last]]}


def _as_prompt(value: Any, field: str) -> list[dict]:
    if isinstance(value, str):
        if not value.strip():
            raise BadRow(f"'{field}' is blank")
        return [{"role": "user", "content": value}]
    return _messages(value, field)


def _as_answer(value: Any, field: str) -> list[dict]:
    if isinstance(value, str):
        if not value.strip():
            raise BadRow(f"'{field}' is blank")
        return [{"role": "assistant", "content": value}]
    messages = _messages(value, field)
    if messages[-1]["role"] != "assistant":
        raise BadRow(f"'{field}' does not end with an assistant message")
    return messages


def _label(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.strip().lower() in ("true", "1", "yes")
    raise BadRow(f"'label' is {value!r}; expected true or false")


def _normalise(fmt: str, row: Any) -> dict:
    if not isinstance(row, dict):
        raise BadRow(f"a {type(row).__name__}, not an object with fields")
    missing = sorted(field for field in FORMATS[fmt][1] if row.get(field) is None)
    if missing:
        raise BadRow(f"missing {', '.join(repr(f) for f in missing)} (the dataset is {fmt})")
    if fmt == "alpaca":
        instruction, extra = _text(row, "instruction"), _text(row, "input", required=False)
        prompt = [{"role": "system", "content": _text(row, "system")}] if row.get("system") else []
        prompt.append({"role": "user", "content": f"{instruction}\n\n{extra}" if extra.strip() else instruction})
        return {"prompt": prompt, "completion": [{"role": "assistant", "content": _text(row, "output")}]}
    if fmt == "sharegpt":
        messages = _messages(row["conversations"], "conversations", "from", "value", SHAREGPT_ROLES)
        return _split_conversation(messages, "conversations")
    if fmt == "messages":
        return _split_conversation(_messages(row["messages"], "messages"), "messages")
    if fmt == "prompt_completion":
        return {"prompt": _as_prompt(row["prompt"], "prompt"), "completion": _as_answer(row["completion"], "completion")}
    if fmt == "text":
        return {"text": _text(row, "text")}
    if fmt == "preference":
        return {"prompt": _as_prompt(row["prompt"], "prompt"), "chosen": _as_answer(row["chosen"], "chosen"),
                "rejected": _as_answer(row["rejected"], "rejected")}
    if fmt == "kto":
        return {"prompt": _as_prompt(row["prompt"], "prompt"), "completion": _as_answer(row["completion"], "completion"),
                "label": _label(row["label"])}
    raise AssertionError(fmt)


# ------------------------------------------------------------------------------------------ API

def examine(path: Path) -> tuple[dict, list[dict]]:
    """inspect_dataset's report and load_rows' rows from one read of the file."""
    path = Path(path)
    records, bad = _read(path)
    columns = sorted({key for _, row in records if isinstance(row, dict) for key in row})
    total = len(records) + len(bad)
    report = {"format": None, "task": None, "rows": total, "usable_rows": 0, "bad_rows": [],
              "bad_row_count": 0, "columns": columns}
    if total == 0:
        raise DatasetError(f"{path.name} is empty: it has no rows.", report)
    fmt = _detect(records)
    if fmt is None:
        report.update(bad_rows=bad[:BAD_ROWS_REPORTED], bad_row_count=total)
        expected = "; ".join(f"{name}: {', '.join(sorted(fields))}" for name, (_, fields) in FORMATS.items())
        raise DatasetError(f"{path.name}: no known format; the rows have the fields "
                           f"{', '.join(columns) or '(none)'}. Expected one of — {expected}.", report)
    rows = []
    for line, record in records:
        try:
            rows.append(_normalise(fmt, record))
        except BadRow as reason:
            bad.append({"line": line, "reason": str(reason)})
    bad.sort(key=lambda item: item["line"])
    report.update(format=fmt, task=FORMATS[fmt][0], usable_rows=len(rows),
                  bad_rows=bad[:BAD_ROWS_REPORTED], bad_row_count=len(bad))
    if not rows:
        examples = "; ".join(f"line {item['line']}: {item['reason']}" for item in bad[:3])
        raise DatasetError(f"{path.name}: none of its {total} rows can be used ({examples}).", report)
    return report, rows


def inspect_dataset(path: Path) -> dict:
    """What the file holds: {"format", "task", "rows", "usable_rows", "bad_rows": [{"line", "reason"}]
    (the first BAD_ROWS_REPORTED), "bad_row_count", "columns"}. Raises DatasetError (with .report)
    when the file is unreadable, empty, of no known format, or has no usable row."""
    return examine(path)[0]


def load_rows(path: Path) -> tuple[str, list[dict], list[dict]]:
    """(format, usable rows in the canonical shape of the format's task, bad rows) for training.
    Raises DatasetError like inspect_dataset; never returns an empty list of rows."""
    report, rows = examine(path)
    return report["format"], rows, report["bad_rows"]


def task_of(fmt: str) -> str:
    """sft, text, preference or kto: what a format's canonical rows are for."""
    return FORMATS[fmt][0]
