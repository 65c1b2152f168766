"""What GET /api/models and the hub routes (search, downloads) take and answer."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from lanner.core.spec import HUB_ID


class CatalogModel(BaseModel):
    id: str
    family: str | None = None
    name: str | None = None
    parameters: int | None = None
    gated: bool = False
    source: Literal["builtin", "hub", "local"]
    downloaded: bool = Field(default=False, description="A hub model already in DATA_DIR/models (no hub needed)")


class Catalog(BaseModel):
    default: CatalogModel
    curated: list[CatalogModel]
    local: list[CatalogModel]


class HubModel(BaseModel):
    id: str
    downloads: int | None = None
    likes: int | None = None
    gated: bool = False
    downloaded: bool = False


class DownloadRequest(BaseModel):
    repo_id: str = Field(min_length=3, max_length=193, pattern=HUB_ID.pattern, description="org/name on the hub")
    revision: str = Field(default="main", min_length=1, max_length=100, pattern=r"^[\w.\-]+$",
                          description="A branch, tag or commit")


class ModelDownload(BaseModel):
    repo_id: str
    status: Literal["downloading", "done", "failed", "interrupted"] = Field(
        description="interrupted: its API process stopped; ask again to continue")
    revision: str | None = None
    commit: str | None = None
    files_total: int | None = None
    files_done: int | None = None
    bytes_total: int | None = None
    bytes_done: int | None = None
    file: str | None = Field(default=None, description="The file being fetched")
    error: str | None = None
    started_by: int | None = None
    started_at: str | None = None
    finished_at: str | None = None
    path: str | None = Field(default=None, description="Where the model is once done")
