"""The Store contract, the same on both backends: the data directory and an S3-compatible server
(moto): put and get of files and folders, byte ranges, listing, sizes, ETags, deletion, bad keys."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from lanner.core.storage import BadKey, LocalStore, check_key
from lanner.core.storage.s3 import PART_BYTES, S3Store

from storage_helpers import ACCESS


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return LocalStore(tmp_path / "data")
    moto, bucket = request.getfixturevalue("moto"), request.getfixturevalue("bucket")
    return S3Store(bucket, "team/", moto.url, ACCESS["LANNER_S3_REGION"], "testing", "testing", retry_s=5)


def test_files_and_folders_go_in_come_out_and_go_away(store, tmp_path):
    source = tmp_path / "in.bin"
    source.write_bytes(bytes(range(256)) * 40)  # 10240 bytes
    store.put("datasets/1/rows.jsonl", source)
    assert source.exists() and store.is_file("datasets/1/rows.jsonl") and not store.is_folder("datasets/1/rows.jsonl")
    assert store.size("datasets/1/rows.jsonl") == 10240
    assert b"".join(store.read("datasets/1/rows.jsonl", 100, 355)) == bytes(range(100, 256)) + bytes(range(100))
    assert b"".join(store.read("datasets/1/rows.jsonl", 10000)) == (bytes(range(256)) * 40)[10000:]
    store.get("datasets/1/rows.jsonl", tmp_path / "out" / "rows.jsonl")
    assert (tmp_path / "out" / "rows.jsonl").read_bytes() == source.read_bytes()

    folder = tmp_path / "checkpoint-2"
    (folder / "nested").mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"w" * 3000)
    (folder / "nested" / "state.json").write_text("{}")
    store.put("artifacts/7/checkpoints/checkpoint-2", folder)
    key = "artifacts/7/checkpoints/checkpoint-2"
    assert store.is_folder(key) and store.exists(key) and not store.is_file(key)
    assert store.list(key) == ["model.safetensors", "nested/state.json"]
    assert store.list("artifacts/7") == ["checkpoints/checkpoint-2/model.safetensors",
                                         "checkpoints/checkpoint-2/nested/state.json"]
    assert store.size(key) == 3002
    before = store.etag(key)
    (folder / "nested" / "state.json").write_text('{"step": 2}')
    store.put(key, folder)
    assert store.etag(key) != before  # a changed file changes the folder's ETag
    (folder / "model.safetensors").unlink()
    store.put(key, folder)
    assert store.list(key) == ["nested/state.json"]  # a file gone from the folder is gone from the store
    store.get(key, tmp_path / "copy")
    assert (tmp_path / "copy" / "nested" / "state.json").read_text() == '{"step": 2}'

    store.delete("artifacts/7")
    assert not store.exists(key) and store.list("artifacts/7") == []
    store.delete("artifacts/7")  # deleting what is not there is no error
    with pytest.raises(FileNotFoundError):
        store.etag(key)
    with pytest.raises(FileNotFoundError):
        store.get(key, tmp_path / "nothing")


def test_a_moved_upload_is_consumed(store, tmp_path):
    received = tmp_path / "incoming.jsonl"
    received.write_text('{"text": "hi"}\n')
    store.put("datasets/2/a.jsonl", received, move=True)
    assert not received.exists() and b"".join(store.read("datasets/2/a.jsonl")) == b'{"text": "hi"}\n'


@pytest.mark.parametrize("key", ["", "/", "../etc/passwd", "/etc/passwd", "datasets/../../x", "a/./b", "a//b", "a\\b"])
def test_bad_keys_are_refused_in_words(store, key):
    with pytest.raises(BadKey, match="key"):
        store.exists(key)
    with pytest.raises(BadKey):
        check_key(key)


def test_a_symlink_out_of_the_data_dir_is_no_key(tmp_path):
    store = LocalStore(tmp_path / "data")
    (tmp_path / "data" / "artifacts").mkdir(parents=True)
    (tmp_path / "secret").write_text("no")
    os.symlink(tmp_path / "secret", tmp_path / "data" / "artifacts" / "link")
    with pytest.raises(BadKey, match="outside the data directory"):
        store.read("artifacts/link")


def test_a_large_file_goes_up_in_64_mib_parts(moto, bucket, tmp_path):
    store = S3Store(bucket, "", moto.url, "us-east-1", "testing", "testing", retry_s=5)
    big = tmp_path / "model.gguf"
    with open(big, "wb") as out:
        out.truncate(PART_BYTES + 1024)
        out.seek(PART_BYTES)
        out.write(b"tail")
    store.put("artifacts/9/export/model.gguf", big)
    head = store.client.head_object(Bucket=bucket, Key="artifacts/9/export/model.gguf")
    assert head["ETag"].strip('"').endswith("-2")  # a multipart object's ETag counts its parts
    assert b"".join(store.read("artifacts/9/export/model.gguf", PART_BYTES, PART_BYTES + 3)) == b"tail"


def test_reading_what_is_not_there_is_file_not_found(store):
    with pytest.raises(FileNotFoundError):
        b"".join(store.read("datasets/404/gone.jsonl"))


def test_wrong_store_settings_are_said_in_words_at_once(moto):
    from lanner.core.storage import StoreUnavailable

    store = S3Store("no-such-bucket", "", moto.url, "us-east-1", "testing", "testing", retry_s=60)
    with pytest.raises(StoreUnavailable, match="bucket 'no-such-bucket'.* refused listing datasets/1: the bucket "
                                               "LANNER_S3_BUCKET names does not exist there"):
        store.list("datasets/1")
    with pytest.raises(StoreUnavailable, match="refused uploading datasets/1/a.jsonl: the bucket"):
        store.put("datasets/1/a.jsonl", Path(__file__))  # boto3's transfer wraps the client's error


def test_the_s3_store_needs_a_bucket_and_the_cache_defaults_into_the_data_dir(tmp_path):
    from pydantic import ValidationError

    from lanner.core.settings import Settings

    with pytest.raises(ValidationError, match="LANNER_STORE=s3 needs LANNER_S3_BUCKET"):
        Settings(data_dir=tmp_path, store="s3")
    assert Settings(data_dir=tmp_path).cache_dir == tmp_path.resolve() / "cache"
