"""What one HTTP client may hold: its request body (a size cap and a read deadline) and its connection.

    app = ClientLimitsMiddleware(app, route_body_caps={"/v1/voices": BodyCap(10_064_000, "upload_too_large")},
                                 default_body_cap=BodyCap(1_000_000), body_read_timeout_s=30,
                                 on_refusal=metrics_counter)

A body declared larger than its route's cap answers 413 before a byte of it is read; a chunked
body that grows past the cap answers 413 as soon as it does; a body not complete within
``body_read_timeout_s`` of the request's headers answers 408 ``request_timeout``. Each answer is
the API's JSON error with ``Connection: close`` (the rest of the body is never read) and one INFO
log line. The limits wrap ``receive``, so they hold for JSON and multipart bodies, chunked or not,
whatever a route does with its body. Starlette turns an exception from ``receive`` into a 400
"error parsing the body"; this middleware drops that answer and sends its own.

``ClientConnection`` (in the scope under ``CONNECTION_SCOPE_KEY``) lets a response drop its
connection: ASGI can end a response only by completing it, and a stream cut short must end
without its final chunk, on a socket the client may never read again.
"""
from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from serve.errors import ApiError, error_response

log = logging.getLogger(__name__)

CONNECTION_SCOPE_KEY = "tts.connection"
# The status of this middleware's refusal, set before the route's own answer (which it drops) is sent:
# what the request is counted under (serve/metrics.py), since the client never sees the route's answer.
REFUSED_STATUS_SCOPE_KEY = "tts.refused_status"
MULTIPART_FRAMING_BYTES = 64_000  # an upload's multipart boundaries and headers, on top of the file's own bytes


@dataclass(frozen=True)
class BodyCap:
    """The most bytes a route's body may hold, and the error code a larger one gets (with 413)."""

    max_bytes: int
    code: str = "body_too_large"


class ClientConnection:
    """The connection under one request, as the server (uvicorn) holds it.

    It refers to uvicorn's request cycle weakly: the cycle owns the request's scope, where this object
    lives, and a strong reference back would make every request a reference cycle that only the
    garbage collector frees, holding its scope, body and response state until a full collection."""

    def __init__(self, server_send):
        cycle = getattr(server_send, "__self__", None)  # uvicorn's request cycle owns ``send`` and the transport
        self._cycle_ref = weakref.ref(cycle) if hasattr(cycle, "transport") else None
        self.cut = False

    def _cycle(self):
        """uvicorn's request cycle while it lives; None under a server without one (the test client)."""
        return None if self._cycle_ref is None else self._cycle_ref()

    @property
    def response_started(self) -> bool | None:
        """Whether the response's first message went out; None when the server is not reachable."""
        cycle = self._cycle()
        return None if cycle is None else bool(cycle.response_started)

    async def cut_off(self) -> None:
        """Drop the connection now, with whatever the kernel still holds for it: the client sees its
        response end early. Under a server without a reachable transport (the test client) the
        response only stops."""
        self.cut = True
        cycle = self._cycle()
        if cycle is None:
            return
        cycle.transport.abort()
        # uvicorn hears of the loss a loop turn later; a response that returned before would be logged
        # as "returned without completing response".
        for _ in range(100):
            if getattr(cycle, "disconnected", True):
                return
            await asyncio.sleep(0)


def client_connection(scope: dict) -> ClientConnection:
    """The scope's connection; a plain one when the middleware did not run (an app built without it)."""
    return scope.get(CONNECTION_SCOPE_KEY) or ClientConnection(None)


class _BodyReadAborted(Exception):
    """Raised from ``receive`` to stop the route reading a body this middleware refused."""


def _declared_length(scope: dict) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # uvicorn refuses a malformed Content-Length before the app sees it
    return None


class ClientLimitsMiddleware:
    """Caps and times every request body; see the module docstring. ``on_refusal(code)`` counts a refusal."""

    def __init__(self, app, *, route_body_caps: dict[str, BodyCap], default_body_cap: BodyCap,
                 body_read_timeout_s: float, on_refusal: Callable[[str], None]):
        self.app = app
        self.route_body_caps = route_body_caps
        self.default_body_cap = default_body_cap
        self.body_read_timeout_s = body_read_timeout_s
        self.on_refusal = on_refusal

    async def _refuse(self, scope, receive, send, error: ApiError) -> None:
        self.on_refusal(error.code)
        client = scope.get("client") or ("?", 0)
        log.info("%d %s: %s %s from %s: %s", error.status_code, error.code, scope["method"], scope["path"], client[0],
                 error.message)
        await error_response(error)(scope, receive, send)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope[CONNECTION_SCOPE_KEY] = ClientConnection(send)
        cap = self.route_body_caps.get(scope["path"], self.default_body_cap)
        declared_bytes = _declared_length(scope)
        if declared_bytes is not None and declared_bytes > cap.max_bytes:
            await self._refuse(scope, receive, send, ApiError(
                413, f"the request body is {declared_bytes} bytes; the limit for {scope['path']} is {cap.max_bytes}",
                cap.code, headers={"Connection": "close"}))
            return

        deadline_s = time.monotonic() + self.body_read_timeout_s
        received_bytes = 0
        body_done = False
        failure: ApiError | None = None
        response_started = False

        async def limited_receive():
            nonlocal received_bytes, body_done, failure
            if failure is not None:
                return {"type": "http.disconnect"}
            if body_done:  # after the body only a disconnect can come: no deadline
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(deadline_s - time.monotonic(), 0.0))
            except TimeoutError:
                failure = ApiError(408, f"the request body was not complete within serve.body_read_timeout_s="
                                        f"{self.body_read_timeout_s:g} s ({received_bytes} bytes arrived)",
                                   "request_timeout", headers={"Connection": "close"})
                scope[REFUSED_STATUS_SCOPE_KEY] = failure.status_code
                raise _BodyReadAborted(failure.message) from None
            if message["type"] != "http.request":
                body_done = True
                return message
            received_bytes += len(message.get("body", b""))
            if received_bytes > cap.max_bytes:
                failure = ApiError(413, f"the request body passed {cap.max_bytes} bytes, the limit for {scope['path']}",
                                   cap.code, headers={"Connection": "close"})
                scope[REFUSED_STATUS_SCOPE_KEY] = failure.status_code
                raise _BodyReadAborted(failure.message)
            body_done = not message.get("more_body", False)
            return message

        async def guarded_send(message):
            nonlocal response_started
            if failure is not None and not response_started:
                return  # the route's answer to a body it could not read: the refusal replaces it
            response_started = response_started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if failure is None or response_started:
                raise
        if failure is not None and not response_started:
            await self._refuse(scope, receive, send, failure)
