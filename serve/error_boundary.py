"""The outermost layer of the app: an error no route or handler expected is logged once, and its
connection answered or ended, never left to the ASGI server.

    app = ErrorBoundaryMiddleware(ClientLimitsMiddleware(...))     # serve/app.py (outer_middleware)

Starlette's error middleware answers such an error with the 500 handler (serve/errors.py) and then
raises it again, "so that the server can log it": uvicorn then logs a second traceback ("Exception
in ASGI application"), and a stream that failed after its first chunk logged only that one. Here
every error that leaves the app is logged once, with its traceback, naming the request; when its
response had already begun (a stream), the connection is dropped, so the client sees the body end
early rather than a body that looks complete. Errors the server expects (deadlines, refusals, a
failed synthesis) never get here: each answers with its own JSON error and log line.
"""
from __future__ import annotations

import logging

from serve.client_limits import client_connection

log = logging.getLogger(__name__)


class ErrorBoundaryMiddleware:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        except Exception as error:
            connection = client_connection(scope)
            if connection.response_started is None:  # no server connection to end (the test client): its caller sees it
                raise
            cut = connection.response_started
            log.error("unhandled error in %s %s%s: %s: %s", scope["method"], scope["path"],
                      " (response cut short)" if cut else " (answered 500 internal_error)", type(error).__name__,
                      error, exc_info=error)
            if cut:
                await connection.cut_off()
