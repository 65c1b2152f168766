"""Dataset files in, one canonical row shape out.

Reads jsonl, json, csv and parquet; detects the format from the rows' fields; checks every row and
reports the ones that cannot be used with their line number and every reason. The API calls
`inspect_dataset` on upload; the training process calls `examine`.

Detected formats and what they become (the canonical shapes TRL's trainers take):
- alpaca (instruction, input?, output, system?)      -> sft: {"prompt": [messages], "completion": [assistant]}
- sharegpt (conversations: [{from, value}])          -> sft
- messages (OpenAI style: [{role, content}])          -> sft
- prompt_completion (prompt, completion)             -> sft
- text (text)                                        -> text: {"text": str}
- preference (prompt, chosen, rejected)              -> preference: {"prompt": [...], "chosen": [...], "rejected": [...]}
  (without a prompt: the turns chosen and rejected share, as lists of messages or "Human:" / "Assistant:"
  transcripts, up to the last user turn among them)
- kto (prompt, completion, label)                    -> kto: {"prompt": [...], "completion": [...], "label": bool}
- prompt (prompt, or chat messages, ending with a user turn; other columns kept, e.g. a reference answer)
                                                     -> prompt: {"prompt": [messages], <column>: value, ...} (GRPO)

Conversations become prompt/completion pairs split before the last assistant turn, so that "loss
on the completion only" is TRL's plain prompt-completion masking and needs no generation tags in
the chat template (earlier assistant turns are context, not targets). An assistant turn marked not to
be trained ("weight": 0, "loss": false) is not that turn: the split is before the last one unmarked.
A conversation's messages may be {role, content} or ShareGPT's {from, value}, with ShareGPT's role
names (human, gpt, ...) in either, and a content given as a list of text parts (a part of another
kind, an image, makes the row unusable). An answer written as the whole conversation (the prompt's
messages first) keeps the part after the prompt; a preference pair whose answers are the same is
unusable. Text that is blank but for invisible characters (a zero-width space) is blank.

Conversations that call tools (messages, ShareGPT and prompt/completion rows: TOOL_FORMATS): an assistant
message may carry OpenAI's "tool_calls" (its content then may be null), each made the chat templates'
{"type": "function", "function": {"name", "arguments": {...}}} (arguments given as JSON text are parsed); a
"tool" message answers one (its tool_call_id and name kept); the row's "tools" (the functions' JSON schemas, a
list or JSON text of one) go to the chat template. LLaMA-Factory's ShareGPT writes a call as a "function_call"
turn whose value is the call's JSON and the answer as an "observation" turn: read as the same. Only the SFT
methods train them.

The report accounts for every row of the file: `rows` = `usable_rows` + `bad_row_count`. A row is
a line of a .jsonl file (a blank line, or one holding only whitespace or a carriage return, is a
row that cannot be used: "blank line"), a record of a .csv file after its header (blank lines
likewise), an element of a .json file's list, a row of a .parquet file. "line" in the report is the
file line the row starts on (1-based; `numbered_by` "line"), and the row's place in the file for
parquet and for a JSON list with several rows on one line (`numbered_by` "row"). A bad row's reason names every problem found in it, "; " apart. A usable row
can still carry warnings: a key that differs from a field the format reads only in case or spaces
("Input", " output") is never read as that field, and is named (the field names are exact; a row
that lacks the field then names the look-alike in its reason). `notes` say how the file was read
when that was not what its extension says (a JSON array in a .jsonl file, JSON Lines in a .json
file, lines ended by a carriage return alone, a CSV separated by semicolons or tabs, byte order marks
starting later lines, a repeated CSV column, rows numbered by place). A key
repeated in one JSON object (only its last value is read, as JSON parsers do) is named too.
"""
from __future__ import annotations

import codecs
import csv
import io
import json
import re
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lanner.core import strict_json, tool_turns

BAD_ROWS_REPORTED = 100
# The fields an error message names of rows that match no format (a CSV can have thousands of columns).
FIELDS_NAMED = 20
WARNINGS_REPORTED = 100
PROBLEMS_NAMED = 10  # per row; the rest are counted
BLANK_LINE = "blank line"
# The role names conversations are written with (ShareGPT's, Gemma's "model") -> the chat template's
ROLE_NAMES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant",
              "assistant": "assistant", "bot": "assistant", "model": "assistant", "tool": "tool",
              "function_call": "assistant", "observation": "tool"}  # (LLaMA-Factory's ShareGPT with tools)
# a message's (role, content) keys: OpenAI's and ShareGPT's, read whichever a message has
MESSAGE_KEY_PAIRS = (("role", "content"), ("from", "value"))
EXTENSIONS = (".jsonl", ".json", ".csv", ".parquet")

# format -> (task, fields that identify it). Checked in this order: the most specific first.
FORMATS: dict[str, tuple[str, frozenset[str]]] = {
    "preference": ("preference", frozenset({"chosen", "rejected"})),  # without a prompt: the turns both share
    "kto": ("kto", frozenset({"prompt", "completion", "label"})),
    "messages": ("sft", frozenset({"messages"})),
    "sharegpt": ("sft", frozenset({"conversations"})),
    "alpaca": ("sft", frozenset({"instruction", "output"})),
    "prompt_completion": ("sft", frozenset({"prompt", "completion"})),
    "text": ("text", frozenset({"text"})),
    "prompt": ("prompt", frozenset({"prompt"})),
}
OPTIONAL_FIELDS: dict[str, frozenset[str]] = {"alpaca": frozenset({"input", "system"}),
                                               "preference": frozenset({"prompt"})}
