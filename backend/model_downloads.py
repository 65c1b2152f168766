"""Downloads of hub models into DATA_DIR/models/<org>/<name>, where jobs, the catalog, memory
estimates and dataset previews already look for a hub id before asking the hub.

A download runs in a thread of the API process: it needs no GPU and should not wait behind
training jobs in the queue. Files go to DATA_DIR/downloads/<org>--<name>/ first and the folder is
renamed into place only when every file is whole, so a half-downloaded model is never used. A
download that fails or is cut short (a dropped connection, an API restart) keeps its partial files;
asking again continues them with HTTP ranges. Its state lives in Redis (one hash per repo); a lock
with a short expiry, renewed while the thread runs, keeps two API processes from downloading the
same repo and tells a live download from an interrupted one."""
from __future__ import annotations

import errno
import logging
import os
import shutil
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from redis import Redis

from lanner.backend.disk_space import check_room
from lanner.backend.hub import REFUSED, Hub, HubOffline, RepoInfo
from lanner.backend.paths import inside
from lanner.core.errors import UserError
from lanner.core.model_paths import write_hub_source
from lanner.core.settings import Settings

log = logging.getLogger(__name__)
STATE = "lanner:model-download:"
LOCK = "lanner:model-download-lock:"
INDEX = "lanner:model-downloads"
LOCK_SECONDS = 30
RENEW_SECONDS = 5
CONFIG_FILES = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json", "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
                "chat_template.jinja", "chat_template.json"}


class NotTrainable(Exception):
    """The repo has no config.json or no weights in a format the trainer loads."""


def model_dir(settings: Settings, repo_id: str) -> Path:
    return settings.models_dir / repo_id


def staging_dir(settings: Settings, repo_id: str) -> Path:
    return settings.data_dir / "downloads" / repo_id.replace("/", "--")


def is_downloaded(settings: Settings, repo_id: str) -> bool:
    return (model_dir(settings, repo_id) / "config.json").is_file()


def files_to_fetch(info: RepoInfo) -> list:
    """config, tokenizer and safetensors weights (else PyTorch .bin weights) from the repo's top
    folder; other formats (GGUF, ONNX, original/ checkpoints) are not what the trainer loads."""
    top = [item for item in info.files
           if "/" not in item.name and not item.name.startswith(".") and 0 < len(item.name) <= 255]
    names = {item.name for item in top}
    if "config.json" not in names:
        raise NotTrainable(f"{info.repo_id} has no config.json: not a transformers checkpoint")
    weights = [item for item in top if item.name.endswith(".safetensors") or item.name == "model.safetensors.index.json"]
    if not any(item.name.endswith(".safetensors") for item in weights):
        weights = [item for item in top if item.name.startswith("pytorch_model") and
                   (item.name.endswith(".bin") or item.name.endswith(".bin.index.json"))]
    if not weights:
        raise NotTrainable(f"{info.repo_id} has no safetensors or PyTorch weights")
    return [item for item in top if item.name in CONFIG_FILES] + weights


def state(redis: Redis, repo_id: str) -> dict | None:
    with redis.pipeline() as pipe:  # one transaction: a download that ends in between is not "interrupted"
        found, locked = pipe.hgetall(STATE + repo_id).exists(LOCK + repo_id).execute()
    if not found:
        return None
    found = {key.decode() if isinstance(key, bytes) else key: value.decode() if isinstance(value, bytes) else value
             for key, value in found.items()}
    if found.get("status") == "downloading" and not locked:
        found["status"] = "interrupted"  # its process stopped; asking again continues it
    return found


def all_states(redis: Redis) -> list[dict]:
    repos = sorted(value.decode() if isinstance(value, bytes) else value for value in redis.smembers(INDEX))
    return [found for repo in repos if (found := state(redis, repo)) is not None]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


