"""Whether llama.cpp (llama-cpp-python) can be used in this environment: the one answer that the health
report, the export and the Playground's CPU chat go by.

llama-cpp-python compiles llama.cpp when it is installed (minutes on a small machine), so `lanner up`
starts the studio first and builds it in the background (lanner.cli.llama_cpp_build). The build keeps
its state in STATE_FILE, in the environment it installs into: `key=value` lines (state: building,
ready or failed; since; pid; log; wanted). Without the file (an image that installed the `llama-cpp`
extra, an older checkout) llama.cpp is ready when the package is importable."""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from lanner.core.errors import UserError

STATE_FILE = Path(sys.prefix) / ".lanner-llama-cpp"
UNAVAILABLE = "llama_cpp_unavailable"  # the code of require_llama_cpp's refusal


class LlamaCppStatus(BaseModel):
    state: Literal["ready", "building", "failed", "missing"]
    detail: str = Field(description="The state in words, with what to do")
    since: datetime | None = Field(default=None, description="When the build started (building) or ended")
    log: str | None = Field(default=None, description="The build's log file (signed-in callers only)")


def read_state() -> dict[str, str]:
    try:
        lines = STATE_FILE.read_text().splitlines()
    except OSError:
        return {}
    return dict(line.split("=", 1) for line in lines if "=" in line)


def write_state(state: str, *, log: Path, wanted: str) -> None:
    """Written whole and renamed into place: a reader never sees half a file."""
    since = datetime.now(timezone.utc).isoformat(timespec="seconds")
    temp = STATE_FILE.with_name(f"{STATE_FILE.name}.{os.getpid()}")
    temp.write_text(f"state={state}\nsince={since}\npid={os.getpid()}\nlog={log}\nwanted={wanted}\n")
    temp.replace(STATE_FILE)


def _installed() -> bool:
    if importlib.util.find_spec("llama_cpp") is not None:
        return True
    importlib.invalidate_caches()  # installed since this process last looked
    return importlib.util.find_spec("llama_cpp") is not None


def _alive(pid: str | None) -> bool:
    try:
        os.kill(int(pid or ""), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def _time(since: datetime | None) -> str:
    return since.strftime("%H:%M UTC") if since else "an unknown time"


def llama_cpp_status() -> LlamaCppStatus:
    fields = read_state()
    try:
        since = datetime.fromisoformat(fields["since"])
    except (KeyError, ValueError):
        since = None
    log, state = fields.get("log"), fields.get("state")
    if state == "building" and _alive(fields.get("pid")):
        return LlamaCppStatus(state="building", since=since, log=log, detail=(
            f"llama.cpp is still being built (since {_time(since)}); ready in a few minutes."))
    if state in ("building", "failed"):
        how = "failed" if state == "failed" else "stopped before it finished"
        return LlamaCppStatus(state="failed", since=since, log=log, detail=(
            f"llama.cpp's build {how} at {_time(since)}: its log says why. Fix that and run "
            "`./lanner build-llama-cpp` (or `./lanner up` again)."))
    if _installed():
        return LlamaCppStatus(state="ready", since=since, log=log, detail="llama.cpp is ready.")
    return LlamaCppStatus(state="missing", detail=(
        "llama.cpp (llama-cpp-python) is not installed here: `./lanner up` builds it, or install "
        "Lanner's `llama-cpp` extra."))


def require_llama_cpp(needed_for: str, meanwhile: str = "") -> None:
    """UserError 409 in words unless llama.cpp is ready: `needed_for` names what needs it, `meanwhile`
    what can be done without it."""
    status = llama_cpp_status()
    if status.state != "ready":
        log = f" (log: {status.log})" if status.state == "failed" and status.log else ""
        raise UserError(409, f"{needed_for} needs llama.cpp. {status.detail}{log} {meanwhile}".strip(),
                        code=UNAVAILABLE)