# A turn of a "Human: ... Assistant: ..." transcript (Anthropic's HH-RLHF writes each answer so)
TRANSCRIPT_TURN = re.compile(r"(?:\A\s*|\n+)(Human|Assistant):[ \t]*")
MESSAGE_KEYS = ("role", "content", "from", "value")
# The formats whose rows may carry "tools" (for their chat template) and assistant turns that call them
TOOL_FORMATS = ("messages", "sharegpt", "prompt_completion")
TOOL_RESULT_KEYS = ("tool_call_id", "name")  # what a tool's message may say of the call it answers


class DatasetError(ValueError):
    """The file cannot be used for training; `report` holds what inspection found (may be None)."""

    def __init__(self, message: str, report: dict | None = None):
        super().__init__(message)
        self.report = report


class BadRow(ValueError):
    """A row that cannot be used, with every problem found in it."""

    def __init__(self, *problems: str):
        self.problems = list(problems)
        named = problems[:PROBLEMS_NAMED]
        more = len(problems) - len(named)
        super().__init__("; ".join(named) + (f"; and {more} more problem{'s' if more > 1 else ''}" if more else ""))


@dataclass
class _Read:
    """What a reader found: (line, parsed row) for each row it could read, the rows it could not
    (blank ones included), how it read the file when not as the extension says, and notes on rows
    (a key repeated in one object)."""
    records: list[tuple[int, Any]] = field(default_factory=list)
    bad: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    numbered_by: str = "line"
    row_notes: dict[int, list[str]] = field(default_factory=dict)  # line -> what reading it noticed


# ---------------------------------------------------------------------------------------- reading

def _decode_utf16(raw: bytes, path: Path) -> str:
    """A file that starts with a UTF-16 byte order mark, decoded; one that is not UTF-16 past it (a lone
    surrogate, an odd byte at the end) is refused in words."""
    try:
        return raw.decode("utf-16")
    except UnicodeDecodeError as error:
        raise DatasetError(f"{path.name} starts as UTF-16 text (its byte order mark) but is not UTF-16 throughout: "
                           f"{error.reason} at byte {error.start}. Save the file as UTF-8.") from None


def _decode(raw: bytes, path: Path) -> str:
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return _decode_utf16(raw, path)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = raw[:error.start].count(b"\n") + 1
        raise DatasetError(f"{path.name} is not UTF-8 text: byte 0x{raw[error.start]:02x} on line {line} "
                           f"cannot be decoded. Save the file as UTF-8.") from None


def json_error_text(error: json.JSONDecodeError, *, line: bool = False) -> str:
    """Python's JSON error in words: its message ends in "at" where it names a position ("Unterminated
    string starting at"), which the position given here then completes."""
    message = error.msg.removesuffix(" at")
    return f"{message} at line {error.lineno}, column {error.colno}" if line else f"{message} at column {error.colno}"


class _RepeatedKeys:
    """An object_pairs_hook that builds dicts as json does (the last value of a repeated key wins)
    and notes each key an object repeats, so that no value is dropped unsaid."""

    def __init__(self):
        self.keys: list[str] = []

    def __call__(self, pairs: list[tuple[str, Any]]) -> dict:
        seen = set()
        for key, _ in pairs:
            if key in seen:
                self.keys.append(key)
            seen.add(key)
        return dict(pairs)

    def notes(self) -> list[str]:
        keys, self.keys = self.keys, []
        return [f"key {key!r} appears more than once in one object: only its last value was read"
                for key in dict.fromkeys(keys)]


def _read_jsonl(path: Path) -> _Read:
    """Each line decoded and parsed on its own, so that one bad line costs one row, not the file."""
    raw = path.read_bytes()
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raw = _decode_utf16(raw, path).encode("utf-8")
    raw = raw.removeprefix(codecs.BOM_UTF8)
    if raw.lstrip().startswith(b"["):  # a JSON array saved as .jsonl (on one line or several)
        try:
            text = raw.decode("utf-8")
            if isinstance(strict_json.loads(text), list):
                read = _read_json_text(text, path.name)
                read.notes.append(f"{path.name} holds one JSON list of rows, not a row per line: it was read as JSON.")
                return read
        except (UnicodeDecodeError, ValueError, DatasetError):
            pass  # not one array: each line is read and reported as a row
    return _json_lines(raw)


