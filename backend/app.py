"""The FastAPI application: it validates, stores, enqueues and streams; it never trains."""
from __future__ import annotations

import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse

from lanner.backend.errors import BodyLimit, document_common_errors, install_error_handlers
from lanner.backend.frontend_files import mount_frontend
from lanner.backend.head_requests import HeadAsGet
from lanner.backend.openapi_document import document_messages
from lanner.backend.origin_check import SameOriginWrites
from lanner.backend.security_headers import SecurityHeaders
from lanner.backend.notification_sender import NotificationSender
from lanner.backend.routers import (artifacts, auth, catalog, datasets, health, jobs, live, metrics, notifications,
                                    playground, rewards, sweeps, tokens, trackers, users)
from lanner.core.settings import get_settings

# One router per resource; another part of the studio adds its router with one line here.
ROUTERS = [
    health.router,
    auth.router,
    users.router,
    tokens.router,
    jobs.router,
    sweeps.router,
    metrics.router,
    datasets.router,
    catalog.router,
    artifacts.router,
    live.router,
    playground.router,
    rewards.router,
    trackers.router,
    notifications.router,
]
# Dataset uploads stream to disk under their own, larger limit (LANNER_MAX_UPLOAD_BYTES).
STREAMING_UPLOAD_PATHS = ("/api/datasets",)


def redirect_root_documents(app: FastAPI) -> None:
    """The API's documents live under /api/; their usual root paths, which the web UI would answer
    otherwise, point there (308: permanent)."""
    for path, target in (("/openapi.json", app.openapi_url), ("/docs", app.docs_url), ("/redoc", app.redoc_url)):
        async def redirect(_: Request, target: str = target) -> RedirectResponse:
            return RedirectResponse(target, status_code=308)
        app.add_route(path, redirect, methods=["GET", "HEAD"], include_in_schema=False)


def send_notifications(settings):
    """The app's lifespan: the notification sender's thread runs while the API is served (an in-process
    test client without `with` runs no lifespan; its tests send by calling deliver_due)."""
    @asynccontextmanager
    async def lifespan(_: FastAPI):
        sender = NotificationSender(settings)
        sender.start()
        yield
        sender.stop()

    return lifespan


def create_app() -> FastAPI:
    settings = get_settings()
    logging.basicConfig(level=settings.log_level.upper())
    app = FastAPI(title="Lanner", version=health.VERSION, docs_url="/api/docs", redoc_url="/api/redoc",
                  openapi_url="/api/openapi.json", lifespan=send_notifications(settings))
    install_error_handlers(app)
    for router in ROUTERS:
        app.include_router(router)
    app.add_middleware(HeadAsGet, router=app.router)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes, exempt=STREAMING_UPLOAD_PATHS)
    app.add_middleware(SameOriginWrites)  # a forged request is refused before its body is read
    app.add_middleware(SecurityHeaders)  # outermost: refusals carry the headers too
    redirect_root_documents(app)
    mount_frontend(app, settings.frontend_dir)
    document_common_errors(app)
    document_messages(app)
    return app
