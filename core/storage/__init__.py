"""Where datasets, checkpoints and artifacts live (docs/storage.md): get_store(settings) gives the
configured Store, local_copy(settings, key) the key's file or folder on this machine."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from lanner.core.settings import Settings
from lanner.core.storage.base import BadKey, Store, StoreUnavailable, check_key
from lanner.core.storage.cache import Cache
from lanner.core.storage.local import LocalStore
from lanner.core.storage.retry import log_wait

__all__ = ["BadKey", "Cache", "LocalStore", "Store", "StoreUnavailable", "check_key", "get_store", "local_copy"]


def get_store(settings: Settings, on_wait: Callable[[str], None] = log_wait) -> Store:
    """The store the settings name; `on_wait` hears each wait for an unreachable store."""
    if settings.store == "local":
        return LocalStore(settings.data_dir)
    from lanner.core.storage.s3 import S3Store

    return S3Store(settings.s3_bucket, settings.s3_prefix, settings.s3_endpoint_url, settings.s3_region,
                   settings.s3_access_key_id, settings.s3_secret_access_key, settings.store_retry_s, on_wait)


def local_copy(settings: Settings, key: str, on_wait: Callable[[str], None] = log_wait) -> Path:
    """The key's file or folder on this machine: the data dir's own (local store), else its copy in the
    cache, fetched when missing or stale. FileNotFoundError when the store has nothing under the key."""
    store = get_store(settings, on_wait)
    if isinstance(store, LocalStore):
        path = store.path(key)
        if not path.exists():
            raise FileNotFoundError(f"Nothing is stored under {key!r}")
        return path
    return Cache(store, settings.cache_dir, settings.cache_max_bytes).fetch(key)