def _json_lines(raw: bytes) -> _Read:
    read = _Read()
    separator = b"\n"
    if b"\n" not in raw and b"\r" in raw.strip():
        separator = b"\r"
        read.notes.append("Its lines end in a carriage return alone (old Mac style); they were read as lines.")
    lines = raw.split(separator)
    if lines[-1] == b"":
        lines.pop()  # the newline that ends the last line starts no line of its own
    marked: list[int] = []
    for number, line_bytes in enumerate(lines, start=1):
        try:
            line = line_bytes.decode("utf-8").strip()
            if line.startswith("\ufeff"):  # a byte order mark past the first line: files joined with cat
                line = line.lstrip("\ufeff").strip()
                marked.append(number)
        except UnicodeDecodeError as error:
            read.bad.append({"line": number, "reason": f"not UTF-8 text (byte 0x{line_bytes[error.start]:02x} "
                                                       f"at column {error.start + 1})"})
            continue
        if not line:
            read.bad.append({"line": number, "reason": BLANK_LINE})
            continue
        repeated = _RepeatedKeys()
        try:
            read.records.append((number, strict_json.loads(line, object_pairs_hook=repeated)))
            if notes := repeated.notes():
                read.row_notes[number] = notes
        except json.JSONDecodeError as error:
            read.bad.append({"line": number, "reason": f"malformed JSON: {json_error_text(error)}"})
        except strict_json.UnstorableJson as error:
            read.bad.append({"line": number, "reason": str(error)})
    if marked:
        read.notes.append(f"{len(marked)} line{'s' if len(marked) > 1 else ''} (first: line {marked[0]}) "
                          f"start{'' if len(marked) > 1 else 's'} with a byte order mark, as files joined together "
                          "do: it was read past.")
    return read


def _read_json(path: Path) -> _Read:
    return _read_json_text(_decode(path.read_bytes(), path), path.name)


def _read_json_text(text: str, name: str) -> _Read:
    if not text.strip():
        return _Read()
    try:
        value = strict_json.loads(text)
    except json.JSONDecodeError as error:
        if error.msg == "Extra data" and _first_line_is_object(text):  # JSON Lines saved as .json
            read = _json_lines(text.encode("utf-8"))
            read.notes.append(f"{name} holds one JSON object per line (JSON Lines): it was read as .jsonl.")
            return read
        raise DatasetError(f"{name} is not valid JSON: {json_error_text(error, line=True)}.") from None
    except strict_json.UnstorableJson as error:
        raise DatasetError(f"{name}: {error}") from None
    key = None
    if isinstance(value, dict):
        lists = [key for key, item in value.items() if isinstance(item, list)]
        if len(lists) != 1:
            raise DatasetError(f"{name} holds a JSON object; expected a list of rows "
                               f"(or an object with exactly one list of rows).")
        key = lists[0]
    elif not isinstance(value, list):
        raise DatasetError(f"{name} holds JSON {_a(value)}; expected a list of rows.")
    elements = _element_lines(text, key)
    read = _Read()
    if len({line for line, _, _ in elements}) < len(elements):  # rows share lines: number them by position
        read.numbered_by = "row"
        read.notes.append(f"{name} has several rows on one line: rows are numbered by their place in the list.")
        elements = [(number, item, notes) for number, (_, item, notes) in enumerate(elements, start=1)]
    for number, item, notes in elements:
        read.records.append((number, item))
        if notes:
            read.row_notes[number] = notes
    return read


def _first_line_is_object(text: str) -> bool:
    first = next((line for line in text.split("\n") if line.strip()), "")
    try:
        return isinstance(json.loads(first), dict)
    except ValueError:
        return False


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position] in " \t\r\n":
        position += 1
    return position


def _element_lines(text: str, key: str | None) -> list[tuple[int, Any, list[str]]]:
    """(line each element starts on, element, the keys it repeats) of the top-level list, or of the
    list at `key` of the top-level object, found by decoding the text in place."""
    repeated = _RepeatedKeys()
    decoder = json.JSONDecoder(object_pairs_hook=repeated)
    position = _skip_space(text, 0)
    if key is not None:  # walk the object's members up to the list's
        position += 1
        while True:
            position = _skip_space(text, position)
            name, position = decoder.raw_decode(text, position)
            position = _skip_space(text, _skip_space(text, position) + 1)  # past the colon
            if name == key and text[position] == "[":
                break
            _, position = decoder.raw_decode(text, position)
            position = _skip_space(text, position) + 1  # past the comma
        repeated.notes()  # the wrapper's own members are not a row's
    position += 1  # past the list's "["
    result, counted_to, line = [], 0, 1
    while True:
        position = _skip_space(text, position)
        if text[position] == "]":
            return result
        line += text.count("\n", counted_to, position)
        counted_to = position
        item, position = decoder.raw_decode(text, position)
        result.append((line, item, repeated.notes()))
        position = _skip_space(text, position)
        if text[position] == ",":
            position += 1


def _read_csv(path: Path) -> _Read:
    text = _decode(path.read_bytes(), path)
    delimiter = _delimiter(text)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    read, header, ended = _Read(), None, 0
    if delimiter != ",":
        read.notes.append(f"Its header has no comma but {DELIMITERS[delimiter]}: cells were read as separated by them.")
    try:
        for cells in reader:
            line, ended = ended + 1, reader.line_num  # a record starts on the line after the last one ended
            if not any(cell.strip() for cell in cells):
                read.bad.append({"line": line, "reason": BLANK_LINE if len(cells) <= 1 else "every cell is empty"})
            elif header is None:
                header = cells
                repeated = sorted({name for name in cells if cells.count(name) > 1})
                if repeated:
                    read.notes.append(f"The header names {', '.join(map(repr, repeated))} more than once: "
                                      "each row's first such cell is read.")
            elif len(cells) > len(header):
                read.bad.append({"line": line, "reason": f"{len(cells) - len(header)} more cell(s) than the header has"})
            else:
                row: dict[str, Any] = {}
                for name, value in zip(header, cells):
                    row.setdefault(name, _cell(value))
                read.records.append((line, row))
    except csv.Error as error:
        raise DatasetError(f"{path.name} is not valid CSV: {error} (line {reader.line_num}).") from None
    if header is None:  # blank lines only: no header, so no rows either
        return _Read(bad=read.bad)
    return read


