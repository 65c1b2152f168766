"""Where a local model may be read from: only folders an admin allows (LANNER_LOCAL_MODEL_DIRS,
default DATA_DIR/models), checked after resolving '..' and symlinks, so a member can neither load
nor probe any other directory of the server (an answer that differs for /root and /nonexistent
would tell what exists)."""
from __future__ import annotations

import json
from pathlib import Path

from lanner.core.settings import Settings

# In a model folder the studio downloaded from the hub: the repository and the commit it holds.
HUB_SOURCE_FILE = "lanner-hub-source.json"

NOT_ALLOWED = ("a local model must be a folder inside the folders an admin allows for models "
               "(LANNER_LOCAL_MODEL_DIRS; by default the data dir's models folder)")


def _within(path: Path, folders: list[Path]) -> bool:
    return any(path == folder or path.is_relative_to(folder) for folder in folders)


def allowed_model_folder(model: str, settings: Settings) -> Path | None:
    """The resolved folder of a local model: an absolute path inside an allowed folder, or a name
    relative to DATA_DIR/models that stays inside it (a downloaded hub model); None for anything else.
    Whether the folder exists is the caller's question, asked only of allowed paths."""
    try:
        if model.startswith("/"):
            resolved = Path(model).resolve()
            return resolved if _within(resolved, settings.allowed_model_dirs) else None
        models_dir = settings.models_dir.resolve()
        resolved = (models_dir / model).resolve()
        return resolved if resolved != models_dir and resolved.is_relative_to(models_dir) else None
    except (OSError, ValueError):  # a name no file system takes, or a NUL: no folder of ours
        return None


def write_hub_source(folder: Path, repo_id: str, commit: str) -> None:
    (folder / HUB_SOURCE_FILE).write_text(json.dumps({"repo_id": repo_id, "commit": commit}) + "\n")


def hub_commit(folder: Path | str, repo_id: str) -> str | None:
    """The hub commit a model folder holds when the studio downloaded it from repo_id; else None."""
    try:
        record = json.loads((Path(folder) / HUB_SOURCE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return record.get("commit") if isinstance(record, dict) and record.get("repo_id") == repo_id else None
