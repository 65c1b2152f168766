"""The FastAPI application: it validates, stores, enqueues and streams; it never trains."""
from __future__ import annotations

import logging

from fastapi import FastAPI

from lanner.backend.frontend_files import mount_frontend
from lanner.backend.routers import health
from lanner.backend.settings import get_settings


def create_app() -> FastAPI:
    settings = get_settings()
    logging.basicConfig(level=settings.log_level.upper())
    app = FastAPI(title="Lanner", version=health.VERSION, docs_url="/api/docs", openapi_url="/api/openapi.json")
    app.include_router(health.router)
    mount_frontend(app, settings.frontend_dir)
    return app