# What a spreadsheet may separate a "CSV" file's cells with instead of commas (Excel in a locale whose
# decimal mark is the comma writes semicolons), read when the header has no comma but one of them.
DELIMITERS = {";": "semicolons", "\t": "tabs", "|": "vertical bars"}


def _delimiter(text: str) -> str:
    header = next((line for line in io.StringIO(text) if line.strip()), "")  # (not a list of every line)
    if "," in header:
        return ","
    return next((mark for mark in DELIMITERS if mark in header), ",")


def _cell(value: str) -> Any:
    """CSV cells are strings; a cell holding a JSON list or object (a conversation) is parsed."""
    stripped = value.strip()
    # (not JSON, or JSON that cannot be kept: the cell stays text)
    return _json_or(stripped, value) if stripped[:1] in ("[", "{") else value


def _json_or(text: str, otherwise: Any) -> Any:
    """The value of a JSON text, or `otherwise` for text that is not JSON or JSON that cannot be kept."""
    try:
        return strict_json.loads(text)
    except ValueError:  # (json.JSONDecodeError and strict_json.UnstorableJson)
        return otherwise


# Parquet compresses its columns and may store a repeated value once (dictionary and run-length
# encoding), so a file of kilobytes can hold millions of rows and gigabytes of text, which reading it
# into rows would take in memory (a decompression bomb). A file may hold at most one row per byte of
# it, and decode to at most PARQUET_MAX_EXPANSION times its size (text compresses 3-10 times), or
# PARQUET_MIN_DECODED_BYTES for a small file; it is read a batch at a time and refused past either.
PARQUET_MAX_EXPANSION = 100
PARQUET_MIN_ROWS = 100_000
PARQUET_MIN_DECODED_BYTES = 256 * 1024 * 1024
PARQUET_BATCH_ROWS = 64


def _parquet_rows(path: Path) -> list[dict]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    size = path.stat().st_size
    most_rows = max(size, PARQUET_MIN_ROWS)
    most_bytes = max(PARQUET_MAX_EXPANSION * size, PARQUET_MIN_DECODED_BYTES)
    too_big = (f"{path.name} decodes to more than a {size}-byte Parquet file holds of real rows (at most "
               f"{most_rows} rows and {most_bytes} bytes of values): it looks like a decompression bomb; "
               "save the dataset without so many repeated values, or as JSON Lines")
    with pq.ParquetFile(path) as parquet:
        meta = parquet.metadata
        stored = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        if meta.num_rows > most_rows or stored > most_bytes:
            raise DatasetError(too_big)
        rows: list[dict] = []
        decoded = 0
        for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS):
            # a dictionary column holds each value once: measure it as the rows will hold it
            columns = [column.dictionary_decode() if pa.types.is_dictionary(column.type) else column
                       for column in batch.columns]
            decoded += sum(column.nbytes for column in columns)
            if decoded > most_bytes or len(rows) + batch.num_rows > most_rows:
                raise DatasetError(too_big)
            rows.extend(pa.RecordBatch.from_arrays(columns, names=batch.schema.names).to_pylist())
    return rows


def _read_parquet(path: Path) -> _Read:
    try:
        rows = _parquet_rows(path)
    except DatasetError:
        raise
    except Exception as error:  # pyarrow raises several types for a damaged file
        # pyarrow's message names the file by its path on the server: only the reason is shown
        reason = str(error).replace(str(path), path.name).replace(str(path.parent), "")
        raise DatasetError(f"{path.name} is not a readable Parquet file: {reason}") from None
    return _Read(records=list(enumerate(rows, start=1)), numbered_by="row")


READERS = {".jsonl": _read_jsonl, ".json": _read_json, ".csv": _read_csv, ".parquet": _read_parquet}


def _read(path: Path) -> _Read:
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
        if _asks(row):
            counts["prompt"] += 1
            continue
        for name, (_, fields) in FORMATS.items():
            if fields <= keys:
                counts[name] += 1
                break
    best = max(FORMATS, key=lambda name: counts[name])
    return best if counts[best] else None


def _asks(row: dict) -> bool:
    """A conversation that ends with the user's turn: a prompt for the model to answer (GRPO)."""
    messages = row.get("messages")
    return ("prompt" not in row and isinstance(messages, list) and bool(messages)
            and isinstance(messages[-1], dict) and ROLE_NAMES.get(messages[-1].get("role")) == "user")


def _squashed(key: Any) -> str | None:
    return "".join(key.split()).casefold() if isinstance(key, str) else None


def _lookalikes(obj: dict, field_name: str) -> list[str]:
    """The keys of `obj` that differ from `field_name` only in case or spaces."""
    return [key for key in obj if key != field_name and _squashed(key) == _squashed(field_name)]


