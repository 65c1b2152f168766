"""The FastAPI application: it validates, stores, enqueues and streams; it never trains."""
from __future__ import annotations

import logging

from fastapi import FastAPI

from lanner.backend.errors import BodyLimit, install_error_handlers
from lanner.backend.frontend_files import mount_frontend
from lanner.backend.routers import artifacts, auth, catalog, datasets, health, jobs, live, metrics, tokens, users
from lanner.backend.settings import get_settings

# Dataset uploads stream to disk under their own, larger limit (LANNER_MAX_UPLOAD_BYTES).
STREAMING_UPLOAD_PATHS = ("/api/datasets",)


def create_app() -> FastAPI:
    settings = get_settings()
    logging.basicConfig(level=settings.log_level.upper())
    app = FastAPI(title="Lanner", version=health.VERSION, docs_url="/api/docs", openapi_url="/api/openapi.json")
    install_error_handlers(app)
    for module in (health, auth, users, tokens, jobs, metrics, datasets, catalog, artifacts, live):
        app.include_router(module.router)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes, exempt=STREAMING_UPLOAD_PATHS)
    mount_frontend(app, settings.frontend_dir)
    return app
