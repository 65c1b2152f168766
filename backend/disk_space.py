"""Room on the disk: uploads and model downloads leave LANNER_MIN_FREE_BYTES free, so a training
run that is writing checkpoints is not the one that finds the disk full."""
from __future__ import annotations

import shutil
from pathlib import Path


class NoRoom(Exception):
    pass


def check_room(folder: Path, needed: int, keep_free: int) -> None:
    """Raises NoRoom unless `needed` more bytes fit in `folder`'s file system with `keep_free` to spare."""
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if needed + keep_free > free:
        raise NoRoom(f"Not enough disk space: {needed} bytes to write, {free} free, and LANNER_MIN_FREE_BYTES "
                     f"keeps {keep_free} free for checkpoints")