def _lookalike_hint(columns: Iterable[str]) -> str:
    known = {_squashed(name): name for name in (*{f for _, fs in FORMATS.values() for f in fs},
                                                *{f for fs in OPTIONAL_FIELDS.values() for f in fs})}
    pairs = [f"{column!r} looks like '{known[_squashed(column)]}'" for column in columns
             if _squashed(column) in known and column != known[_squashed(column)]]
    return f" Field names are exact, case and spaces included: {', '.join(pairs)}." if pairs else ""


# ---------------------------------------------------------------------------------- normalising

def _a(value: Any) -> str:
    """A JSON value's kind in words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"


def _missing(obj: dict, key: str, where: str | None = None) -> str:
    text = f"{where} has no '{key}'" if where else f"missing '{key}'"
    near = _lookalikes(obj, key)
    if near:
        text += f" (it has {', '.join(map(repr, near))}: field names must match exactly, case and spaces included)"
    return text


def _required(row: dict, name: str) -> Any:
    if name not in row:
        raise BadRow(_missing(row, name))
    if row[name] is None:
        raise BadRow(f"'{name}' is null")
    return row[name]


def _blank(text: str) -> bool:
    """Nothing visible: only whitespace and invisible format characters (a zero-width space or joiner, a
    byte order mark, a direction mark), which str.strip keeps."""
    return all(char.isspace() or unicodedata.category(char) == "Cf" for char in text)


def _text(row: dict, name: str) -> str:
    value = _required(row, name)
    if not isinstance(value, str):
        raise BadRow(f"'{name}' is {_a(value)}, not text")
    if not value:
        raise BadRow(f"'{name}' is empty")
    if _blank(value):
        raise BadRow(f"'{name}' is blank (only whitespace" + (")" if not value.strip() else
                                                             " and invisible characters such as zero-width spaces)"))
    return value


def _optional_text(row: dict, name: str) -> str:
    value = row.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadRow(f"'{name}' is {_a(value)}, not text")
    return value


def _messages(value: Any, name: str, role_key: str = "role", content_key: str = "content",
              roles: dict[str, str] | None = None) -> list[dict]:
    if not isinstance(value, list):
        raise BadRow(f"'{name}' is {_a(value)}, not a list of messages")
    if not value:
        raise BadRow(f"'{name}' is an empty list")
    roles = roles or ROLE_NAMES
    messages, problems = [], []
    for index, message in enumerate(value):
        where = f"{name}[{index}]"
        if not isinstance(message, dict):
            problems.append(f"{where} is {_a(message)}, not an object")
            continue
        found = len(problems)
        # a conversation's messages may be written either way ({role, content} or ShareGPT's {from, value})
        keys = (role_key, content_key)
        if role_key not in message and content_key not in message:
            keys = next(((r, c) for r, c in MESSAGE_KEY_PAIRS if r in message or c in message), keys)
        (role_name, content_name), role, content = keys, message.get(keys[0]), message.get(keys[1])
        if role is None:
            problems.append(_missing(message, role_name, where))
        elif not isinstance(role, str) or role not in roles:
            problems.append(f"{where} has role {role!r}; expected one of {', '.join(sorted(set(roles.values())))}")
        calls = None
        if role == "function_call" and isinstance(content, str):  # the call itself, as JSON text
            call = _json_or(content, None)
            message, content = {**message, "tool_calls": call if isinstance(call, list) else [call]}, ""
        if message.get("tool_calls") is not None:
            try:
                calls = _tool_calls(message["tool_calls"], where, roles.get(role) if isinstance(role, str) else None)
            except BadRow as error:
                problems.extend(error.problems)
            if content is None:
                content = ""
        if content is None:
            problems.append(f"{where}'s '{content_name}' is null" if content_name in message
                            else _missing(message, content_name, where))
        elif isinstance(content, list):
            try:
                content = _parts_text(content, f"{where}'s '{content_name}'")
            except BadRow as error:
                problems.extend(error.problems)
        elif not isinstance(content, str):
            problems.append(f"{where}'s '{content_name}' is {_a(content)}, not text")
        if len(problems) == found:
            messages.append({"role": roles[role], "content": content, **({"tool_calls": calls} if calls else {}),
                             **{key: message[key] for key in TOOL_RESULT_KEYS
                                if roles[role] == "tool" and isinstance(message.get(key), str)}})
    if problems:
        raise BadRow(*problems)
    return messages


def _tool_calls(value: Any, where: str, role: str | None) -> list[dict]:
    """An assistant message's tool calls in the chat templates' shape, {"type": "function", "function": {"name",
    "arguments": {...}}}, from OpenAI's (arguments as a JSON string) or with the function's fields at the top."""
    if role != "assistant":
        raise BadRow(f"{where} has tool calls but is not the assistant's message")
    if not isinstance(value, list) or not value:
        raise BadRow(f"{where}'s 'tool_calls' is {_a(value)}, not a list of calls")
    calls, problems = [], []
    for index, call in enumerate(value):
        here = f"{where}'s tool_calls[{index}]"
        function = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(function, dict):
            function = {}
        name, arguments = function.get("name"), function.get("arguments", {})
        if isinstance(arguments, str):
            arguments = _json_or(arguments, None)
        if not isinstance(name, str) or not name.strip():
            problems.append(f"{here} names no function")
        elif not isinstance(arguments, dict):
            problems.append(f"{here}'s arguments are not an object (or a JSON text of one)")
        else:
            calls.append({"type": "function", "function": {"name": name, "arguments": arguments}})
    if problems:
        raise BadRow(*problems)
    return calls


def _tools(row: dict) -> list[dict]:
    """A conversation's "tools" (the functions its model may call, as JSON schemas): a list of objects, or a JSON
    text of one."""
    value = row["tools"]
    if isinstance(value, str):
        not_json = object()
        value = _json_or(value, not_json)
        if value is not_json:
            raise BadRow("'tools' is text that is not JSON")
    if not isinstance(value, list) or not all(isinstance(tool, dict) for tool in value):
        raise BadRow(f"'tools' is {_a(value)}, not a list of function schemas")
    return value


def _parts_text(parts: list, where: str) -> str:
    """A message's content given as a list of parts ({"type": "text", "text": ...}, as OpenAI's chat
    format allows): their text, a line apart. A part of another kind (an image, audio) cannot be trained
    on here and is named."""
    texts, problems = [], []
    for index, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "text":
            problems.append(f"{where}[{index}] is a text part whose 'text' is {_a(part.get('text'))}, not text")
        elif isinstance(kind, str):
            problems.append(f"{where}[{index}] is a part of type {kind!r}; only text parts can be trained on")
        else:
            problems.append(f"{where}[{index}] is {_a(part)}, not a part such as {{\"type\": \"text\", \"text\": ...}}")
    if problems:
        raise BadRow(*problems)
    if not texts:
        raise BadRow(f"{where} is an empty list of parts")
    return "\n".join(texts)


def _not_trained(message: Any) -> bool:
    """A message marked not to be learnt: OpenAI's "weight": 0, or "loss": false (or 0)."""
    return isinstance(message, dict) and any(message.get(key) == 0 for key in ("weight", "loss"))  # False == 0


