"""A host's cache of store files: least recently used copies evicted under a small limit, a changed
file fetched again, one fetch for two takers of the same key at once; and a store unreachable for a
while: each operation waits, says so in words, and goes on when the store is back."""
from __future__ import annotations

import threading
import time

import pytest

from lanner.core.storage import Cache, StoreUnavailable
from lanner.core.storage.s3 import S3Store


def _store(moto_or_link, bucket, **options) -> S3Store:
    return S3Store(bucket, "team", moto_or_link.url, "us-east-1", "testing", "testing", **options)


def _put(store, tmp_path, key: str, data: bytes) -> None:
    path = tmp_path / "src" / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    store.put(key, path)


def test_least_recently_used_copies_go_first_under_a_small_limit(moto, bucket, tmp_path):
    store = _store(moto, bucket)
    for name in "abc":
        _put(store, tmp_path, f"datasets/{name}/rows.jsonl", name.encode() * 1000)
    folder = tmp_path / "checkpoint-1"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(b"w" * 900)
    (folder / "state.json").write_text("{}")
    store.put("artifacts/1/checkpoints/checkpoint-1", folder)
    cache = Cache(store, tmp_path / "cache", max_bytes=2500)

    a = cache.fetch("datasets/a/rows.jsonl")
    assert a.name == "rows.jsonl" and a.read_bytes() == b"a" * 1000
    time.sleep(0.02)  # last uses are told apart by mtime
    cache.fetch("datasets/b/rows.jsonl")
    time.sleep(0.02)
    cache.fetch("datasets/a/rows.jsonl")  # a is used again: b is now the least recently used
    time.sleep(0.02)
    cache.fetch("datasets/c/rows.jsonl")
    assert a.is_file() and not cache.entry("datasets/b/rows.jsonl").exists()
    assert sum(size for _, size, _ in cache.entries()) <= 2500

    checkpoint = cache.fetch("artifacts/1/checkpoints/checkpoint-1")  # a folder comes whole
    assert sorted(path.name for path in checkpoint.iterdir()) == ["state.json", "weights.bin"]
    assert [entry.name for _, _, entry in cache.entries()] == [cache.entry(key).name for key in
                                                                ("datasets/c/rows.jsonl",
                                                                 "artifacts/1/checkpoints/checkpoint-1")]

    _put(store, tmp_path, "datasets/c/rows.jsonl", b"new rows")  # changed in the store: fetched again
    assert cache.fetch("datasets/c/rows.jsonl").read_bytes() == b"new rows"


def test_two_takers_of_one_key_fetch_it_once(moto, bucket, tmp_path):
    store = _store(moto, bucket)
    _put(store, tmp_path, "datasets/1/rows.jsonl", b"x" * 5000)
    fetches = []

    class Counting(S3Store):  # the real store, counting its downloads
        def get(self, key, target):
            fetches.append(key)
            time.sleep(0.3)  # long enough for the other taker to arrive meanwhile
            super().get(key, target)

    counting = Counting(bucket, "team", moto.url, "us-east-1", "testing", "testing")
    paths = []
    takers = [threading.Thread(target=lambda: paths.append(Cache(counting, tmp_path / "cache", 10**6)
                                                           .fetch("datasets/1/rows.jsonl"))) for _ in range(2)]
    for taker in takers:
        taker.start()
    for taker in takers:
        taker.join()
    assert fetches == ["datasets/1/rows.jsonl"] and len(paths) == 2 and paths[0] == paths[1]
    assert paths[0].read_bytes() == b"x" * 5000


def test_an_unreachable_store_is_waited_for_in_words_and_nothing_is_lost(link, bucket, tmp_path):
    waits = []
    store = _store(link, bucket, retry_s=60, on_wait=waits.append)
    _put(store, tmp_path, "datasets/1/before.jsonl", b"kept")
    link.cut()
    restore = threading.Timer(3.0, link.restore)
    restore.start()
    started = time.monotonic()
    _put(store, tmp_path, "artifacts/1/checkpoints/checkpoint-2/weights.bin", b"w" * 100)  # waits for the link
    assert time.monotonic() - started >= 2.5
    assert waits and all(message.startswith("The store is unreachable while uploading artifacts/1/checkpoints/"
                                            "checkpoint-2/weights.bin") and "trying again in" in message
                         for message in waits)
    assert b"".join(store.read("datasets/1/before.jsonl")) == b"kept"
    assert b"".join(store.read("artifacts/1/checkpoints/checkpoint-2/weights.bin")) == b"w" * 100

    link.cut()
    short = _store(link, bucket, retry_s=2, on_wait=waits.append)
    with pytest.raises(StoreUnavailable, match="could not be reached for 2 s while looking up datasets/1/before"):
        short.is_file("datasets/1/before.jsonl")
