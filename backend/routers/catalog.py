"""GET /api/models: what a job can start from; /api/models/search asks the hub when there is network."""
from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request

from fastapi import APIRouter, Depends, HTTPException, Query
from pydantic import BaseModel

from lanner.backend.deps import current_user
from lanner.backend.model_catalog import DEFAULT_MODEL_ID, catalog_entries, local_models
from lanner.backend.models import User
from lanner.backend.settings import Settings, get_settings

router = APIRouter(tags=["models"])


class CatalogModel(BaseModel):
    id: str
    family: str | None = None
    name: str | None = None
    parameters: int | None = None
    gated: bool = False
    source: str


class Catalog(BaseModel):
    default: CatalogModel
    curated: list[CatalogModel]
    local: list[CatalogModel]


class HubModel(BaseModel):
    id: str
    downloads: int | None = None
    likes: int | None = None


@router.get("/api/models", response_model=Catalog)
def list_models(_: User = Depends(current_user), settings: Settings = Depends(get_settings)) -> Catalog:
    default = CatalogModel(id=DEFAULT_MODEL_ID, family="SmolLM2", parameters=134_515_008, source="builtin",
                           name="SmolLM2-135M-Instruct (built in, trains on a CPU)")
    return Catalog(default=default, curated=catalog_entries(), local=local_models(settings.models_dir))


@router.get("/api/models/search", response_model=list[HubModel],
            responses={503: {"description": "Offline: the hub cannot be reached from this machine"}})
def search_hub(q: str = Query(min_length=1, max_length=100), limit: int = Query(default=20, ge=1, le=100),
               _: User = Depends(current_user), settings: Settings = Depends(get_settings)) -> list[HubModel]:
    query = urllib.parse.urlencode({"search": q, "limit": limit, "filter": "text-generation"})
    try:
        with urllib.request.urlopen(f"{settings.hub_url.rstrip('/')}/api/models?{query}",
                                    timeout=settings.hub_timeout_s) as response:
            found = json.load(response)
    except (OSError, ValueError) as exc:  # URLError, timeouts and refusals are OSErrors
        raise HTTPException(503, f"offline: the model hub at {settings.hub_url} cannot be reached from this "
                                 f"machine ({exc.__class__.__name__}); use the built-in model, a curated "
                                 "model already downloaded, or a local path") from None
    return [HubModel(id=item["id"], downloads=item.get("downloads"), likes=item.get("likes"))
            for item in found if isinstance(item, dict) and "id" in item]
