"""An S3-compatible object store as the store (several hosts): the bucket's objects under a prefix,
named by their keys. Files go up in 64 MiB parts (multipart) and come down streamed; a folder is the
objects under "<key>/". Every call is retried while the store is unreachable (lanner.core.storage.retry)."""
from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from functools import lru_cache
from pathlib import Path

import boto3
from boto3.exceptions import S3UploadFailedError
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import (ClientError, ConnectionClosedError, ConnectTimeoutError, EndpointConnectionError,
                                 NoCredentialsError, ReadTimeoutError)

from lanner.core.storage.base import CHUNK, Store, StoreUnavailable, check_key
from lanner.core.storage.retry import log_wait, with_retry

PART_BYTES = 64 * 1024**2
TRANSFER = TransferConfig(multipart_threshold=PART_BYTES, multipart_chunksize=PART_BYTES, max_concurrency=4)
UNREACHABLE = (EndpointConnectionError, ConnectionClosedError, ConnectTimeoutError, ReadTimeoutError, ConnectionError)
BUSY_CODES = {"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "503", "500"}
DELETE_BATCH = 1000
# Answers that waiting will not change: the studio's store settings are wrong.
REFUSALS = {"NoSuchBucket": "the bucket LANNER_S3_BUCKET names does not exist there",
            "AccessDenied": "its credentials may not do this",
            "InvalidAccessKeyId": "it does not know LANNER_S3_ACCESS_KEY_ID",
            "SignatureDoesNotMatch": "LANNER_S3_SECRET_ACCESS_KEY is not that key's secret"}


def _causes(error: BaseException | None):
    """The error and those it was raised from: boto3's transfers wrap what the client raised."""
    while error is not None:
        yield error
        error = error.__cause__ or error.__context__


def transient(error: BaseException) -> bool:
    """Whether the failure is the store being away or overloaded (worth waiting for)."""
    return any(isinstance(cause, UNREACHABLE)
               or isinstance(cause, ClientError) and (cause.response.get("Error", {}).get("Code") in BUSY_CODES
                                                      or cause.response.get("ResponseMetadata", {})
                                                      .get("HTTPStatusCode", 0) >= 500)
               for cause in _causes(error))


@lru_cache(maxsize=8)
def _client(endpoint_url: str, region: str, access_key_id: str, secret_access_key: str):
    """One client per store (thread-safe, and slow to make). boto's own retries are few and quick: the
    long wait for a store that is away is with_retry's."""
    return boto3.client(
        "s3", endpoint_url=endpoint_url or None, region_name=region or None,
        aws_access_key_id=access_key_id or None, aws_secret_access_key=secret_access_key or None,
        config=Config(retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=5, read_timeout=60,
                      s3={"addressing_style": "path"}))


def _missing(error: ClientError) -> bool:
    return error.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound")


class S3Store(Store):
    def __init__(self, bucket: str, prefix: str = "", endpoint_url: str = "", region: str = "",
                 access_key_id: str = "", secret_access_key: str = "", retry_s: float = 900.0,
                 on_wait: Callable[[str], None] = log_wait):
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.retry_s, self.on_wait = retry_s, on_wait
        self.client = _client(endpoint_url, region, access_key_id, secret_access_key)

    def _name(self, key: str) -> str:
        return self.prefix + check_key(key)

    def _retry(self, what: str, action):
        try:
            return with_retry(action, what, self.retry_s, transient, self.on_wait)
        except (ClientError, NoCredentialsError, S3UploadFailedError) as error:
            causes = list(_causes(error))
            if any(isinstance(cause, NoCredentialsError) for cause in causes):
                raise StoreUnavailable(f"The S3 store has no credentials for {what}: set LANNER_S3_ACCESS_KEY_ID "
                                       "and LANNER_S3_SECRET_ACCESS_KEY (or boto3's own AWS_* variables)") from None
            for cause in causes:
                code = cause.response.get("Error", {}).get("Code") if isinstance(cause, ClientError) else None
                if code in REFUSALS:
                    raise StoreUnavailable(f"The S3 store (bucket {self.bucket!r}) refused {what}: "
                                           f"{REFUSALS[code]} ({code})") from None
            raise

    def _objects(self, key: str) -> dict[str, dict]:
        """The folder's objects: relative name -> {"Size", "ETag"}."""
        folder = self._name(key) + "/"

        def listing():
            found = {}
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=folder):
                for item in page.get("Contents", []):
                    found[item["Key"][len(folder):]] = {"Size": item["Size"], "ETag": item["ETag"]}
            return found
        return self._retry(f"listing {key}", listing)

    def _head(self, key: str) -> dict | None:
        def head():
            try:
                return self.client.head_object(Bucket=self.bucket, Key=self._name(key))
            except ClientError as error:
                if _missing(error):
                    return None
                raise
        return self._retry(f"looking up {key}", head)

    def put(self, key: str, source: Path, move: bool = False) -> None:
        source = Path(source)
        if source.is_dir():
            files = sorted(path.relative_to(source).as_posix() for path in source.rglob("*")
                           if path.is_file() and not path.is_symlink())
            for name in files:
                self._upload(f"{check_key(key)}/{name}", source / name)
            stale = [name for name in self._objects(key) if name not in set(files)]
            self._delete_names([f"{self._name(key)}/{name}" for name in stale])
            if self._head(key) is not None:  # a file of the same name, replaced by the folder
                self._delete_names([self._name(key)])
        else:
            self._upload(key, source)
        if move:
            shutil.rmtree(source) if source.is_dir() else source.unlink()

    def _upload(self, key: str, path: Path) -> None:
        self._retry(f"uploading {key}", lambda: self.client.upload_file(str(path), self.bucket, self._name(key),
                                                                        Config=TRANSFER))

    def get(self, key: str, target: Path) -> None:
        if self.is_file(key):
            self._download(key, Path(target))
            return
        files = self._objects(key)
        if not files:
            raise FileNotFoundError(f"Nothing is stored under {key!r}")
        for name in files:
            self._download(f"{check_key(key)}/{name}", Path(target) / name)

    def _download(self, key: str, target: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.partial")
        try:
            self._retry(f"downloading {key}", lambda: self.client.download_file(self.bucket, self._name(key),
                                                                                str(partial), Config=TRANSFER))
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)

    def read(self, key: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        span, name = f"bytes={start}-{'' if end is None else end}", self._name(key)
        def get_object():
            try:
                return self.client.get_object(Bucket=self.bucket, Key=name, Range=span)
            except ClientError as error:
                if _missing(error):
                    raise FileNotFoundError(f"Nothing is stored under {key!r}") from None
                raise
        response = self._retry(f"reading {key}", get_object)
        return response["Body"].iter_chunks(CHUNK)

    def is_file(self, key: str) -> bool:
        return self._head(key) is not None

    def list(self, key: str) -> list[str]:
        return sorted(self._objects(key))

    def _file_or_folder(self, key: str) -> tuple[dict | None, dict[str, dict]]:
        """(the file's head, {}) or (None, the folder's objects); FileNotFoundError when neither."""
        head = self._head(key)
        files = {} if head is not None else self._objects(key)
        if head is None and not files:
            raise FileNotFoundError(f"Nothing is stored under {key!r}")
        return head, files

    def size(self, key: str) -> int:
        head, files = self._file_or_folder(key)
        return head["ContentLength"] if head else sum(item["Size"] for item in files.values())

    def file_etag(self, key: str) -> str:
        head = self._head(key)
        if head is None:
            raise FileNotFoundError(f"Nothing is stored under {key!r}")
        return head["ETag"]

    def etag(self, key: str) -> str:
        """One request, not one per file: the listing carries each object's ETag."""
        head, files = self._file_or_folder(key)
        if head:
            return head["ETag"]
        listing = "".join(f"{name}\0{item['ETag']}\0" for name, item in sorted(files.items()))
        return f'"{hashlib.sha256(listing.encode()).hexdigest()[:32]}"'

    def delete(self, key: str) -> None:
        names = [f"{self._name(key)}/{name}" for name in self._objects(key)]
        self._delete_names(names + [self._name(key)])

    def _delete_names(self, names: list[str]) -> None:
        for start in range(0, len(names), DELETE_BATCH):
            batch = [{"Key": name} for name in names[start:start + DELETE_BATCH]]
            self._retry("deleting", lambda batch=batch: self.client.delete_objects(
                Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True}))
