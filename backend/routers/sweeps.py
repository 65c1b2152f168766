"""Sweeps: a search over some fields of one spec, each run a training job in the shared queue.
Everyone sees every sweep; its owner or an admin cancels it."""
from __future__ import annotations

from collections import Counter
from typing import Literal

from fastapi import APIRouter, Depends, Query
from redis import Redis
from sqlalchemy.orm import Session

from lanner.backend.deps import current_user, get_db, per_user, redis_client, require_owner_or_admin
from lanner.backend.schemas.common import SIGNED_IN_ERRORS, Offset, PathId, errors
from lanner.backend.schemas.sweeps import RankedRun, SweepCreate, SweepOut, SweepPage, SweepRanking
from lanner.backend.services import sweeps
from lanner.core.models import Job, Sweep, User
from lanner.core.settings import Settings, get_settings

router = APIRouter(tags=["sweeps"], responses=SIGNED_IN_ERRORS)
MAX_PAGE = 200


def sweep_out(sweep: Sweep, runs: list[Job]) -> SweepOut:
    config = sweep.config
    return SweepOut(id=sweep.id, owner_id=sweep.owner_id, name=sweep.name, status=sweeps.status(sweep, runs),
                    strategy=config["strategy"], parameters=config["parameters"], budget=config["budget"],
                    seed=config["seed"], metric=config["metric"], direction=config["direction"],
                    base=config["base"], job_ids=[job.id for job in runs],
                    runs_by_status=Counter(job.status for job in runs), created_at=sweep.created_at,
                    cancelled_at=sweep.cancelled_at)


@router.post("/api/sweeps", response_model=SweepOut, status_code=201, dependencies=[per_user("jobs")])
def create_sweep(body: SweepCreate, user: User = Depends(current_user), session: Session = Depends(get_db),
                 redis: Redis = Depends(redis_client), settings: Settings = Depends(get_settings)) -> SweepOut:
    """Queues one training job per run: every combination of the values (grid), or `budget` draws of
    the seed (random). A run that would be invalid refuses the sweep: a 422 on ["body", "parameters",
    i, "values"] or on the base spec's field."""
    sweep = sweeps.create(session, redis, settings, user, body)
    return sweep_out(sweep, sweeps.runs_of(session, [sweep.id])[sweep.id])


@router.get("/api/sweeps", response_model=SweepPage)
def list_sweeps(mine: bool = False, offset: Offset = 0, limit: int = Query(default=50, ge=1, le=MAX_PAGE),
                user: User = Depends(current_user), session: Session = Depends(get_db)) -> SweepPage:
    """Newest first."""
    page, total = sweeps.page_of_sweeps(session, user.id if mine else None, offset, limit)
    runs = sweeps.runs_of(session, [sweep.id for sweep in page])
    return SweepPage(items=[sweep_out(sweep, runs[sweep.id]) for sweep in page], total=total, offset=offset,
                     limit=limit)


@router.get("/api/sweeps/{sweep_id}", response_model=SweepOut, responses=errors(404))
def get_sweep(sweep_id: PathId, _: User = Depends(current_user), session: Session = Depends(get_db)) -> SweepOut:
    sweep = sweeps.get_sweep(session, sweep_id)
    return sweep_out(sweep, sweeps.runs_of(session, [sweep.id])[sweep.id])


@router.get("/api/sweeps/{sweep_id}/ranking", response_model=SweepRanking, responses=errors(404))
def sweep_ranking(sweep_id: PathId, metric: str | None = Query(default=None, pattern=r"^[A-Za-z_][\w/.\-]{0,63}$"),
                  direction: Literal["minimize", "maximize"] | None = None, _: User = Depends(current_user),
                  session: Session = Depends(get_db)) -> SweepRanking:
    """The runs ranked by the last logged value of the sweep's metric (or of `metric`), best first;
    the best succeeded run is marked."""
    sweep = sweeps.get_sweep(session, sweep_id)
    runs = sweeps.runs_of(session, [sweep.id])[sweep.id]
    metric = metric or sweep.config["metric"]
    direction = direction or sweep.config["direction"]
    ranked, logged = sweeps.ranked(session, runs, metric, direction)
    by_id = {job.id: job for job in runs}
    return SweepRanking(metric=metric, direction=direction, metrics=logged, runs=[
        RankedRun(job_id=run.job_id, name=by_id[run.job_id].name, status=by_id[run.job_id].status,
                  values=sweeps.swept_values(sweep, by_id[run.job_id]), value=run.value, rank=run.rank, best=run.best)
        for run in ranked])


@router.post("/api/sweeps/{sweep_id}/cancel", response_model=SweepOut, responses=errors(403, 404, 409))
def cancel_sweep(sweep_id: PathId, user: User = Depends(current_user), session: Session = Depends(get_db),
                 redis: Redis = Depends(redis_client)) -> SweepOut:
    """Cancels the runs still queued, at once; the running ones finish and rank with the others (each
    may be cancelled from its own page)."""
    sweep = sweeps.get_sweep(session, sweep_id)
    require_owner_or_admin(user, sweep.owner_id, "cancel this sweep")
    sweeps.cancel(session, redis, user, sweep)
    return sweep_out(sweep, sweeps.runs_of(session, [sweep.id])[sweep.id])
