"""Loaded models under a memory bound, shared by every chat of the API process.

A model is loaded once however many people chat with it at the same moment (a lock per model
serialises the loading; the others wait and then share it). Each loaded model has a small pool of
llama.cpp contexts on its one copy of the weights (`contexts_per_model`): an answer takes an idle
context, or a new one while the pool is below its size and the memory bound has room for its KV
cache, or else waits for the next context freed. So several people stream from one model at once.
Idle models are evicted least recently used first when a new one needs room; a model someone is
using is never evicted, so when the room is held by models in use the new one is refused (a UserError
with the code NOT_ENOUGH_MEMORY) instead of waiting unboundedly. Every method blocks (loading takes seconds): call
them off the event loop."""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lanner.core.errors import UserError


NOT_ENOUGH_MEMORY = "not_enough_memory"  # the model does not fit in the playground's memory bound


@dataclass(eq=False)
class CachedModel:
    path: Path
    model: Any = None  # the first context, which owns the weights
    size: int = 0      # the weights and every context's KV cache and buffers
    users: int = 0
    load_lock: threading.Lock = field(default_factory=threading.Lock)
    contexts: list = field(default_factory=list)  # every context of the model, the first included
    idle: list = field(default_factory=list)      # the contexts no answer is using
    # llama.cpp's context is not thread-safe: one answer at a time per context.
    available: threading.Condition = field(default_factory=threading.Condition)


def _gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB"


class ModelCache:
    def __init__(self, capacity_bytes: int, load: Callable[[Path], Any], estimate: Callable[[Path], int],
                 unload: Callable[[Any], None] = lambda model: model.close(), *,
                 add_context: Callable[[Any], Any] | None = None, context_bytes: Callable[[Path], int] | None = None,
                 contexts_per_model: int = 1):
        self.capacity_bytes = capacity_bytes
        self._load, self._estimate, self._unload = load, estimate, unload
        self._add_context, self._context_bytes = add_context, context_bytes
        self.contexts_per_model = contexts_per_model if add_context and context_bytes else 1
        self._entries: OrderedDict[Path, CachedModel] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()
        self.loads = 0  # how many times a model file was loaded (a test and an operator's counter)

    @contextmanager
    def use(self, path: Path) -> Iterator[CachedModel]:
        """The loaded model of `path`, held (not evictable) until the block ends."""
        entry = self._acquire(Path(path))
        try:
            yield entry
        finally:
            with self._lock:
                entry.users -= 1

    @contextmanager
    def context(self, entry: CachedModel, waiting: Callable[[], None] = lambda: None,
                stopped: Callable[[], bool] = lambda: False) -> Iterator[Any]:
        """A context of a held model for one answer: an idle one, a new one when the pool may grow,
        else the next one freed (`waiting` is called once; None when `stopped` turns true first)."""
        llama = self._take(entry, waiting, stopped)
        try:
            yield llama
        finally:
            if llama is not None:
                with entry.available:
                    entry.idle.append(llama)
                    entry.available.notify()

    def loaded(self) -> list[Path]:
        """Paths of the loaded models, least recently used first."""
        with self._lock:
            return [path for path, entry in self._entries.items() if entry.model is not None]

    def contexts(self, path: Path) -> int:
        """How many llama.cpp contexts the loaded model of `path` has (0 when it is not loaded)."""
        with self._lock:
            entry = self._entries.get(Path(path))
            return len(entry.contexts) if entry is not None else 0

    def used_bytes(self) -> int:
        with self._lock:
            return sum(entry.size for entry in self._entries.values())

    def clear(self) -> None:
        """Unloads every idle model."""
        with self._lock:
            idle = [entry for entry in self._entries.values() if entry.users == 0 and entry.model is not None]
            for entry in idle:
                del self._entries[entry.path]
        for entry in idle:
            self._release(entry)

    def _release(self, entry: CachedModel) -> None:
        for llama in reversed(entry.contexts):  # the first context, which owns the weights, goes last
            self._unload(llama)

    def _acquire(self, path: Path) -> CachedModel:
        with self._lock:
            entry = self._entries.setdefault(path, CachedModel(path))
            entry.users += 1
            self._entries.move_to_end(path)
        try:
            with entry.load_lock:
                if entry.model is None:
                    self._load_into(entry)
        except BaseException:
            with self._lock:
                entry.users -= 1
                if entry.model is None and entry.users == 0 and self._entries.get(path) is entry:
                    del self._entries[path]
            raise
        return entry

    def _load_into(self, entry: CachedModel) -> None:
        size = self._estimate(entry.path)
        with self._lock:
            evicted = self._make_room(size, entry)
            entry.size = size  # reserved while loading, so parallel loads of other models count it
        for other in evicted:
            self._release(other)
        try:
            entry.model = self._load(entry.path)
        except BaseException:
            entry.size = 0
            raise
        with entry.available:
            entry.contexts, entry.idle = [entry.model], [entry.model]
        with self._lock:
            self.loads += 1

    def _take(self, entry: CachedModel, waiting: Callable[[], None], stopped: Callable[[], bool]) -> Any:
        with entry.available:
            if entry.idle:
                return entry.idle.pop()
            if len(entry.contexts) < self.contexts_per_model:
                extra = self._context_bytes(entry.path)
                with self._lock:
                    try:
                        evicted = self._make_room(extra, entry)
                    except UserError:  # _make_room's refusal
                        evicted = None  # no room for another KV cache: wait for a context instead
                    else:
                        entry.size += extra
                if evicted is not None:
                    for other in evicted:
                        self._release(other)
                    try:
                        llama = self._add_context(entry.model)
                    except BaseException:
                        with self._lock:
                            entry.size -= extra
                        raise
                    entry.contexts.append(llama)
                    return llama
        waiting()
        with entry.available:
            while not entry.idle:
                if stopped():
                    return None
                entry.available.wait(0.2)
            return entry.idle.pop()

    def _make_room(self, size: int, keep: CachedModel) -> list[CachedModel]:
        """Evicts idle models, least recently used first, until `size` fits; the caller holds _lock."""
        if size > self.capacity_bytes:
            raise UserError(
                507, f"Not enough memory: this model needs about {_gib(size)} and the playground may use "
                     f"{_gib(self.capacity_bytes)} (LANNER_PLAYGROUND_CACHE_BYTES). Use a smaller GGUF (q8_0 or a "
                     f"q4 type) or ask an admin to raise the limit.", code=NOT_ENOUGH_MEMORY)
        used = sum(entry.size for entry in self._entries.values())
        evicted = []
        for entry in self._entries.values():
            if used + size <= self.capacity_bytes:
                break
            if entry is not keep and entry.users == 0 and entry.model is not None:
                used -= entry.size
                evicted.append(entry)
        if used + size <= self.capacity_bytes:
            for entry in evicted:
                del self._entries[entry.path]
        else:
            busy = sum(1 for entry in self._entries.values() if entry.users and entry is not keep)
            raise UserError(
                503, f"Not enough memory right now: {busy} other model(s) are answering other people and fill "
                     f"the playground's {_gib(self.capacity_bytes)}. Try again when they are done.",
                code=NOT_ENOUGH_MEMORY)
        return evicted
