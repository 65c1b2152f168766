"""Datasets: streaming upload with a size limit and a per-user quota, the validation report,
list, detail, delete. The file is the raw request body (fetch(url, {method: "POST", body: file})):
it streams straight to disk, where multipart would be spooled and parsed first."""
from __future__ import annotations

import errno
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from lanner.backend import dataset_preview, dataset_store
from lanner.backend.deps import current_user, get_db, per_user
from lanner.backend.paths import safe_filename
from lanner.backend.services import datasets
from lanner.core.dataset_formats import EXTENSIONS
from lanner.core.models import Dataset, User
from lanner.backend.schemas.common import SIGNED_IN_ERRORS, Offset, PathId, QueryId, errors
from lanner.backend.schemas.datasets import DatasetOut, DatasetPage, DatasetPreview, TokenStats, UsageOut
from lanner.core.settings import Settings, get_settings
from lanner.core.default_model import DEFAULT_MODEL_ID

router = APIRouter(tags=["datasets"], responses=SIGNED_IN_ERRORS)
MAX_PAGE = 200
MAX_PREVIEW_ROWS = 20
MaxSeqLen = Annotated[(int, Query(), *datasets.SPEC_MAX_SEQ_LEN.metadata)]


@router.get("/api/datasets/usage", response_model=UsageOut)
def usage(user: User = Depends(current_user), session: Session = Depends(get_db),
          settings: Settings = Depends(get_settings)) -> UsageOut:
    return UsageOut(used_bytes=datasets.used_bytes(session, user.id), quota_bytes=settings.user_quota_bytes,
                    max_upload_bytes=settings.max_upload_bytes)


