"""uvicorn's HTTP/1.1 protocol (httptools) with every request head bounded in time and in bytes.

    uvicorn.Config(app, http=functools.partial(BoundedHeadProtocol, header_read_timeout_s=10,
                                               max_header_bytes=16_384))   # serve/app.py's uvicorn_options

uvicorn reads a request's head (request line and headers) without a deadline and, with httptools
(what it picks when installed), without a size cap: a connection that sends nothing, or half a
head, or a head one byte a second, is held until the client closes it, and enough of them fill
``limit_concurrency``. This protocol adds, per connection:

- **a head deadline**: a request's head must be complete ``header_read_timeout_s`` after its first
  byte arrived (a connection's first request: after the connection opened). Trickling bytes does
  not extend it. Past it, a head begun gets 408 ``header_timeout``; a connection that sent nothing
  is closed without an answer (there is no request to answer).
- **a head size cap**: more than ``max_header_bytes`` of head gets 431 ``headers_too_large``.
- **no unread body kept open**: a response sent before its request's body arrived in full (a route
  that answers without reading it) closes the connection. Otherwise the rest of that body, one
  byte at a time, would hold it: each byte disarms uvicorn's keep-alive timer.

The body itself is timed and capped by the app (serve/client_limits.py), and idle keep-alive
connections by uvicorn (``timeout_keep_alive``). Answers are the API's JSON error with
``Connection: close``; each refusal is one INFO log line and, once the app has started, a count
in ``tts_rejected_requests_total{reason}`` (the app's lifespan puts its counter into the lifespan
state under ``REFUSAL_COUNTER_STATE_KEY``, which uvicorn hands to every connection).
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

log = logging.getLogger(__name__)

REFUSAL_COUNTER_STATE_KEY = "tts.count_refusal"  # lifespan state: a callable(reason) counting a refusal
HEADER_LINE_FRAMING_BYTES = 4  # ": " and CRLF around each header, which the parser's callbacks leave out


class BoundedHeadProtocol(HttpToolsProtocol):
    """See the module docstring. Built by uvicorn per connection; the two limits come through a partial."""

    def __init__(self, config, server_state, app_state: dict[str, Any], _loop: asyncio.AbstractEventLoop | None = None,
                 *, header_read_timeout_s: float, max_header_bytes: int):
        super().__init__(config, server_state, app_state, _loop)
        self.header_read_timeout_s = header_read_timeout_s
        self.max_header_bytes = max_header_bytes
        self.head_deadline: asyncio.TimerHandle | None = None  # armed while a head is incomplete
        self.head_begun = False  # a byte of the pending head has arrived
        self.head_bytes = 0  # of the pending head: raw bytes while incomplete, parsed bytes once parsed
        self.body_complete = True  # the current request's body has arrived in full
        self.refused = False  # this connection got a refusal and is closing: the parser's events are ignored

    # The deadline: armed at the connection's start and at each new head, disarmed when a head is complete.
    def _arm_head_deadline(self) -> None:
        if self.head_deadline is None:
            self.head_deadline = self.loop.call_later(self.header_read_timeout_s, self._head_deadline_passed)

    def _disarm_head_deadline(self) -> None:
        if self.head_deadline is not None:
            self.head_deadline.cancel()
            self.head_deadline = None

    def _head_deadline_passed(self) -> None:
        self.head_deadline = None
        if self.transport.is_closing():
            return
        if self.head_begun:
            self._refuse(408, "header_timeout", f"the request headers were not complete within "
                                                f"serve.header_read_timeout_s={self.header_read_timeout_s:g} s "
                                                f"({self.head_bytes} bytes arrived)")
            return
        self._count("header_timeout")
        log.info("closed a connection from %s that sent no request within serve.header_read_timeout_s=%g s",
                 self._client_host(), self.header_read_timeout_s)
        self.transport.close()

    def _refuse(self, status_code: int, code: str, message: str) -> None:
        """Answer ``status_code`` with the API's JSON error and close; the rest of the connection is not read."""
        self.refused = True
        self._disarm_head_deadline()
        self._count(code)
        log.info("%d %s from %s: %s", status_code, code, self._client_host(), message)
        body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "code": code,
                                     "param": None}}).encode()
        head = [STATUS_LINE[status_code], b"content-type: application/json\r\n",
                b"content-length: %d\r\n" % len(body), b"connection: close\r\n"]
        head += [name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers]
        self.transport.write(b"".join(head) + b"\r\n" + body)
        self.transport.close()  # after the buffered answer is written

    def _count(self, reason: str) -> None:
        count = self.app_state.get(REFUSAL_COUNTER_STATE_KEY)
        if count is not None:
            count(reason)

    def _client_host(self) -> str:
        return self.client[0] if self.client else "?"

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_deadline()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        super().data_received(data)
        if self.head_deadline is not None and not self.refused and not self.transport.is_closing():
            # A head still incomplete after this data: all of it counts (at most one read of a pipelined
            # request's preceding body too, which only makes the cap stricter for that rare client).
            self.head_bytes += len(data)
            if self.head_bytes > self.max_header_bytes:
                self._refuse(431, "headers_too_large", f"the request headers passed serve.max_header_bytes="
                                                       f"{self.max_header_bytes} bytes before their end")

    # httptools parser callbacks
    def on_message_begin(self) -> None:
        if self.refused:
            return
        super().on_message_begin()
        self.head_begun, self.head_bytes = True, 0
        self._arm_head_deadline()

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        self.head_bytes += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        self.head_bytes += len(name) + len(value) + HEADER_LINE_FRAMING_BYTES

    def on_headers_complete(self) -> None:
        self._disarm_head_deadline()
        self.head_begun = False
        if self.head_bytes > self.max_header_bytes:  # a whole head that came in one read: refused, never run
            self._refuse(431, "headers_too_large", f"the request headers are {self.head_bytes} bytes; the limit is "
                                                   f"serve.max_header_bytes={self.max_header_bytes}")
            return
        self.head_bytes = 0
        self.body_complete = False
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self.refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        self.body_complete = True
        if not self.refused:
            super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.body_complete and not self.transport.is_closing():
            self._disarm_head_deadline()
            self.transport.close()  # the unread rest of the body must not hold the connection open
