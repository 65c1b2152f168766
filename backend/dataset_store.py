"""Dataset files on disk: streamed into a temporary file, checked, then stored (lanner.backend.services.datasets.store_upload), so an
upload that fails or is refused leaves nothing behind."""
from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any


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


def inspect(path: Path, display_name: str) -> dict[str, Any]:
    """The validation report (lanner.core.dataset_formats); a file unusable as a whole gets the report
    so far with its `error` and no usable row."""
    from lanner.core.dataset_formats import DatasetError, inspect_dataset

    try:
        return inspect_dataset(path)
    except DatasetError as exc:
        report = dict(exc.report or {})
        report.update(usable_rows=0, error=str(exc).replace(path.name, display_name))
        return report