def _split_conversation(messages: list[dict], name: str, skipped: frozenset[int] = frozenset()) -> dict:
    """Split before the last assistant message, or the last one not marked untrained (`skipped`: the
    turns after it are left out, as a conversation's turns after its answer are)."""
    answers = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not answers:
        raise BadRow(f"'{name}' has no assistant message to learn from")
    last = max((i for i in answers if i not in skipped), default=None)
    if last is None:
        raise BadRow(f"'{name}': every assistant message is marked not to be trained on (weight 0 or loss false)")
    if last == 0:
        raise BadRow(f"'{name}' starts with the assistant's answer; nothing prompts it")
    if _blank(messages[last]["content"]) and "tool_calls" not in messages[last]:
        raise BadRow(f"'{name}': the last assistant message is empty")
    return {"prompt": messages[:last], "completion": [messages[last]]}


def _conversation(role_key: str, content_key: str, roles: dict[str, str] | None = None):
    def check(row: dict, name: str) -> dict:
        value = _required(row, name)
        messages = _messages(value, name, role_key, content_key, roles)  # one message per element, or BadRow
        return _split_conversation(messages, name, frozenset(i for i, m in enumerate(value) if _not_trained(m)))
    return check


def _as_prompt(row: dict, name: str) -> list[dict]:
    value = _required(row, name)
    if isinstance(value, str):
        return [{"role": "user", "content": _text(row, name)}]
    return _messages(value, name)


def _as_answer(row: dict, name: str) -> list[dict]:
    value = _required(row, name)
    if isinstance(value, str):
        return [{"role": "assistant", "content": _text(row, name)}]
    messages = _messages(value, name)
    if messages[-1]["role"] != "assistant":
        raise BadRow(f"'{name}' does not end with an assistant message")
    if _blank(messages[-1]["content"]) and "tool_calls" not in messages[-1]:
        raise BadRow(f"'{name}': the last assistant message is empty")
    return messages


def _as_question(row: dict, name: str) -> list[dict]:
    messages = _as_prompt(row, name)
    if messages[-1]["role"] != "user":
        raise BadRow(f"'{name}' ends with the {messages[-1]['role']}'s message; a prompt to answer ends with the user's")
    return messages


def _transcript(text: str) -> list[dict] | None:
    """A "Human: ... Assistant: ..." transcript's turns as messages; None for other text."""
    parts = TRANSCRIPT_TURN.split(text)
    if len(parts) < 3 or parts[0].strip():
        return None
    return [{"role": "user" if who == "Human" else "assistant", "content": content.strip()}
            for who, content in zip(parts[1::2], parts[2::2])]


def _with_shared_prompt(row: dict) -> dict:
    """A preference row without a prompt whose answers are each the whole conversation (lists of messages, or
    transcripts): the prompt is the turns both share, up to the last user turn among them (TRL's implicit prompt),
    and each answer what follows it."""
    conversations, problems = [], []
    for name in ("chosen", "rejected"):
        value = row[name]
        try:
            conversations.append(_transcript(value) if isinstance(value, str) else _messages(value, name))
        except BadRow as error:
            problems.extend(error.problems)
    if problems:
        raise BadRow(*problems)
    chosen, rejected = conversations
    shared = 0
    if chosen is not None and rejected is not None:
        while shared < min(len(chosen), len(rejected)) and _same_turns(chosen[shared:shared + 1],
                                                                      rejected[shared:shared + 1]):
            shared += 1
        shared = max((i + 1 for i in range(shared) if chosen[i]["role"] == "user"), default=0)
    if not shared:
        raise BadRow("no 'prompt', and 'chosen' and 'rejected' share no turns to take as one: give a 'prompt', or "
                     "write both answers as the whole conversation (a list of messages, or a 'Human:' / 'Assistant:' "
                     "transcript)")
    unanswered = [f"'{name}' has no answer after the turns it shares with the other" for name, conversation
                  in (("chosen", chosen), ("rejected", rejected)) if len(conversation) == shared]
    if unanswered:
        raise BadRow(*unanswered)
    return {**row, "prompt": chosen[:shared], "chosen": chosen[shared:], "rejected": rejected[shared:]}