def start(redis: Redis, settings: Settings, hub: Hub, repo_id: str, revision: str, user_id: int) -> dict:
    """Starts (or continues) a download and returns its state. Raises HubOffline, the hub's
    refusal (UserError), NotTrainable, NoRoom."""
    current = state(redis, repo_id)
    if current is not None and current["status"] == "downloading":
        return current
    info = hub.repo_info(repo_id, revision)
    if info.gated and not hub.token:
        raise UserError(403, f"{repo_id} is gated: request access on the hub, then set LANNER_HUB_TOKEN",
                        code=REFUSED)
    files = files_to_fetch(info)
    staging = staging_dir(settings, repo_id)
    have = _bytes_in(staging, files)
    total = sum(item.size or 0 for item in files)
    check_room(settings.data_dir, max(total - have, 0), settings.min_free_bytes)
    if not redis.set(LOCK + repo_id, str(user_id), nx=True, ex=LOCK_SECONDS):
        return state(redis, repo_id) or {"repo_id": repo_id, "status": "downloading"}
    fresh = {"repo_id": repo_id, "revision": revision, "commit": info.commit, "status": "downloading",
             "files_total": len(files), "files_done": 0, "bytes_total": total, "bytes_done": have, "file": "",
             "error": "", "started_by": user_id, "started_at": _now(), "finished_at": "", "path": ""}
    with redis.pipeline() as pipe:
        pipe.delete(STATE + repo_id).hset(STATE + repo_id, mapping=fresh).sadd(INDEX, repo_id).execute()
    thread = threading.Thread(target=_run, args=(redis, settings, hub, info, files), daemon=True,
                              name=f"download {repo_id}")
    thread.start()
    return state(redis, repo_id)


def _run(redis: Redis, settings: Settings, hub: Hub, info: RepoInfo, files: list) -> None:
    key, lock = STATE + info.repo_id, LOCK + info.repo_id
    staging = staging_dir(settings, info.repo_id)
    running = threading.Event()
    running.set()

    def keep_lock() -> None:  # apart from the bytes: a slow hub or a busy machine must not look like a stop
        while running.is_set():
            time.sleep(RENEW_SECONDS)
            if running.is_set():
                redis.expire(lock, LOCK_SECONDS)

    def progress(written: int) -> None:
        redis.hincrby(key, "bytes_done", written)

    threading.Thread(target=keep_lock, daemon=True, name=f"lock {info.repo_id}").start()
    try:
        for done, item in enumerate(files):
            if not inside(staging, item.name):
                raise NotTrainable(f"the hub named a file outside the model folder: {item.name!r}")
            target = staging / item.name
            target.parent.mkdir(parents=True, exist_ok=True)
            redis.hset(key, mapping={"file": item.name, "files_done": done})
            if item.size is None or not target.is_file() or target.stat().st_size != item.size:
                hub.download(info.repo_id, info.commit, item.name, target, progress)
            size = target.stat().st_size
            if item.size is not None and size != item.size:
                target.unlink()
                raise HubOffline(f"{item.name} arrived with {size} bytes where the hub lists {item.size}; "
                                 "it will be fetched again")
            redis.hset(key, "bytes_done", _bytes_in(staging, files))  # exact again, whatever a resume re-sent
        write_hub_source(staging, info.repo_id, info.commit)  # an export names the base at this commit
        final = model_dir(settings, info.repo_id)
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.exists():
            shutil.rmtree(final)  # an older or broken copy: the new one replaces it whole
        os.replace(staging, final)
        outcome = {"status": "done", "files_done": len(files), "file": "", "path": str(final)}
        log.info("downloaded %s (%s) into %s", info.repo_id, info.commit, final)
    except Exception as exc:
        outcome = {"status": "failed", "error": _failure_message(exc)}
        log.warning("download of %s failed: %s", info.repo_id, outcome["error"])
    running.clear()
    # The outcome and the lock's release in one transaction: whoever sees it finished may start again.
    with redis.pipeline() as pipe:
        pipe.hset(key, mapping={**outcome, "finished_at": _now()}).delete(lock).execute()


def _bytes_in(staging: Path, files: list) -> int:
    return sum((staging / item.name).stat().st_size for item in files if (staging / item.name).is_file())


def _failure_message(exc: Exception) -> str:
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return "the disk is full: free some space, then ask again to continue the download"
    if isinstance(exc, HubOffline):
        return f"offline: {exc}; ask again to continue where it stopped"
    if isinstance(exc, UserError):
        return f"the hub refused ({exc.status}): {exc}" + (
            "; a gated or private model needs LANNER_HUB_TOKEN with access" if exc.status in (401, 403) else "")
    if isinstance(exc, NotTrainable):
        return str(exc)
    return f"{exc.__class__.__name__}: {exc}"
