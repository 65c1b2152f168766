"""A host's local copies of store keys (LANNER_CACHE_DIR), for a store that is not this machine's data
directory: a job's dataset, the checkpoint it resumes from, the adapter an export reads, a file the
API serves. A folder is fetched whole. At most LANNER_CACHE_MAX_BYTES are kept: the least recently
used entries go first (the one just fetched always stays). One lock file per key makes two processes
that want the same key fetch it once; a copy whose store ETag changed is fetched again."""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from lanner.core.storage.base import Store, check_key

ENTRY_FILE = ".entry.json"  # in each entry's folder: its key, ETag and size; its mtime is the last use


class Cache:
    def __init__(self, store: Store, folder: Path, max_bytes: int):
        self.store, self.folder, self.max_bytes = store, Path(folder), max_bytes

    def entry(self, key: str) -> Path:
        return self.folder / hashlib.sha256(check_key(key).encode()).hexdigest()[:32]

    @contextmanager
    def _locked(self, entry: Path, wait: bool = True):
        """The entry's lock, held by one process at a time; without `wait`, yields False when taken."""
        locks = self.folder / ".locks"
        locks.mkdir(parents=True, exist_ok=True)
        with open(locks / entry.name, "a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def fetch(self, key: str) -> Path:
        """The key's file or folder on this machine, fetched unless the cached copy is current
        (FileNotFoundError when the store has nothing under the key)."""
        key = check_key(key)
        entry = self.entry(key)
        target = entry / PurePosixPath(key).name
        with self._locked(entry):
            etag = self.store.etag(key)
            record = entry / ENTRY_FILE
            if record.is_file() and target.exists() and json.loads(record.read_text()).get("etag") == etag:
                os.utime(record)
            else:
                partial = self.folder / f".partial-{entry.name}-{uuid.uuid4().hex[:8]}"
                try:
                    self.store.get(key, partial / target.name)
                    size = sum(path.stat().st_size for path in partial.rglob("*") if path.is_file())
                    (partial / ENTRY_FILE).write_text(json.dumps({"key": key, "etag": etag, "bytes": size}))
                    shutil.rmtree(entry, ignore_errors=True)
                    os.replace(partial, entry)
                finally:
                    shutil.rmtree(partial, ignore_errors=True)
        self.evict(keep=entry)
        return target

    def entries(self) -> list[tuple[float, int, Path]]:
        """(last use, bytes, folder) of every complete entry, least recently used first."""
        found = []
        for entry in self.folder.iterdir() if self.folder.is_dir() else ():
            record = entry / ENTRY_FILE
            try:
                found.append((record.stat().st_mtime, json.loads(record.read_text())["bytes"], entry))
            except (OSError, ValueError, KeyError):
                continue  # a lock folder, a fetch under way, an entry being replaced
        return sorted(found)

    def evict(self, keep: Path | None = None) -> list[Path]:
        """Removes least recently used entries (not `keep`, none another process holds) until the cache
        is within its limit; returns those removed."""
        entries = self.entries()
        total = sum(size for _, size, _ in entries)
        removed = []
        for _, size, entry in entries:
            if total <= self.max_bytes:
                break
            if entry == keep:
                continue
            with self._locked(entry, wait=False) as held:
                if held:
                    shutil.rmtree(entry, ignore_errors=True)
                    removed.append(entry)
                    total -= size
        return removed
