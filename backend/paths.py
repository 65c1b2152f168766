"""Paths a request may touch: always inside the data dir, after resolving '..' and symlinks."""
from __future__ import annotations

import re
from pathlib import Path

SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")
SAFE_NAME_LENGTH = 200
# The longest file name (bytes) Linux file systems hold; a longer one makes stat fail, not answer "no".
NAME_MAX = 255


def inside(root: Path, candidate: Path | str) -> bool:
    if any(len(part.encode("utf-8", "surrogateescape")) > NAME_MAX for part in Path(candidate).parts):
        return False
    root = Path(root).resolve()
    resolved = (root / candidate).resolve()
    return resolved != root and resolved.is_relative_to(root)


def safe_filename(name: str, default: str = "file") -> str:
    """A file name with no directories, no leading dots and only plain characters."""
    base = Path(SAFE_NAME.sub("_", Path(name.replace("\\", "/")).name))
    suffix = base.suffix if len(base.suffix) <= 16 else ""  # a long name keeps its extension, which says its format
    # the stem loses its leading dots and underscores; one of only those (a name in another script,
    # "数据.jsonl", becomes "_.jsonl") is the default stem, keeping the extension
    stem = (base.stem if suffix else base.name).lstrip("._")
    if not stem:
        return default + suffix if suffix else default
    return stem[:SAFE_NAME_LENGTH - len(suffix)] + suffix
