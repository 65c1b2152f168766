"""Dataset files on disk: streamed into a temporary file, checked, then moved into place, so an
upload that fails or is refused leaves nothing behind."""
from __future__ import annotations

import csv
import io
import json
import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
EXTENSIONS = {".jsonl": "jsonl", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
MAX_BAD_ROWS_LISTED = 50


class UploadTooLarge(Exception):
    pass


def incoming_path(datasets_dir: Path, extension: str) -> Path:
    """A fresh file in DATA_DIR/datasets/.incoming with the upload's extension (the inspector reads it)."""
    incoming = datasets_dir / ".incoming"
    incoming.mkdir(parents=True, exist_ok=True)
    return incoming / f"{uuid.uuid4().hex}{extension}"


async def receive_into(path: Path, chunks, limit: int) -> int:
    """Writes an async stream of byte chunks to `path`; raises UploadTooLarge past `limit` bytes.
    The caller deletes `path` on any error."""
    size = 0
    with open(path, "wb") as out:
        async for chunk in chunks:
            size += len(chunk)
            if size > limit:
                raise UploadTooLarge(size)
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
    return size


def inspect(path: Path, file_format: str, display_name: str) -> dict[str, Any]:
    """The validation report. lanner.core.dataset_formats.inspect_dataset (the worker issue's,
    which knows every chat format) when it exists; until then a minimal check of our own."""
    try:
        from lanner.core.dataset_formats import DatasetError, inspect_dataset
    except ModuleNotFoundError as exc:
        if exc.name != "lanner.core.dataset_formats":
            raise
        report = minimal_report(path, file_format)
        if report.get("error"):
            report["error"] = f"{display_name}: {report['error']}"
        return report
    try:
        return inspect_dataset(path)
    except DatasetError as exc:  # unusable as a whole: the report says why, with no usable row
        report = dict(exc.report or {})
        report.update(usable_rows=0, error=str(exc).replace(path.name, display_name))
        return report


def _guess_format(columns: set[str]) -> str:
    if {"chosen", "rejected"} <= columns:
        return "preference"
    if {"prompt", "completion", "label"} <= columns:
        return "kto"
    if "messages" in columns:
        return "messages"
    if "conversations" in columns:
        return "sharegpt"
    if {"instruction", "output"} <= columns:
        return "alpaca"
    if {"prompt", "completion"} <= columns:
        return "prompt_completion"
    if "text" in columns:
        return "text"
    return "unknown"


def _rows(path: Path, file_format: str):
    """(line number, row or None, reason) for each row of the file."""
    if file_format == "parquet":
        import pyarrow.parquet as pq

        for index, row in enumerate(pq.read_table(path).to_pylist(), start=1):
            yield index, row, None
        return
    text = path.read_bytes().decode("utf-8-sig")  # UnicodeDecodeError is reported by the caller
    if file_format == "jsonl":
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                yield number, None, f"not JSON: {exc.msg}"
                continue
            yield (number, row, None) if isinstance(row, dict) else (number, None, "not a JSON object")
    elif file_format == "json":
        data = json.loads(text)
        if isinstance(data, dict) and isinstance(data.get("data"), list):
            data = data["data"]
        if not isinstance(data, list):
            raise ValueError("a .json dataset must be an array of objects")
        for number, row in enumerate(data, start=1):
            yield (number, row, None) if isinstance(row, dict) else (number, None, "not a JSON object")
    else:
        for number, row in enumerate(csv.DictReader(io.StringIO(text)), start=2):
            if None in row:
                yield number, None, "more fields than the header has"
            else:
                yield number, row, None


def minimal_report(path: Path, file_format: str) -> dict[str, Any]:
    rows = usable = 0
    bad: list[dict[str, Any]] = []
    columns: set[str] = set()
    try:
        for number, row, reason in _rows(path, file_format):
            rows += 1
            if row is None or not any(value not in (None, "") for value in row.values()):
                bad.append({"line": number, "reason": reason or "empty row"})
                continue
            usable += 1
            columns |= set(row)
    except UnicodeDecodeError as exc:
        return {"file_format": file_format, "format": None, "rows": 0, "usable_rows": 0,
                "bad_rows": [], "error": f"not UTF-8 text (byte {exc.start})"}
    except Exception as exc:  # any parser's complaint about the whole file
        return {"file_format": file_format, "format": None, "rows": 0, "usable_rows": 0,
                "bad_rows": [], "error": f"cannot read it as {file_format}: {exc}"}
    return {"file_format": file_format, "format": _guess_format(columns) if usable else None, "rows": rows,
            "usable_rows": usable, "bad_rows": bad[:MAX_BAD_ROWS_LISTED], "bad_row_count": len(bad),
            "columns": sorted(columns), "inspector": "minimal"}


def move_into_place(temporary: Path, final_dir: Path, filename: str) -> Path:
    final_dir.mkdir(parents=True, exist_ok=True)
    final = final_dir / filename
    os.replace(temporary, final)
    return final


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
