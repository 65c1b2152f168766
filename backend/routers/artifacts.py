"""Artifacts: list per job, download (one HTTP range at a time, so large files resume; HEAD for the
size and ETag alone; If-None-Match answered 304 when the file is unchanged; a whole folder as a tar
stream), delete. An artifact's path is its store key (lanner.core.storage): a file of the data dir, or of
the S3 store served from this host's cache; '..', absolute keys and symlinks out of the data dir are refused."""
from __future__ import annotations

import os
import re
import stat as stat_mode
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from fastapi.responses import FileResponse, StreamingResponse
from sqlalchemy import select
from sqlalchemy.orm import Session

from lanner.backend.deps import current_user, get_db, require_owner_or_admin
from lanner.core.models import Artifact, Job, User
from lanner.backend.paths import inside, safe_filename
from lanner.backend.schemas.common import SIGNED_IN_ERRORS, PathId, errors
from lanner.backend.schemas.artifacts import ArtifactOut
from lanner.core.settings import Settings, get_settings
from lanner.core.storage import BadKey, get_store, local_copy

router = APIRouter(tags=["artifacts"], responses={**SIGNED_IN_ERRORS, **errors(404)})
# A position of more than 100 digits is no file's (Python will not even read one of over 4300 as a number)
SINGLE_RANGE = re.compile(r"^\s*bytes\s*=\s*([0-9]{0,100})\s*-\s*([0-9]{0,100})\s*$", re.IGNORECASE)
MAX_LISTED_FILES = 1000
ARCHIVE_CHUNK = 1 << 20
BINARY = {"schema": {"type": "string", "format": "binary"}}


def _artifact(session: Session, artifact_id: int) -> Artifact:
    artifact = session.get(Artifact, artifact_id)
    if artifact is None:
        raise HTTPException(404, f"No artifact {artifact_id}")
    return artifact


def _location(settings: Settings, artifact: Artifact) -> Path:
    """The artifact's file or folder on this machine: the data dir's own, or the store's copy in this
    host's cache (fetched whole, then served with ranges as a local file). 404 in words when it has none."""
    try:
        return local_copy(settings, artifact.path).resolve()
    except BadKey:
        raise HTTPException(404, f"Artifact {artifact.id} has no file inside the store") from None
    except FileNotFoundError:
        raise HTTPException(404, f"The file of artifact {artifact.id} is missing") from None


def _files(folder: Path) -> list[str]:
    """The regular files under a folder, relative and sorted. A symlink, to a file or to a folder, is
    neither listed nor entered, so nothing outside the folder is reached through one."""
    found = []
    for root, _, names in os.walk(folder):  # followlinks=False
        for name in names:
            path = Path(root, name)
            if path.is_file() and not path.is_symlink():
                found.append(str(path.relative_to(folder)))
    return sorted(found)


@router.get("/api/jobs/{job_id}/artifacts", response_model=list[ArtifactOut])
def list_artifacts(job_id: PathId, _: User = Depends(current_user), session: Session = Depends(get_db),
                   settings: Settings = Depends(get_settings)) -> list[ArtifactOut]:
    if session.get(Job, job_id) is None:
        raise HTTPException(404, f"No job {job_id}")
    found = []
    store = get_store(settings)
    for artifact in session.scalars(select(Artifact).where(Artifact.job_id == job_id).order_by(Artifact.id)):
        out = ArtifactOut.model_validate(artifact)
        try:
            if store.is_folder(artifact.path):
                out.files = store.list(artifact.path)[:MAX_LISTED_FILES]
        except BadKey:
            pass
        found.append(out)
    return found


def _check_range(header: str, size: int) -> None:
    match = SINGLE_RANGE.match(header)
    shown = header if len(header) <= 80 else header[:80] + "…"  # (a header may be kilobytes long)
    unsatisfiable = HTTPException(416, f"Range {shown!r} cannot be served: the file has {size} bytes; "
                                       "ask for one range, bytes=start-end, bytes=start- or bytes=-suffix",
                                  headers={"Content-Range": f"bytes */{size}"})
    if match is None or match.groups() == ("", ""):
        raise unsatisfiable
    start, end = match.groups()
    if start and (int(start) >= size or (end and int(end) < int(start))):
        raise unsatisfiable
    if not start and int(end) == 0:
        raise unsatisfiable


def _unchanged(if_none_match: str | None, etag: str) -> bool:
    """Whether an If-None-Match header matches the file's ETag (weak comparison, as RFC 9110 asks of GET/HEAD)."""
    if not if_none_match:
        return False
    tags = [tag.strip().removeprefix("W/") for tag in if_none_match.split(",")]
    return "*" in tags or etag.removeprefix("W/") in tags