@router.post("/api/datasets", response_model=DatasetOut, status_code=201,
             openapi_extra={"requestBody": {"required": True, "content": {
                 "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}},
             dependencies=[per_user("uploads")], responses=errors(413, 415, 507))
async def upload_dataset(request: Request, filename: str = Query(min_length=1, max_length=255),
                         name: str | None = Query(default=None, max_length=200),
                         model: str | None = Query(default=None, min_length=1, max_length=1024,
                                                   description="Measure token lengths with this model's tokenizer "
                                                               "(the built-in one when left out and imported)"),
                         user: User = Depends(current_user), session: Session = Depends(get_db),
                         settings: Settings = Depends(get_settings)):
    """Uploads one dataset file as the raw body; `filename`'s extension gives its type. 422 (with the
    report) when it is empty, unreadable, mis-encoded or has no usable row; nothing is kept then."""
    clean = safe_filename(filename, default="dataset")
    if Path(clean).suffix.lower() not in EXTENSIONS:
        raise HTTPException(415, f"{filename}: upload a {', '.join(EXTENSIONS[:-1])} or {EXTENSIONS[-1]} file")
    room = settings.user_quota_bytes - await run_in_threadpool(datasets.used_bytes, session, user.id)
    limit = min(settings.max_upload_bytes, max(room, 0))
    too_large = (f"Over the upload limit of {settings.max_upload_bytes} bytes" if limit == settings.max_upload_bytes
                 else f"Over your dataset quota: {max(room, 0)} of {settings.user_quota_bytes} bytes left")
    announced = request.headers.get("content-length")
    if announced and announced.isdigit() and int(announced) > limit:
        raise HTTPException(413, too_large)
    datasets.require_room(settings, int(announced) if announced and announced.isdigit() else 0)

    temporary = dataset_store.incoming_path(settings.datasets_dir, Path(clean).suffix.lower())
    try:
        try:
            size = await dataset_store.receive_into(temporary, request.stream(), limit)
        except dataset_store.UploadTooLarge:
            raise HTTPException(413, too_large) from None
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                raise HTTPException(507, f"The disk is full: {filename} could not be stored") from None
            raise
        if size == 0:
            raise HTTPException(422, f"{filename} is empty")
        report = await run_in_threadpool(dataset_store.inspect, temporary, clean)
        if not report.get("usable_rows"):
            detail = report.get("error") or f"{clean}: no usable row"
            return JSONResponse({"detail": detail, "report": report}, status_code=422)
        report.update(await run_in_threadpool(datasets.upload_token_stats, temporary, model, settings))
        return DatasetOut.model_validate(await run_in_threadpool(
            datasets.store_upload, session, settings, user, temporary, clean, name, size, report))
    finally:  # refused, failed or disconnected: leave nothing behind
        temporary.unlink(missing_ok=True)


@router.get("/api/datasets", response_model=DatasetPage)
def list_datasets(owner_id: QueryId = None, mine: bool = False, offset: Offset = 0,
                  limit: int = Query(default=50, ge=1, le=MAX_PAGE), user: User = Depends(current_user),
                  session: Session = Depends(get_db), settings: Settings = Depends(get_settings)) -> DatasetPage:
    """The team's datasets, newest first."""
    query = select(Dataset)
    if mine:
        owner_id = user.id
    if owner_id is not None:
        query = query.where(Dataset.owner_id == owner_id)
    total = session.scalar(select(func.count()).select_from(query.subquery()))
    items = list(session.scalars(query.order_by(Dataset.id.desc()).offset(offset).limit(limit)))
    if datasets.refresh_token_stats(session, settings, items):
        session.commit()
    return DatasetPage(items=items, total=total, offset=offset, limit=limit)


@router.get("/api/datasets/{dataset_id}", response_model=DatasetOut, responses=errors(404))
def get_dataset(dataset_id: PathId, _: User = Depends(current_user), session: Session = Depends(get_db),
                settings: Settings = Depends(get_settings)) -> Dataset:
    dataset = datasets.get_dataset(session, dataset_id)
    if datasets.refresh_token_stats(session, settings, [dataset]):
        session.commit()
    return dataset


@router.delete("/api/datasets/{dataset_id}", status_code=204, responses=errors(403, 404, 409))
def delete_dataset(dataset_id: PathId, user: User = Depends(current_user), session: Session = Depends(get_db),
                   settings: Settings = Depends(get_settings)) -> Response:
    datasets.delete(session, settings, user, datasets.get_dataset(session, dataset_id))
    return Response(status_code=204)


ModelQuery = Query(default=DEFAULT_MODEL_ID, min_length=1, max_length=1024,
                   description="Whose tokenizer and chat template to use")


PREVIEW_ERRORS = {**errors(404), 409: {**errors(409)[409], "description": "No tokenizer of that model on this machine"},
                  503: {**errors(503)[503], "description": "The built-in model is being imported: ask again after "
                                                           "Retry-After seconds"}}


@router.get("/api/datasets/{dataset_id}/preview", response_model=DatasetPreview, responses=PREVIEW_ERRORS,
            dependencies=[per_user("previews")])
def preview_dataset(dataset_id: PathId, model: str = ModelQuery,
                    offset: Offset = 0,
                    rows: int = Query(default=3, ge=1, le=MAX_PREVIEW_ROWS, description="Usable rows to show"),
                    max_seq_len: MaxSeqLen = datasets.SPEC_MAX_SEQ_LEN.default, _: User = Depends(current_user),
                    session: Session = Depends(get_db), settings: Settings = Depends(get_settings)) -> dict:
    """Usable rows as the model sees them, `rows` of them after the first `offset` usable rows (so
    every one can be paged to): segments of text, each marked trained or not, each row named by its
    line in the file."""
    dataset = datasets.get_dataset(session, dataset_id)
    report, numbered, task, tokenizer = datasets.rows_and_tokenizer(dataset, model, settings)
    return {"model": model, "task": task, "numbered_by": report["numbered_by"], "offset": offset,
            "total": len(numbered), "rows": dataset_preview.preview(tokenizer, numbered[offset:offset + rows], task,
                                                                    max_seq_len)}


@router.get("/api/datasets/{dataset_id}/token-stats", response_model=TokenStats, responses=PREVIEW_ERRORS,
            dependencies=[per_user("previews")])
def dataset_token_stats(dataset_id: PathId, model: str = ModelQuery,
                        max_seq_len: MaxSeqLen = datasets.SPEC_MAX_SEQ_LEN.default, _: User = Depends(current_user),
                        session: Session = Depends(get_db), settings: Settings = Depends(get_settings)) -> dict:
    """Token lengths of the rendered rows (the first 2000): min, max, mean, p50, p95, how many
    exceed max_seq_len, and how many tokens are trained on."""
    dataset = datasets.get_dataset(session, dataset_id)
    _, numbered, task, tokenizer = datasets.rows_and_tokenizer(dataset, model, settings)
    rows = [row for _, row in numbered]
    return {"model": model, "task": task, **dataset_preview.token_stats(tokenizer, rows, task, max_seq_len)}
