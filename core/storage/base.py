"""The Store: where datasets, checkpoints and artifacts live, shared by the API and every worker host.
Keys are data-dir-relative POSIX paths ("datasets/3/chat.jsonl", "artifacts/7/checkpoints/checkpoint-20");
a folder is the set of files under its key. Two backends: the data directory (lanner.core.storage.local,
one box) and an S3-compatible object store (lanner.core.storage.s3, several hosts)."""
from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path

from lanner.core.errors import UserError

CHUNK = 1 << 20  # bytes per read of a streamed file


class BadKey(ValueError):
    """A key that is not a plain relative path inside the store."""


class StoreUnavailable(UserError):
    """The store could not be reached for longer than LANNER_STORE_RETRY_S, or refused the studio's
    settings (a missing bucket, wrong credentials): said in words, to a job's owner (its error) or in an
    API answer (503)."""

    def __init__(self, message: str):
        super().__init__(503, message)


def check_key(key: str) -> str:
    """The key, normalised (no trailing '/'); BadKey in words for an empty, absolute or '..' key."""
    if not isinstance(key, str) or not key.strip("/"):
        raise BadKey("A store key must name a file or folder, not be empty")
    if key.startswith("/") or "\\" in key or "\x00" in key:
        raise BadKey(f"A store key is a relative path with '/' separators: {key!r}")
    parts = key.rstrip("/").split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise BadKey(f"A store key may not contain '.', '..' or an empty part: {key!r}")
    return "/".join(parts)


class Store(ABC):
    """put/get a file or a folder, read a file (a byte range of it), list, size, etag, exists, delete."""

    @abstractmethod
    def put(self, key: str, source: Path, move: bool = False) -> None:
        """Stores the file or folder `source` under `key`, replacing what was there. With `move`, `source`
        is consumed (renamed into place locally; deleted once uploaded)."""

    @abstractmethod
    def get(self, key: str, target: Path) -> None:
        """Writes the key's file, or its folder's files, to `target` (FileNotFoundError when it has none)."""

    @abstractmethod
    def read(self, key: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        """The file's bytes from `start` to `end` inclusive (None: its end), in chunks."""

    @abstractmethod
    def is_file(self, key: str) -> bool: ...

    @abstractmethod
    def list(self, key: str) -> list[str]:
        """The files of the folder `key`, relative to it and sorted; [] when it has none."""

    @abstractmethod
    def size(self, key: str) -> int:
        """A file's size, or the total of a folder's files (FileNotFoundError when neither)."""

    @abstractmethod
    def file_etag(self, key: str) -> str: ...

    @abstractmethod
    def delete(self, key: str) -> None:
        """Deletes the file or the whole folder; nothing when it is not there."""

    def exists(self, key: str) -> bool:
        return self.is_file(key) or bool(self.list(key))

    def is_folder(self, key: str) -> bool:
        return not self.is_file(key) and bool(self.list(key))

    def etag(self, key: str) -> str:
        """Changes whenever the file, or any file of the folder, changes (FileNotFoundError when neither)."""
        if self.is_file(key):
            return self.file_etag(key)
        files = self.list(key)
        if not files:
            raise FileNotFoundError(key)
        digest = hashlib.sha256()
        for name in files:
            digest.update(f"{name}\0{self.file_etag(f'{check_key(key)}/{name}')}\0".encode())
        return f'"{digest.hexdigest()[:32]}"'
