"""Slow clients never lock others out of a real `headlab serve` (issue 43): 200 half-sent bodies
had every other connection reset until their own timeout (a fixed limit of 200 connections, the
newest refused). Here the body timeout is long, so every holder is still waiting while the
others are asked: they must be answered because the server has room, or because the connection
that has waited longest on its client gives way, never because a timeout freed a slot."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from headlab.server import cli as server_cli
from headlab.server import create_app, protocol

SHAPES = b'{"d_model": 64, "n_heads": 4}'  # a whole body: POST /api/shapes answers it with 200


@contextlib.contextmanager
def serving(app, monkeypatch) -> Iterator[tuple[int, object]]:
    """``app`` on headlab's uvicorn settings in a thread, with a client timeout of 600 s:
    (port, uvicorn's server state: its connections and tasks)."""
    monkeypatch.setenv("HEADLAB_CLIENT_TIMEOUT", "600")
    sock = server_cli.bind("127.0.0.1", 0)
    server = server_cli.make_server(app)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    assert _wait_for(lambda: server.started or not thread.is_alive()) and server.started
    try:
        yield sock.getsockname()[1], server.server_state
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def _wait_for(condition: Callable[[], bool], seconds: float = 60) -> bool:
    """Poll ``condition`` until it holds (True) or ``seconds`` pass (False)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _hold(port: int) -> socket.socket:
    """A client that sends a POST's headers and the first byte of its body, then waits."""
    head = (
        f"POST /api/shapes HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json"
        f"\r\nContent-Length: {len(SHAPES)}\r\n\r\n"
    ).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(head + SHAPES[:1])
    return s


def _head(s: socket.socket, whole: bool = False) -> bytes:
    """What the server sends on ``s`` up to the end of an answer's headers (``whole``: until it
    closes the connection); b"" when it closed or reset it unanswered."""
    data = b""
    with contextlib.suppress(OSError):
        while (whole or b"\r\n\r\n" not in data) and (chunk := s.recv(65536)):
            data += chunk
    return data


def _finish(s: socket.socket) -> bytes:
    """Send the rest of a held body; the head of its answer."""
    with contextlib.suppress(OSError):
        s.sendall(SHAPES[1:])
    return _head(s)


def _ask(port: int, clients: list[socket.socket]) -> bytes:
    """GET /api/health on a new keep-alive connection, left open and added to ``clients``; the
    head of its answer (b"": closed or reset unanswered)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    clients.append(s)
    with contextlib.suppress(OSError):
        s.sendall(f"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    return _head(s)


def _ok(head: bytes) -> bool:
    return head.startswith(b"HTTP/1.1 200 ")


def test_200_half_sent_bodies_leave_room_for_other_clients(monkeypatch) -> None:
    """With 200 bodies half sent and all still open, 10 other requests are answered, and then
    every holder, finishing its body, is answered too: none was dropped to make room."""
    holders: list[socket.socket] = []
    others: list[socket.socket] = []
    with serving(create_app(preload=()), monkeypatch) as (port, state):
        try:
            for _ in range(200):
                holders.append(_hold(port))
            # each holder's head parsed: its request is waiting on the body inside the app
            assert _wait_for(lambda: len(state.tasks) >= 200), len(state.tasks)
            answered = [_ask(port, others) for _ in range(10)]
            assert all(_ok(a) for a in answered), answered
            assert len(state.tasks) >= 200  # the holders are still waiting on their bodies
            finished = [_finish(s) for s in holders]
            assert all(_ok(a) for a in finished), {a[:40] for a in finished}
        finally:
            for s in holders + others:
                s.close()


def test_at_the_limit_the_client_waiting_longest_gives_way(monkeypatch) -> None:
    """At a limit of 8 connections, two being answered and six half-sent bodies: each new client
    is answered, the oldest half-sent bodies give way one each (a 503 saying why), the newer
    ones and the two being answered are kept."""
    monkeypatch.setattr(protocol, "connection_limit", lambda: 8)
    release = threading.Event()
    app = create_app(preload=())

    def held() -> dict:
        release.wait(timeout=60)
        return {"held": True}

    app.add_api_route("/api/held", held)
    clients: list[socket.socket] = []
    with serving(app, monkeypatch) as (port, state):
        try:
            for _ in range(2):  # requests the app is working on: never closed for another
                busy = socket.create_connection(("127.0.0.1", port), timeout=30)
                busy.sendall(f"GET /api/held HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
                clients.append(busy)
            assert _wait_for(lambda: len(state.tasks) == 2)
            for i in range(6):  # one at a time, so they are held in this order
                clients.append(_hold(port))
                assert _wait_for(lambda i=i: len(state.tasks) == 3 + i)
            asked = [_ask(port, clients) for _ in range(3)]  # each stays open when answered
            assert all(_ok(a) for a in asked), asked
            release.set()
            busy, holders = clients[:2], clients[2:8]
            assert all(_ok(_head(s)) for s in busy)
            # the oldest three: answered and closed already
            gave_way = [_head(s, whole=True) for s in holders[:3]]
            assert all(a.startswith(b"HTTP/1.1 503 ") for a in gave_way), gave_way
            assert all(b"holds at most 8 connections" in a for a in gave_way), gave_way
            kept = [_finish(s) for s in holders[3:]]
            assert all(_ok(a) for a in kept), kept
        finally:
            release.set()
            for s in clients:
                s.close()


@pytest.mark.parametrize(("soft", "limit"), [(1024, 512), (200, 100), (10**6, 4096)])
def test_the_connection_limit_is_half_the_file_handles(monkeypatch, soft, limit) -> None:
    """The limit leaves half of the process's file handles to everything else, up to 4,096."""
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda _: (soft, resource.RLIM_INFINITY))
    assert protocol.connection_limit() == limit
