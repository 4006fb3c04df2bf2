"""uvicorn's HTTP protocol with bounds on what a client may hold: connections, time and header size.

uvicorn bounds none of these by itself: a connection that sends nothing is kept forever (its
keep-alive timer starts only after a first answer), a request's headers may trickle in a byte
at a time or grow without limit (httptools has no size limit: a 20 MB header was read and
answered), and every connection holds a file handle (200 half-sent bodies and 300 idle
connections held 316). Here, per connection:

- a request must arrive whole, headers first, within ``client_timeout`` seconds of the
  connection opening or of the last answer; else the connection is closed (408 if a request
  had begun). The body's own deadline is the app's (:class:`headlab.server.security.BodyLimit`);
- a request's head (request line and headers) over ``max_head_bytes`` is refused with 431;
- at most ``max_connections`` are held at once (:func:`connection_limit`: half the process's
  file handles, up to 4,096). A connection beyond them takes the place of the one that has
  waited longest on its client (idle, or its request not yet whole), which is closed (503 if a
  request had begun); only when every connection is being answered is the new one closed.
  Slow clients therefore never lock others out: with a fixed count of 200 and the newest
  refused, 200 half-sent bodies had every other client reset until their own timeout. A
  connection whose request is whole is never closed for another.

Every answer sent here carries the security headers, as the app's do. A refused connection is
half-closed and drained for a moment (a "lingering close") so the client reads the answer instead
of a reset.
"""

from __future__ import annotations

import asyncio
import json
from http import HTTPStatus
from typing import Any

MAX_HEAD_BYTES = 64 * 1024  # a request line and headers; a browser sends well under 16 KiB
MAX_CONNECTIONS = 4096  # open at once, whatever the file handle limit; the page opens about six
LINGER_SECONDS = 2.0  # how long a refused connection's input is drained before it is closed


try:  # uvicorn's C parser (httptools is a dependency); without it uvicorn runs its own h11
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover
    HttpToolsProtocol = object  # type: ignore[assignment,misc]


def connection_limit() -> int:
    """How many connections the server holds at once: half the file handles this process may
    open (the other half is left to the model files, caches and libraries), at most
    :data:`MAX_CONNECTIONS`. Past the handle limit the system refuses ``accept`` itself, and
    asyncio then stops accepting anyone for a second."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):  # pragma: no cover (no resource: Windows)
        return 512
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(1, min(MAX_CONNECTIONS, soft // 2))


def guarded_protocol(
    client_timeout: float,
    max_head_bytes: int = MAX_HEAD_BYTES,
    max_connections: int | None = None,
) -> Any:
    """uvicorn's httptools protocol bounded as the module says (``max_connections``: by default
    :func:`connection_limit`), or ``"auto"`` when httptools is missing (uvicorn's h11 then
    bounds the head size through its config)."""
    if HttpToolsProtocol is object:  # pragma: no cover
        return "auto"
    from headlab.server.security import static_headers

    limit = connection_limit() if max_connections is None else max_connections
    bounds = {
        "client_timeout": client_timeout,
        "max_head_bytes": max_head_bytes,
        "max_connections": limit,
        "extra": static_headers(),
    }
    return type("GuardedProtocol", (GuardedProtocol,), bounds)


class GuardedProtocol(HttpToolsProtocol):
    """httptools' protocol with the bounds :func:`guarded_protocol` sets as class attributes,
    and the security headers on every answer it sends itself."""

    client_timeout: float
    max_head_bytes: int
    max_connections: int
    extra: list[tuple[bytes, bytes]]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._in_head, self._head_bytes, self._refused = False, 0, False
        self._deadline: asyncio.TimerHandle | None = None
        self._waiting_since = self.loop.time()  # idle from now: the order in which to give way
        if len(self.connections) > self.max_connections and not self._make_room():
            transport.close()  # every connection held is being answered
            return
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # lingering: drained, never parsed
        super().data_received(data)
        if self._in_head and not self.transport.is_closing():
            self._head_bytes += len(data)  # all of it was head: the head is not over
            if self._head_bytes > self.max_head_bytes:
                self._refuse(431, f"request headers over {self.max_head_bytes} bytes")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._head_bytes = True, 0
        if self._deadline is None:
            self._arm()

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm()  # from here the app bounds the body, and answers in its own time
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and not self.pipeline:
            self._waiting_since = self.loop.time()
            self._arm()  # the next request, if any, must come in time

    def waits_on_client(self) -> bool:
        """True while nothing here is the server's to do: the connection is idle, its request
        is not yet whole, its answer waits for the client to read it, or it was refused."""
        cycle = self.cycle
        if self._refused or cycle is None or cycle.response_complete:
            return True
        return not self.pipeline and (cycle.more_body or self.flow.write_paused)

    def _make_room(self) -> bool:
        """At the limit: close the connection that has waited longest on its client (one
        already refused first), so this one takes its place; False when none waits."""
        held = [c for c in self.connections if c is not self and not c.transport.is_closing()]
        if len(held) < self.max_connections:
            return True  # the rest are closing already
        waiting = [c for c in held if isinstance(c, GuardedProtocol) and c.waits_on_client()]
        if not waiting:
            return False
        longest = min(waiting, key=lambda c: (not c._refused, c._waiting_since))
        longest._give_way()
        return True

    def _give_way(self) -> None:
        """Close this connection for a newer one: a request begun is answered 503 first."""
        cycle = self.cycle
        idle = not self._in_head and (cycle is None or cycle.response_complete)
        if self._refused or idle:
            self._disarm()
            self.transport.close()
            return
        msg = (
            f"the server holds at most {self.max_connections} connections and gave this one, "
            "which had waited longest for its request, to another client; send each request "
            "whole at once"
        )
        self._refuse(503, msg, linger=False)  # closed now: its place is taken at once

    def send_400_response(self, msg: str) -> None:
        state = self.server_state
        defaults = state.default_headers
        state.default_headers = defaults + self.extra  # one event loop: nothing else runs now
        try:
            super().send_400_response(msg)
        finally:
            state.default_headers = defaults

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.client_timeout, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self._in_head:
            self._refuse(408, f"request headers not received within {self.client_timeout:g} s")
        elif not self.transport.is_closing():
            self.transport.close()  # nothing asked: an idle connection

    def _refuse(self, status: int, msg: str, linger: bool = True) -> None:
        """Answer ``status`` (when no other answer is being written), then close: after a
        lingering close, or at once (when the answer is written) if not ``linger``."""
        self._refused = True
        self._disarm()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            if cycle.response_started or not cycle.more_body or self.pipeline:
                self.transport.close()  # an answer is under way: it cannot be interleaved
                return
            # the app still waits for this request's body: it is told the client left, and
            # whatever it sends now is dropped, so this answer is the only one
            cycle.disconnected = True
            cycle.message_event.set()
        headers = self.server_state.default_headers + self.extra
        self.transport.write(_answer(status, msg, headers))
        if linger and self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER_SECONDS, self.transport.close)
        else:
            self.transport.close()


def _answer(status: int, msg: str, headers: list[tuple[bytes, bytes]]) -> bytes:
    """A whole HTTP/1.1 answer: ``{"detail": msg}`` as JSON, the given headers, then close."""
    body = json.dumps({"detail": msg}).encode()
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}".encode()]
    lines += [name + b": " + value for name, value in headers]
    lines += [
        b"content-type: application/json",
        b"content-length: " + str(len(body)).encode(),
        b"connection: close",
    ]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body