def _label(row: dict, name: str) -> bool:
    value = _required(row, name)
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.strip().lower() in ("true", "1", "yes")
    raise BadRow(f"'{name}' is {value!r}; expected true or false")


Check = Callable[[dict, str], Any]
# format -> each field it reads and how, in the order a bad row's problems are named
FIELD_CHECKS: dict[str, dict[str, Check]] = {
    "alpaca": {"system": _optional_text, "instruction": _text, "input": _optional_text, "output": _text},
    "sharegpt": {"conversations": _conversation("from", "value", ROLE_NAMES)},
    "messages": {"messages": _conversation("role", "content")},
    "prompt_completion": {"prompt": _as_prompt, "completion": _as_answer},
    "text": {"text": _text},
    "preference": {"prompt": _as_prompt, "chosen": _as_answer, "rejected": _as_answer},
    "kto": {"prompt": _as_prompt, "completion": _as_answer, "label": _label},
    "prompt": {"prompt": _as_question},
}
# A prompt row's other columns that reward functions may read (a reference answer): plain values only.
REFERENCE_VALUE = (str, int, float, bool, type(None))


ANSWERS = ("completion", "chosen", "rejected")  # the fields of prompt_completion, preference and kto that answer


def _same_turns(first: list[dict], second: list[dict]) -> bool:
    return len(first) == len(second) and all(a["role"] == b["role"] and a["content"].strip() == b["content"].strip()
                                             and a.get("tool_calls") == b.get("tool_calls")
                                             for a, b in zip(first, second))


def _answers(fmt: str, values: dict[str, Any]) -> list[str]:
    """The answers of a prompt_completion, preference or kto row, each the assistant's part only (in
    `values`), and the problems they have. An answer written as the whole conversation, the prompt's
    messages first (as in ultrafeedback_binarized), keeps what follows the prompt: trained as it stands,
    the prompt would be read twice and its user turn learnt as part of the answer. A preference pair
    whose answers are the same teaches nothing."""
    if not isinstance(values.get("prompt"), list):
        return []
    prompt, problems = values["prompt"], []
    for name in ANSWERS:
        answer = values.get(name)
        if not isinstance(answer, list):
            continue
        if len(answer) > len(prompt) and _same_turns(answer[:len(prompt)], prompt):
            values[name] = answer = answer[len(prompt):]
        stray = next((i for i, message in enumerate(answer) if message["role"] != "assistant"), None)
        if stray is not None:
            problems.append(f"'{name}' holds a {answer[stray]['role']} message after the prompt: an answer is the "
                            "assistant's messages (or the whole conversation, starting with the prompt's messages)")
    if fmt == "preference" and not problems and _same_turns(values["chosen"], values["rejected"]):
        problems.append("'chosen' and 'rejected' are the same answer: the pair has nothing to prefer")
    return problems


def _canonical(fmt: str, values: dict[str, Any], row: dict) -> dict:
    if fmt == "alpaca":
        instruction, extra, system = values["instruction"], values["input"], values["system"]
        prompt = [{"role": "system", "content": system}] if system.strip() else []
        prompt.append({"role": "user", "content": f"{instruction}\n\n{extra}" if extra.strip() else instruction})
        return {"prompt": prompt, "completion": [{"role": "assistant", "content": values["output"]}]}
    if fmt in ("sharegpt", "messages"):
        return {**next(iter(values.values())), **({"tools": values["tools"]} if values.get("tools") else {})}
    if fmt == "text":
        return {"text": values["text"]}
    if fmt == "prompt":
        return {**{key: value for key, value in row.items() if isinstance(key, str) and isinstance(value, REFERENCE_VALUE)},
                **values}
    return values  # prompt_completion, preference and kto: the fields are the canonical row (tools too)


