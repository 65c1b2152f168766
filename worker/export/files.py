"""Disk safety for exports: check free space before writing, and write every artifact under a
temporary name in its target directory, renamed into place only when it is complete, so that a
failure (a full disk, a crash, a cancel) never leaves a partial file where a finished one belongs."""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import uuid
from pathlib import Path
from typing import Callable, Iterator

ProgressFn = Callable[[str, float], None]

# Slack on top of the estimated sizes: filesystem blocks, metadata, the tokenizer files.
SIZE_MARGIN_FRACTION = 0.05
SIZE_MARGIN_BYTES = 32 * 1024 * 1024


class ExportError(RuntimeError):
    """An export that cannot be made; the message is meant for the user. One whose every format failed
    its check carries each format's outcome and the checks (the manifest's `formats`, `verification`)."""

    def __init__(self, message: str, *, formats: dict | None = None, verification: dict | None = None):
        super().__init__(message)
        self.formats, self.verification = formats, verification


class NotEnoughDiskSpace(ExportError):
    def __init__(self, target: Path, needed: int, free: int):
        self.target, self.needed, self.free = Path(target), int(needed), int(free)
        super().__init__(
            f"Not enough disk space to export into {target}: it needs about {_human(needed)} "
            f"and {_human(free)} is free. Free some space or choose fewer formats."
        )


class DiskFull(ExportError):
    """The disk filled up while an artifact was being written (another process took the space, or
    the up-front check was skipped); the partial file has been removed."""

    def __init__(self, target: Path, cause: OSError):
        self.target = Path(target)
        super().__init__(f"The disk filled up while writing {self.target.name} ({cause}); "
                         "the partial file was removed. Free some space and export again.")


def _is_disk_full(exc: BaseException, where: Path) -> bool:
    if not isinstance(exc, OSError):
        return False
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return True
    # numpy's tofile reports a short write without an errno: look at the disk itself.
    try:
        return shutil.disk_usage(where).free < 1024 * 1024
    except OSError:
        return False


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"


def with_margin(nbytes: int) -> int:
    return int(nbytes * (1 + SIZE_MARGIN_FRACTION)) + SIZE_MARGIN_BYTES


def ensure_free_space(target_dir: Path, expected_bytes: int, *, reserve_bytes: int = 0) -> int:
    """Fail with NotEnoughDiskSpace unless the filesystem of target_dir has room for expected_bytes
    (plus a margin) while keeping reserve_bytes free. Returns the free bytes it saw."""
    target_dir = Path(target_dir)
    probe = target_dir
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    needed = with_margin(expected_bytes) + int(reserve_bytes)
    if free < needed:
        raise NotEnoughDiskSpace(target_dir, needed, free)
    return free


def _temp_sibling(final: Path) -> Path:
    return final.with_name(f".{final.name}.partial-{uuid.uuid4().hex[:8]}")


@contextlib.contextmanager
def atomic_file(final: Path) -> Iterator[Path]:
    """Yield a temporary path beside `final`; on success it replaces `final`, on failure it is removed."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    temp = _temp_sibling(final)
    try:
        yield temp
        os.replace(temp, final)
    except BaseException as exc:
        full = _is_disk_full(exc, final.parent)
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
        if full:
            raise DiskFull(final, exc) from exc
        raise


@contextlib.contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Yield a fresh temporary directory beside `final`; on success it becomes `final` (replacing
    an older one), on failure it is removed with everything in it."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    temp = _temp_sibling(final)
    temp.mkdir()
    try:
        yield temp
        if final.exists():
            shutil.rmtree(final)
        temp.rename(final)
    except BaseException as exc:
        full = _is_disk_full(exc, final.parent)
        shutil.rmtree(temp, ignore_errors=True)
        if full:
            raise DiskFull(final, exc) from exc
        raise


def remove_partials(final: Path) -> list[Path]:
    """Remove what a killed export (SIGKILL, OOM, power loss: no Python cleanup ran) left beside
    `final`: its `.<name>.partial-*` temporaries. Returns what it removed."""
    final = Path(final)
    removed = []
    if final.parent.is_dir():
        for leftover in final.parent.glob(f".{final.name}.partial-*"):
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)
            removed.append(leftover)
    return removed


def tree_size(path: Path) -> int:
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def no_progress(stage: str, fraction: float) -> None:
    return None
