"""Datasets: storing an upload that passed its checks, the token statistics of its report, reading a
stored one's rows with a model's tokenizer, and deleting one. The streaming upload itself, with its
size limits, is HTTP and stays in lanner.backend.routers.datasets. Refusals are UserErrors."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from sqlalchemy import delete as delete_rows
from sqlalchemy import exists, func, select
from sqlalchemy.orm import Session

from lanner.backend import dataset_preview
from lanner.backend.deps import require_owner_or_admin
from lanner.backend.disk_space import NoRoom, check_room
from lanner.core.default_model import DEFAULT_MODEL_ID
from lanner.core.errors import UserError
from lanner.core.models import Dataset, Job, JobStatus, User
from lanner.core.settings import Settings
from lanner.core.storage import BadKey, get_store, local_copy
from lanner.core.spec import Hyperparameters

log = logging.getLogger(__name__)
# Token statistics count the rows over a job's max_seq_len: the spec's default, within its bounds.
SPEC_MAX_SEQ_LEN = Hyperparameters.model_fields["max_seq_len"]


def used_bytes(session: Session, user_id: int) -> int:
    return session.scalar(select(func.coalesce(func.sum(Dataset.size_bytes), 0)).where(Dataset.owner_id == user_id))


def require_room(settings: Settings, size: int) -> None:
    try:
        check_room(settings.datasets_dir, size, settings.min_free_bytes)
    except NoRoom as exc:
        raise UserError(507, str(exc)) from None


def dataset_file(settings: Settings, dataset: Dataset) -> Path:
    """The dataset's file on this machine (the data dir's, or the store's copy in the cache); 404 in
    words when it is gone."""
    try:
        path = local_copy(settings, dataset.path)
    except (FileNotFoundError, BadKey):
        path = None
    if path is None or not path.is_file():
        raise UserError(404, f"The file of dataset {dataset.id} is missing")
    return path


def get_dataset(session: Session, dataset_id: int) -> Dataset:
    dataset = session.get(Dataset, dataset_id)
    if dataset is None:
        raise UserError(404, f"No dataset {dataset_id}")
    return dataset


def upload_token_stats(path: Path, model: str | None, settings: Settings) -> dict[str, Any]:
    """The report's token statistics; an upload never fails for want of them. Without the model's
    tokenizer on this machine yet, the report names the model it waits for, and the statistics are
    measured when the dataset is next read, or a job is created on it, once the tokenizer is there
    (refresh_token_stats)."""
    from lanner.core.dataset_formats import load_rows, task_of

    chosen = model or DEFAULT_MODEL_ID
    try:
        folder = dataset_preview.tokenizer_dir(chosen, settings)
        fmt, rows, _ = load_rows(path)
        stats = dataset_preview.token_stats(dataset_preview.load_tokenizer(folder), rows, task_of(fmt),
                                            SPEC_MAX_SEQ_LEN.default)
    except dataset_preview.TokenizerUnavailable as exc:
        return {"token_stats": None, "token_stats_error": str(exc), "token_stats_waiting_for": chosen}
    except Exception as exc:  # a broken tokenizer folder: the upload stands, the report says why
        log.warning("no token statistics with %s", chosen, exc_info=True)
        return {"token_stats": None, "token_stats_error": f"cannot measure with {chosen}: {exc}"}
    stats.pop("lengths", None)  # thousands of numbers: the token-stats route gives them when asked
    return {"token_stats": {"model": chosen, "task": task_of(fmt), **stats}}


def refresh_token_stats(session: Session, settings: Settings, datasets: list[Dataset]) -> bool:
    """Measures, and stores, the token statistics of the datasets uploaded while their model's
    tokenizer was missing (the built-in model still being imported, a model not downloaded yet), once
    it is on this machine. Returns whether any changed; the caller commits (a job's creation with the
    job, so a refused job or sweep leaves nothing half-stored)."""
    changed = False
    for dataset in datasets:
        waiting = (dataset.report or {}).get("token_stats_waiting_for")
        if not waiting:
            continue
        try:
            dataset_preview.tokenizer_dir(waiting, settings)
            path = dataset_file(settings, dataset)
        except (dataset_preview.TokenizerUnavailable, UserError):
            continue
        report = {key: value for key, value in dataset.report.items()
                  if key not in ("token_stats", "token_stats_error", "token_stats_waiting_for")}
        dataset.report = {**report, **upload_token_stats(path, waiting, settings)}
        changed = True
    return changed


def store_upload(session: Session, settings: Settings, user: User, received: Path, filename: str, name: str | None,
                 size: int, report: dict[str, Any]) -> Dataset:
    """Commits the dataset with the received file stored as datasets/<id>/<filename> (moved into the data
    dir, or uploaded to the S3 store); nothing is left behind when this fails."""
    store = get_store(settings)
    folder: str | None = None
    try:
        dataset = Dataset(owner_id=user.id, name=name or Path(filename).stem, filename=filename, path="",
                          size_bytes=size, format=report.get("format"), rows=report.get("rows", 0),
                          usable_rows=report.get("usable_rows", 0), report=report)
        session.add(dataset)
        session.flush()
        folder = f"datasets/{dataset.id}"
        dataset.path = f"{folder}/{filename}"
        store.put(dataset.path, received, move=True)
        session.commit()
        return dataset
    except BaseException:
        session.rollback()
        if folder is not None:
            store.delete(folder)
        raise


def delete(session: Session, settings: Settings, user: User, dataset: Dataset) -> None:
    """Deletes the dataset and its folder; refused while a queued or running job uses it. One conditional
    write: of two deletes at once one deletes and the other answers 404, and a job queued on the dataset
    after it was read still keeps it."""
    require_owner_or_admin(user, dataset.owner_id, "delete this dataset")
    dataset_id = dataset.id
    busy_jobs = select(Job.id).where(Job.dataset_id == dataset_id, Job.status.in_([JobStatus.queued, JobStatus.running]))
    deleted = session.execute(delete_rows(Dataset).where(Dataset.id == dataset_id, ~exists(busy_jobs))
                              .execution_options(synchronize_session=False)).rowcount
    session.commit()
    if not deleted:
        if session.get(Dataset, dataset_id, populate_existing=True) is None:
            raise UserError(404, f"No dataset {dataset_id}")
        busy = session.scalar(select(func.count()).select_from(busy_jobs.subquery()))
        raise UserError(409, f"{busy} queued or running job(s) use dataset {dataset_id}: cancel them first")
    session.expunge(dataset)
    get_store(settings).delete(f"datasets/{dataset_id}")


def rows_and_tokenizer(dataset: Dataset, model: str, settings: Settings):
    """The dataset's report, its usable rows (each with its line in the file), its task and the model's
    tokenizer, for a preview or token statistics."""
    from lanner.core.dataset_formats import DatasetError, examine_lines, task_of

    try:
        folder = dataset_preview.tokenizer_dir(model, settings)
    except dataset_preview.BuiltinImporting as exc:
        raise UserError(503, str(exc), retry_after=dataset_preview.IMPORT_RETRY_SECONDS) from None
    except dataset_preview.TokenizerUnavailable as exc:
        raise UserError(409, str(exc)) from None
    path = dataset_file(settings, dataset)
    try:
        report, rows = examine_lines(path)
    except DatasetError as exc:
        raise UserError(422, str(exc)) from None
    try:
        tokenizer = dataset_preview.load_tokenizer(folder)
    except Exception as exc:  # a broken or foreign tokenizer folder
        raise UserError(409, f"cannot load the tokenizer of {model}: {exc}") from None
    return report, rows, task_of(report["format"]), tokenizer
