"""The data directory as the store (the default, one box): a key is the file or folder at that path
under LANNER_DATA_DIR, so nothing is ever copied. A symlink is neither listed nor followed out of it."""
from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from lanner.core.storage.base import CHUNK, BadKey, Store, check_key


class LocalStore(Store):
    def __init__(self, root: Path):
        self.root = Path(root).resolve()

    def path(self, key: str) -> Path:
        """The key's place in the data dir; BadKey when it (a symlink on its way) leads outside."""
        path = self.root / check_key(key)
        if not path.resolve().is_relative_to(self.root):
            raise BadKey(f"The store key {key!r} leads outside the data directory")
        return path

    def put(self, key: str, source: Path, move: bool = False) -> None:
        target = self.path(key)
        if Path(source).resolve() == target.resolve():
            return  # written in place: the usual case on one box
        target.parent.mkdir(parents=True, exist_ok=True)
        self.delete(key)
        if move:
            os.replace(source, target)
        elif Path(source).is_dir():
            shutil.copytree(source, target, symlinks=True)
        else:
            shutil.copy2(source, target)

    def get(self, key: str, target: Path) -> None:
        source = self.path(key)
        if self.is_file(key):
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
            return
        files = self.list(key)
        if not files:
            raise FileNotFoundError(f"Nothing is stored under {key!r}")
        for name in files:
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / name, target / name)

    def read(self, key: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        return self._chunks(self.path(key), start, end)  # the key is checked now, not at the first chunk

    @staticmethod
    def _chunks(path: Path, start: int, end: int | None) -> Iterator[bytes]:
        with open(path, "rb") as handle:
            handle.seek(start)
            left = None if end is None else end - start + 1
            while left is None or left > 0:
                chunk = handle.read(CHUNK if left is None else min(CHUNK, left))
                if not chunk:
                    return
                if left is not None:
                    left -= len(chunk)
                yield chunk

    def is_file(self, key: str) -> bool:
        path = self.path(key)
        return path.is_file() and not path.is_symlink()

    def list(self, key: str) -> list[str]:
        folder = self.path(key)
        found = []
        for root, _, names in os.walk(folder):  # followlinks=False
            for name in names:
                path = Path(root, name)
                if path.is_file() and not path.is_symlink():
                    found.append(path.relative_to(folder).as_posix())
        return sorted(found)

    def size(self, key: str) -> int:
        if self.is_file(key):
            return self.path(key).stat().st_size
        files = self.list(key)
        if not files:
            raise FileNotFoundError(f"Nothing is stored under {key!r}")
        folder = self.path(key)
        return sum((folder / name).stat().st_size for name in files)

    def file_etag(self, key: str) -> str:
        status = self.path(key).stat()
        return f'"{status.st_mtime_ns:x}-{status.st_size:x}"'

    def delete(self, key: str) -> None:
        path = self.path(key)
        if path.is_symlink() or path.is_file():
            path.unlink(missing_ok=True)
        elif path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
