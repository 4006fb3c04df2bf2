"""The server's guard rails: security headers on every answer, a bounded and checked request
body, a JSON 500 instead of a dropped connection, no CORS.

No ``CORSMiddleware`` is installed, so a page from another origin cannot read any answer. Host
headers are checked (see ``app.py``) so a DNS-rebinding page cannot reach the API either. The
400s that uvicorn's HTTP parser sends itself get the same headers (``server/cli.py``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
from collections.abc import Iterable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_BODY_BYTES = 64 * 1024
# deeper JSON than this is refused before parsing (the API's bodies are flat objects)
MAX_JSON_DEPTH = 32

log = logging.getLogger("headlab.server")

# The page loads only its own scripts, styles and images; figures export through blob: URLs.
PAGE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "font-src 'self'; connect-src 'self'; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'; form-action 'none'"
)
# Swagger UI (served from the local fastapi-offline package) sets inline styles.
DOCS_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'"
)
HEADERS = {
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
    # the page needs none of the powerful browser features
    "permissions-policy": (
        "accelerometer=(), camera=(), geolocation=(), gyroscope=(), magnetometer=(), "
        "microphone=(), payment=(), usb=()"
    ),
}


def static_headers(csp: str = PAGE_CSP) -> list[tuple[bytes, bytes]]:
    """Every security header, encoded for an ASGI or raw HTTP response."""
    pairs = {"content-security-policy": csp, **HEADERS}
    return [(k.encode(), v.encode()) for k, v in pairs.items()]


class SecurityHeaders:
    """Adds the CSP and the other security headers to every HTTP response, drops any
    ``server`` header, and answers an unhandled exception with a JSON 500 (logged), so that
    error answers carry the headers too and the connection stays usable."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        csp = DOCS_CSP if scope["path"].startswith(("/docs", "/swagger")) else PAGE_CSP
        started = False

        async def send_with_headers(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"server"]
                message["headers"] = kept + static_headers(csp)
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        except Exception:
            if started:  # half an answer is out: only closing the connection can end it
                raise
            log.exception("unhandled error answering %s %s", scope["method"], scope["path"])
            await send_json(
                send_with_headers,
                500,
                "internal error: the server could not "
                "answer this request; the server's log has the details",
            )


class HostCheck:
    """Answers a request only when it has exactly one Host header and that header names an
    allowed host (its port aside; ``"*"`` allows any): a DNS-rebinding page reaches 127.0.0.1
    under its own name, and a second Host header is a name some other reader may take instead.
    Refused with a JSON 400 naming the problem (Starlette's TrustedHostMiddleware read only
    the first Host header and answered in plain text)."""

    def __init__(self, app: ASGIApp, allowed_hosts: Iterable[str]) -> None:
        self.app = app
        self.allowed = tuple(dict.fromkeys(h.lower() for h in allowed_hosts))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        hosts = [v.decode("latin-1") for k, v in scope.get("headers", []) if k.lower() == b"host"]
        problem = self.problem(hosts)
        if problem is not None:
            await send_json(send, 400, problem)
            return
        await self.app(scope, receive, send)

    def problem(self, hosts: list[str]) -> str | None:
        """Why a request with these Host header values is refused, or None."""
        if len(hosts) > 1:
            return f"the request has {len(hosts)} Host headers; send exactly one"
        if "*" in self.allowed:
            return None
        name = _host_name(hosts[0]) if hosts else ""
        if name in self.allowed:
            return None
        said = f"the Host header {hosts[0]!r}" if hosts else "a request without a Host header"
        return f"{said} is not answered here; use one of: {', '.join(self.allowed)}"


def _host_name(value: str) -> str:
    """A Host header's name, lower-case, without its port (IPv6 keeps its brackets)."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[: value.find("]") + 1] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class HeadAsGet:
    """HEAD answers as GET would, without the body (RFC 9110, 9.3.2): FastAPI's GET routes
    take GET only, so HEAD was 405. The headers, ``content-length`` included, are GET's."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def without_body(message: Message) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, without_body)


