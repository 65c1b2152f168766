"""Serves the built single-page app: real files as they are, every other non-API path as
index.html so the browser router can take it (a reload on /jobs/7 must work)."""
from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, HTTPException
from fastapi.responses import FileResponse, PlainTextResponse

API_PREFIXES = ("api/", "ws/")


def mount_frontend(app: FastAPI, dist: Path) -> None:
    dist = dist.resolve()

    @app.get("/{path:path}", include_in_schema=False)
    def frontend(path: str):
        if path.startswith(API_PREFIXES) or path in ("api", "ws"):
            raise HTTPException(status_code=404, detail=f"No such endpoint: /{path}")
        index = dist / "index.html"
        if not index.is_file():
            return PlainTextResponse(
                "The web UI is not built yet: run `./lanner up` (it builds frontend/ with npm).",
                status_code=503,
            )
        if path and _is_file_inside(dist, path):
            return FileResponse((dist / path).resolve())
        return FileResponse(index, headers={"Cache-Control": "no-cache"})


def _is_file_inside(dist: Path, path: str) -> bool:
    """Whether `path` names a built file; a path no file system could hold (a name over 255 bytes, a
    path over PATH_MAX) names none, rather than failing the request."""
    try:
        candidate = (dist / path).resolve()
        return candidate.is_relative_to(dist) and candidate.is_file()
    except (OSError, ValueError):
        return False
