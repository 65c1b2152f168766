"""GET /api/models: what a job can start from. The hub routes (search, download) answer 503
"offline: …" when the hub cannot be reached from this machine."""
from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException, Query, Response
from redis import Redis

from lanner.backend import model_downloads
from lanner.backend.deps import current_user, per_user, redis_client
from lanner.backend.disk_space import NoRoom
from lanner.backend.hub import Hub, HubOffline
from lanner.core.model_catalog import BUILTIN_PARAMETERS, DEFAULT_MODEL_ID, catalog_entries, local_models
from lanner.core.errors import UserError
from lanner.core.models import User
from lanner.backend.schemas.catalog import Catalog, CatalogModel, DownloadRequest, HubModel, ModelDownload
from lanner.backend.schemas.common import SIGNED_IN_ERRORS, errors
from lanner.core.spec import HUB_ID
from lanner.core.settings import Settings, get_settings

router = APIRouter(tags=["models"], responses=SIGNED_IN_ERRORS)
OFFLINE_HINT = "use the built-in model, a model already downloaded, or a local path"


def _hub(settings: Settings) -> Hub:
    return Hub(settings.hub_url, settings.hub_timeout_s, settings.hub_token or None)


def _download_out(found: dict) -> ModelDownload:
    return ModelDownload(**{key: (value if value != "" else None) for key, value in found.items()
                            if key in ModelDownload.model_fields})


@router.get("/api/models", response_model=Catalog)
def list_models(_: User = Depends(current_user), settings: Settings = Depends(get_settings)) -> Catalog:
    default = CatalogModel(id=DEFAULT_MODEL_ID, family="SmolLM2", parameters=BUILTIN_PARAMETERS, source="builtin",
                           name="SmolLM2-135M-Instruct (built in, trains on a CPU)")
    curated = [CatalogModel(**entry, downloaded=model_downloads.is_downloaded(settings, entry["id"]))
               for entry in catalog_entries()]
    return Catalog(default=default, curated=curated, local=local_models(settings.models_dir))


@router.get("/api/models/search", response_model=list[HubModel], dependencies=[per_user("hub_requests")],
            responses=errors(502, 503))
def search_hub(q: str = Query(min_length=1, max_length=100), limit: int = Query(default=20, ge=1, le=100),
               _: User = Depends(current_user), settings: Settings = Depends(get_settings)) -> list[HubModel]:
    """Text-generation models on the hub whose name matches `q`."""
    try:
        found = _hub(settings).search(q, limit)
    except HubOffline as exc:
        raise HTTPException(503, f"offline: {exc}; {OFFLINE_HINT}") from None
    except UserError as exc:  # the hub's refusal
        raise HTTPException(502, f"the model hub refused the search ({exc.status}): {exc}") from None
    return [HubModel(id=item["id"], downloads=_count(item.get("downloads")), likes=_count(item.get("likes")),
                     gated=bool(item.get("gated")), downloaded=model_downloads.is_downloaded(settings, item["id"]))
            for item in found if HUB_ID.match(item["id"])]


def _count(value) -> int | None:
    return value if isinstance(value, int) else None


@router.post("/api/models/downloads", response_model=ModelDownload, status_code=202,
             dependencies=[per_user("hub_requests")],
             responses={200: {"model": ModelDownload, "description": "Already downloaded"},
                        **errors(403, 404, 502, 503, 507)})
def download_model(body: DownloadRequest, response: Response, user: User = Depends(current_user),
                   redis: Redis = Depends(redis_client), settings: Settings = Depends(get_settings)) -> ModelDownload:
    """Downloads a hub model's config, tokenizer and weights into DATA_DIR/models/<org>/<name>, in the
    background (202; follow it with GET /api/models/downloads). A failed or interrupted download
    continues where it stopped when asked again. 200 when the model is here already."""
    if model_downloads.is_downloaded(settings, body.repo_id):
        response.status_code = 200
        return ModelDownload(repo_id=body.repo_id, status="done",
                             path=str(model_downloads.model_dir(settings, body.repo_id)))
    try:
        found = model_downloads.start(redis, settings, _hub(settings), body.repo_id, body.revision, user.id)
    except HubOffline as exc:
        raise HTTPException(503, f"offline: {exc}; {OFFLINE_HINT}") from None
    except UserError as exc:  # the hub's refusal
        if exc.status in (401, 403, 404):  # the hub says 401 for a repo that is missing or private
            gated = "set LANNER_HUB_TOKEN to a token with access" if not settings.hub_token else "the token has no access"
            status = 404 if exc.status != 403 else 403
            raise HTTPException(status, f"{body.repo_id} is not on the hub, or it is gated or private "
                                        f"({gated}): {exc}") from None
        raise HTTPException(502, f"the model hub answered {exc.status}: {exc}") from None
    except model_downloads.NotTrainable as exc:
        raise HTTPException(422, str(exc)) from None
    except NoRoom as exc:
        raise HTTPException(507, str(exc)) from None
    return _download_out(found)


@router.get("/api/models/downloads", response_model=list[ModelDownload])
def list_downloads(_: User = Depends(current_user), redis: Redis = Depends(redis_client)) -> list[ModelDownload]:
    """Every download asked for, with its progress or why it failed."""
    return [_download_out(found) for found in model_downloads.all_states(redis)]