def _normalise(fmt: str, row: Any) -> tuple[dict, list[str]]:
    """The row in its task's canonical shape and the warnings it carries; BadRow naming every
    problem when it cannot be used."""
    if not isinstance(row, dict):
        raise BadRow(f"{_a(row)}, not an object with fields")
    if fmt == "prompt" and "prompt" not in row and "messages" in row:  # a conversation to answer
        row = {("prompt" if key == "messages" else key): value for key, value in row.items()}
    values, problems = {}, []
    if fmt == "preference" and row.get("prompt") is None and row.get("chosen") is not None \
            and row.get("rejected") is not None:
        try:
            row = _with_shared_prompt(row)
        except BadRow as error:
            problems.extend(error.problems)
    for name, check in FIELD_CHECKS[fmt].items() if not problems else ():
        try:
            values[name] = check(row, name)
        except BadRow as error:
            problems.extend(error.problems)
    if fmt in TOOL_FORMATS and row.get("tools") is not None:
        try:
            values["tools"] = _tools(row)
        except BadRow as error:
            problems.extend(error.problems)
    if not problems and fmt in ("prompt_completion", "preference", "kto"):
        problems.extend(_answers(fmt, values))
    if not problems and fmt not in TOOL_FORMATS and tool_turns.has_tool_turns(
            [message for value in values.values() if isinstance(value, list) for message in value]):
        problems.append("tool calls and tools' answers are trained by supervised fine-tuning only (messages, "
                        "ShareGPT or prompt/completion rows)")
    # A look-alike of a field the row has, or of an optional one, is named here; a missing
    # required field's look-alike is named in its "missing" problem.
    warnings = [f"key {key!r} looks like '{name}' and was ignored: field names must match exactly"
                for name in FIELD_CHECKS[fmt]
                if name in row or name in OPTIONAL_FIELDS.get(fmt, ()) for key in _lookalikes(row, name)]
    if problems:
        raise BadRow(*problems, *warnings)
    return _canonical(fmt, values, row), warnings


# ------------------------------------------------------------------------------------------ API

def examine_lines(path: Path) -> tuple[dict, list[tuple[int, dict]]]:
    """examine's report, and each usable row with the line (parquet: the row number) it comes from."""
    path = Path(path)
    read = _read(path)
    records, bad = read.records, list(read.bad)
    columns = sorted({key for _, row in records if isinstance(row, dict) for key in row})
    total = len(records) + len(bad)
    report = {"format": None, "task": None, "numbered_by": read.numbered_by, "rows": total, "usable_rows": 0,
              "bad_rows": bad[:BAD_ROWS_REPORTED], "bad_row_count": len(bad), "warnings": [], "warning_count": 0,
              "notes": read.notes, "columns": columns}
    if total == 0:
        raise DatasetError(f"{path.name} is empty: it has no rows.", report)
    if not records and all(item["reason"] == BLANK_LINE for item in bad):
        raise DatasetError(f"{path.name} is empty: it has no rows, only {total} blank line{'s' if total > 1 else ''}.",
                           report)
    if not records:  # not one row could be read: what was wrong with them, not that their (no) fields match no format
        raise DatasetError(f"{path.name}: none of its {total} rows can be read ({_examples(bad)}).", report)
    fmt = _detect(records)
    if fmt is None:
        report.update(bad_row_count=total)
        expected = "; ".join(f"{name}: {', '.join(sorted(fields))}" for name, (_, fields) in FORMATS.items())
        shown = ", ".join(map(str, columns[:FIELDS_NAMED]))
        more = f" and {len(columns) - FIELDS_NAMED:,} more" if len(columns) > FIELDS_NAMED else ""
        raise DatasetError(f"{path.name}: no known format; the rows have the fields {shown}{more}. "
                           f"Expected one of — {expected}." + _lookalike_hint(columns), report)
    rows, warnings = [], []
    for line, record in records:
        read_notes = read.row_notes.get(line, [])
        try:
            row, notes = _normalise(fmt, record)
        except BadRow as reason:
            bad.append({"line": line, "reason": str(BadRow(*reason.problems, *read_notes))})
            continue
        rows.append((line, row))
        warnings.extend({"line": line, "message": note} for note in [*read_notes, *notes])
    bad.sort(key=lambda item: item["line"])
    report.update(format=fmt, task=FORMATS[fmt][0], usable_rows=len(rows), bad_rows=bad[:BAD_ROWS_REPORTED],
                  bad_row_count=len(bad), warnings=warnings[:WARNINGS_REPORTED], warning_count=len(warnings))
    if not rows:
        raise DatasetError(f"{path.name}: none of its {total} rows can be used ({_examples(bad)}).", report)
    return report, rows


def _examples(bad: list[dict]) -> str:
    """The first three bad rows in words, blank lines only where there is nothing else."""
    telling = [item for item in bad if item["reason"] != BLANK_LINE] or bad
    return "; ".join(f"line {item['line']}: {item['reason']}" for item in telling[:3])


def examine(path: Path) -> tuple[dict, list[dict]]:
    """inspect_dataset's report and load_rows' rows from one read of the file."""
    report, rows = examine_lines(path)
    return report, [row for _, row in rows]


def inspect_dataset(path: Path) -> dict:
    """What the file holds: {"format", "task", "numbered_by", "rows", "usable_rows", "bad_rows":
    [{"line", "reason"}] (the first BAD_ROWS_REPORTED), "bad_row_count", "warnings": [{"line",
    "message"}] (the first WARNINGS_REPORTED), "warning_count", "notes", "columns"}. Raises
    DatasetError (with .report) when the file is unreadable, empty, of no known format, or has no
    usable row."""
    return examine(path)[0]


def load_rows(path: Path) -> tuple[str, list[dict], list[dict]]:
    """(format, usable rows in the canonical shape of the format's task, bad rows) for training.
    Raises DatasetError like inspect_dataset; never returns an empty list of rows."""
    report, rows = examine(path)
    return report["format"], rows, report["bad_rows"]


def task_of(fmt: str) -> str:
    """sft, text, preference or kto: what a format's canonical rows are for."""
    return FORMATS[fmt][0]