def _tar_stream(folder: Path, top: str) -> Iterator[bytes]:
    """The folder's files as an uncompressed tar, read as it is sent: no copy on disk, whatever its size."""
    for relative in _files(folder):
        try:  # O_NOFOLLOW: a file swapped for a symlink since the walk is not followed
            handle = os.fdopen(os.open(folder / relative, os.O_RDONLY | os.O_NOFOLLOW), "rb")
        except OSError:
            continue  # removed since the walk
        with handle:
            status = os.fstat(handle.fileno())
            if not stat_mode.S_ISREG(status.st_mode):
                continue
            member = tarfile.TarInfo(f"{top}/{relative}")
            member.size, member.mtime = status.st_size, int(status.st_mtime)
            member.mode = stat_mode.S_IMODE(status.st_mode)
            yield member.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")
            left = member.size
            while left and (chunk := handle.read(min(ARCHIVE_CHUNK, left))):
                left -= len(chunk)
                yield chunk
            yield bytes(left)  # a file that shrank meanwhile is padded to the size its header gave
            yield bytes(-member.size % tarfile.BLOCKSIZE)
    yield bytes(2 * tarfile.BLOCKSIZE)  # the end-of-archive marker


def folder_archive(folder: Path, name: str, head: bool = False) -> StreamingResponse:
    """A folder as one tar stream, its files under `name` (and the file name `name`.tar). Its size is not
    known before it is written, so it has no Content-Length, no ETag and no ranges (Accept-Ranges: none;
    a Range header is ignored, as RFC 9110 allows); HEAD answers these headers alone, without reading the folder."""
    top = safe_filename(name)
    return StreamingResponse(iter(()) if head else _tar_stream(folder, top), media_type="application/x-tar",
                             headers={"Content-Disposition": f'attachment; filename="{top}.tar"',
                                      "Accept-Ranges": "none"})


@router.head("/api/artifacts/{artifact_id}/download", include_in_schema=False)
@router.get("/api/artifacts/{artifact_id}/download",
            response_class=FileResponse,
            responses={200: {"content": {"application/octet-stream": BINARY, "application/x-tar": BINARY},
                             "description": "The whole file; with ?archive=tar, the whole folder as a tar stream"},
                       206: {"content": {"application/octet-stream": BINARY},
                             "description": "The requested range"}, **errors(416)})
def download_artifact(artifact_id: PathId, request: Request,
                      file: str | None = Query(default=None, max_length=1024,
                                               description="For a folder artifact: the file inside it"),
                      archive: Literal["tar"] | None = Query(
                          default=None, description="For a folder artifact: all its files as one (uncompressed) tar "
                                                    "stream, without ranges"),
                      _: User = Depends(current_user), session: Session = Depends(get_db),
                      settings: Settings = Depends(get_settings)) -> Response:
    if file and archive:
        raise HTTPException(422, "Give ?file= (one file of a folder) or ?archive= (the whole folder), not both")
    artifact = _artifact(session, artifact_id)
    location = _location(settings, artifact)
    if location.is_dir():
        if archive:
            return folder_archive(location, f"job-{artifact.job_id}-{artifact.name}", head=request.method == "HEAD")
        if not file:
            raise HTTPException(422, f"Artifact {artifact_id} is a folder: name one of its files with ?file=, "
                                     "or download it whole with ?archive=tar")
        if not inside(location, file):
            raise HTTPException(404, f"No file {file!r} in artifact {artifact_id}")
        location = (location / file).resolve()
    elif file or archive:
        raise HTTPException(422, f"Artifact {artifact_id} is a single file, not a folder: download it as it is, "
                                 f"without ?{'file' if file else 'archive'}=")
    if not location.is_file():
        raise HTTPException(404, f"The file of artifact {artifact_id} is missing")
    stat = location.stat()
    response = FileResponse(location, filename=location.name, media_type="application/octet-stream", stat_result=stat)
    if _unchanged(request.headers.get("if-none-match"), response.headers["etag"]):  # before Range (RFC 9110 13.2.2)
        return Response(status_code=304, headers={key: response.headers[key] for key in ("etag", "last-modified")})
    if request.headers.get("range"):
        _check_range(request.headers["range"], stat.st_size)
    return response


@router.delete("/api/artifacts/{artifact_id}", status_code=204, responses=errors(403))
def delete_artifact(artifact_id: PathId, user: User = Depends(current_user), session: Session = Depends(get_db),
                    settings: Settings = Depends(get_settings)) -> Response:
    artifact = _artifact(session, artifact_id)
    job = session.get(Job, artifact.job_id)
    require_owner_or_admin(user, job.owner_id, "delete this artifact")
    session.delete(artifact)
    session.commit()
    try:
        get_store(settings).delete(artifact.path)
    except BadKey:  # never touch anything outside the store, whatever the row says
        pass
    return Response(status_code=204)
