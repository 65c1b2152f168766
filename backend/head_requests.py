"""HEAD on every GET route (RFC 9110: a server that answers GET answers HEAD), for monitors and clients
that ask for the headers alone. FastAPI routes a GET-only path's HEAD to 405; this routes it as GET and
answers its status and headers (Content-Length included) without its body. Routes that answer HEAD
themselves (artifact downloads: no file read) and the web UI's static files keep it."""
from __future__ import annotations

from starlette.routing import Match, Router


class HeadAsGet:
    def __init__(self, app, router: Router):
        self.app, self.router = app, router

    def _answers_head(self, scope) -> bool:
        return any(route.matches(scope)[0] == Match.FULL for route in self.router.routes)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "HEAD" or self._answers_head(scope):
            return await self.app(scope, receive, send)
        answered = False

        async def send_headers_only(message):
            nonlocal answered
            if message["type"] == "http.response.start":
                await send(message)
            elif message["type"] == "http.response.body" and not answered:
                answered = True
                await send({"type": "http.response.body", "body": b"", "more_body": False})

        async def receive_until_answered():
            # once answered, a streaming body hears that the client left and stops
            return {"type": "http.disconnect"} if answered else await receive()

        await self.app({**scope, "method": "GET"}, receive_until_answered, send_headers_only)