class BodyLimit:
    """Reads the request body before the app does: over ``limit`` bytes, declared or streamed
    (chunked), is refused with 413; one not received whole within ``timeout`` seconds with 408
    (and the connection closed: a half-sent body held its connection forever); a JSON body
    that is not UTF-8 or nests deeper than ``MAX_JSON_DEPTH`` gets a readable 422. The app then
    reads the body from memory."""

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY_BYTES, timeout: float = 10.0) -> None:
        self.app = app
        self.limit = limit
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = f"request body is larger than {self.limit} bytes"
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await send_json(send, 413, too_large)
            return
        try:
            async with asyncio.timeout(self.timeout):
                body = await self._read(receive)
        except TimeoutError:
            late = f"request body not received within {self.timeout:g} s; send it whole at once"
            await send_json(send, 408, late, close=True)
            return
        if body is None:
            return  # the client went away
        if len(body) > self.limit:
            await send_json(send, 413, too_large)
            return
        problem = json_body_problem(scope, body)
        if problem is not None:
            await send_json(
                send,
                422,
                problem,
                errors=[{"loc": ["body"], "msg": problem, "type": "json_invalid"}],
            )
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()  # after the body: a disconnect, when it comes
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _read(self, receive: Receive) -> bytes | None:
        """The whole body, or as soon as it is over the limit the part read so far; None when
        the client goes away first."""
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                break
            more = message.get("more_body", False)
        return b"".join(chunks)


def json_body_problem(scope: Scope, body: bytes) -> str | None:
    """Why a JSON request body cannot be read (not UTF-8, nested too deep, an integer too long
    for Python to read), or None. Malformed JSON is left to the app, whose 422 says where it
    broke."""
    content_type = dict(scope.get("headers", [])).get(b"content-type", b"").lower()
    if not body or b"json" not in content_type:
        return None
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return (
            f"body is not UTF-8 text (byte {exc.start} is not valid UTF-8); send JSON encoded "
            "as UTF-8"
        )
    brackets = text.count("[") + text.count("{")  # a bound on the depth, counted in C
    if brackets > MAX_JSON_DEPTH and json_depth(text) > MAX_JSON_DEPTH:
        return (
            f"body nests arrays and objects more than {MAX_JSON_DEPTH} levels deep; send a "
            "flat JSON object of the fields in /docs"
        )
    return _long_integer_problem(text)


def _long_integer_problem(text: str) -> str | None:
    """Why JSON text holds an integer Python refuses to read (over ``sys.int_max_str_digits``
    digits: the app then answered 400 "error parsing the body"), or None. Parsed only when a
    run of that many digits is there at all, which may also be inside a string."""
    most = sys.get_int_max_str_digits()
    if not most or not re.search(rf"\d{{{most + 1}}}", text):
        return None
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return None  # malformed: the app's 422 says where
    except ValueError:
        field = re.search(rf'"([A-Za-z_]\w{{0,63}})"\s*:\s*-?\d{{{most + 1}}}', text)
        where = field.group(1) if field else "body"
        return (
            f"{where}: a number of more than {most:,} digits cannot be read; send a number "
            f"within {'its field' if where == 'body' else where}'s limits (/docs lists each "
            "field's least and greatest value)"
        )
    return None


def json_depth(text: str) -> int:
    """The deepest nesting of ``[`` and ``{`` in JSON text, brackets inside strings not counted
    (a plain scan: no recursion, so no input can exhaust the stack)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


async def send_json(
    send: Send, status: int, detail: str, errors: list | None = None, close: bool = False
) -> None:
    """A complete JSON error answer, ``{"detail": ..., "errors": [...]}`` as the app's own;
    ``close``: the server closes the connection after it."""
    content = {"detail": detail, **({"errors": errors} if errors is not None else {})}
    body = json.dumps(content).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
