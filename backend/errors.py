"""Every error is JSON {"detail": …}; request bodies are capped before any route reads them."""
from __future__ import annotations

import logging
import math

from fastapi import FastAPI, Request, WebSocket
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from sqlalchemy.exc import IntegrityError
from starlette.requests import ClientDisconnect, HTTPConnection

from lanner.backend.input_guard import body_refusal, send_refusal, url_refusal
from lanner.core.errors import UserError

log = logging.getLogger(__name__)
TRY_AGAIN_LATER = 1013  # the WebSocket close code for a service that is briefly unavailable
RACED = ("Another request changed the same thing at the same moment (a name or an email that must be unique, a "
         "row that was just deleted): nothing was stored; look again and retry")
REDIS_AWAY = ("The studio's Redis is not answering (sign-in sessions, the queue's events and live streams "
              "live there): try again in a moment; jobs and data in the database are safe")


_ANY_ROUTE_ERRORS = {
    400: "The body is not what its content type says (not JSON, not UTF-8)",
    404: "No such resource",
    413: "The request body is over its limit",
    422: "Invalid input: one entry per field, or a sentence",
}


def document_common_errors(app: FastAPI) -> None:
    """Completes the OpenAPI document with the errors any route can answer without saying so: 400 and
    413 where there is a body, 404 where the path names a resource, 422 where there is input. Each is
    an ErrorOut, as every error body is; what a route declares itself stays as it is."""
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is not None:
            return app.openapi_schema
        document = build()
        error = {"$ref": "#/components/schemas/ErrorOut"}
        for path, operations in document.get("paths", {}).items():
            for operation in operations.values():
                has_body, has_input = "requestBody" in operation, bool(operation.get("parameters"))
                codes = ([400, 413] if has_body else []) + ([404] if "{" in path else []) + \
                        ([422] if has_body or has_input else [])
                responses = operation.setdefault("responses", {})
                for code in codes:
                    responses.setdefault(str(code), {"description": _ANY_ROUTE_ERRORS[code],
                                                     "content": {"application/json": {"schema": error}}})
        return document

    app.openapi = openapi


def _echoable(value):
    """A value a 422 echoes as its `input`, made encodable: a body FastAPI could not parse is echoed as
    bytes, which need not be UTF-8 (a latin-1 form post), and text may hold lone surrogates."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, dict):
        return {_echoable(key): _echoable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_echoable(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid_input(request: Request, exc: RequestValidationError) -> JSONResponse:
        """FastAPI's own 422, with what it echoes made encodable (its handler fails on such input: a 500)."""
        return JSONResponse({"detail": jsonable_encoder(_echoable(list(exc.errors())))}, status_code=422)

    @app.exception_handler(IntegrityError)
    async def raced(request: Request, exc: IntegrityError) -> JSONResponse:
        """Two requests at once that the database's constraints part (two users with one email, a job on a
        dataset deleted meanwhile): the loser gets a 409 in words, not a 500."""
        log.info("a constraint refused %s %s: %s", request.method, request.url.path, exc.orig)
        return JSONResponse({"detail": RACED}, status_code=409)

    @app.exception_handler(UserError)
    async def user_error(request: Request, exc: UserError) -> JSONResponse:
        headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after else None
        return JSONResponse({"detail": exc.message}, status_code=exc.status, headers=headers)

    @app.exception_handler(RedisConnectionError)
    @app.exception_handler(RedisTimeoutError)
    async def redis_away(connection: HTTPConnection, exc: Exception) -> JSONResponse | None:
        log.warning("Redis did not answer on %s: %s", connection.url.path, exc)
        if isinstance(connection, WebSocket):
            await connection.close(TRY_AGAIN_LATER, "Redis is not answering: connect again in a moment")
            return None
        return JSONResponse({"detail": REDIS_AWAY}, status_code=503, headers={"Retry-After": "5"})

    @app.exception_handler(ClientDisconnect)
    async def client_left(request: Request, _: ClientDisconnect) -> Response:
        # a dropped upload: nothing to answer (the route's cleanup has run) and nothing went wrong here
        log.info("%s %s: the client closed the connection before its request was read", request.method,
                 request.url.path)
        return Response(status_code=400)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        # the server drops the connection after an unhandled error: say so, so a client does not reuse it
        return JSONResponse({"detail": "Internal server error; the API log has the details"}, status_code=500,
                            headers={"Connection": "close"})


class BodyLimit:
    """Refuses request bodies over `limit` bytes with 413, whether the size is announced
    (Content-Length) or not (chunked). Streaming uploads (`exempt` paths) enforce their own limit.
    Then refuses with 422 what no route could store or answer (lanner.backend.input_guard)."""

    def __init__(self, app, limit: int, exempt: tuple[str, ...] = ()):
        self.app, self.limit, self.exempt = app, limit, exempt

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        refusal = url_refusal(scope)
        if refusal:
            return await send_refusal(send, 422, refusal)
        if scope["path"] in self.exempt:
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await self._too_large(send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                return await self._too_large(send)
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        refusal = body_refusal(scope, body)
        if refusal:
            return await send_refusal(send, 422, refusal)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)

    async def _too_large(self, send):
        await send_refusal(send, 413, f"Request body over {self.limit} bytes")
