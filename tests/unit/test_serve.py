"""`headlab serve` on a real uvicorn (issue 18, items 5, 7 and 8): the address it prints is the
one it serves (any loopback address, --port 0, IPv6 in brackets), bad hosts and busy ports are a
sentence, and what only a real HTTP server does is checked over sockets: uvicorn's own 400s carry
the security headers, no `server` banner, a chunked body over 64 KiB is 413, and a 500 keeps the
connection open."""

from __future__ import annotations

import http.client
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from typer.testing import CliRunner

from headlab.cli import app as cli_app
from headlab.server import cli as server_cli
from headlab.server import create_app
from headlab.server.security import HEADERS, MAX_BODY_BYTES


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@contextmanager
def running(app, sock: socket.socket) -> Iterator[tuple[str, int]]:
    """Serve ``app`` on the bound ``sock`` with headlab's uvicorn settings, in a thread."""
    server = server_cli.make_server(app)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield sock.getsockname()[0], sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def _raw(host: str, port: int, request: bytes) -> tuple[int, dict[str, str]]:
    """Send bytes as they are; the status and headers of the answer."""
    with socket.create_connection((host, port), timeout=30) as s:
        s.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head = data.split(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in head[1:] if ": " in line)
    return int(head[0].split()[1]), {k.lower(): v for k, v in headers.items()}


def _secure(headers) -> bool:
    names = {k.lower() for k in headers}
    return {"content-security-policy", *HEADERS} <= names and "server" not in names


def _serve_cli(monkeypatch, *args: str, ask=None):
    """`headlab serve ARGS` with a real server on the socket it binds; each request is answered
    and the server stops. Returns (CLI result, {path: (status, headers)}); ``ask(host, port)``,
    if given, runs on the served app too and its answer is ``seen["asked"]``."""
    seen: dict = {}

    def serve_and_ask(app, sock) -> None:
        with running(app, sock) as (host, port):
            conn = http.client.HTTPConnection(host, port, timeout=30)
            conn.request("GET", "/api/health")
            r = conn.getresponse()
            seen["health"] = (r.status, dict(r.getheaders()), port)
            r.read()
            conn.close()
            if ask is not None:
                seen["asked"] = ask(host, port)

    monkeypatch.setattr(server_cli, "serve_forever", serve_and_ask)
    return CliRunner().invoke(cli_app, ["serve", *args]), seen


def test_any_loopback_address_and_port_0_serve_what_they_print(monkeypatch) -> None:
    """127.0.0.2 answered every request with 400 (not an allowed host); --port 0 printed 0."""
    result, seen = _serve_cli(monkeypatch, "--host", "127.0.0.2", "--port", "0")
    assert result.exit_code == 0, result.output
    status, headers, port = seen["health"]
    assert status == 200 and port != 0 and _secure(headers)
    assert f"http://127.0.0.2:{port}/" in result.output
    assert "warning" not in result.output  # loopback: not reachable from other machines


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback on this machine")
@pytest.mark.parametrize("host", ["::1", "[::1]"])
def test_ipv6_is_printed_in_brackets(monkeypatch, host: str) -> None:
    result, seen = _serve_cli(monkeypatch, "--host", host, "--port", "0")
    assert result.exit_code == 0, result.output
    status, _, port = seen["health"]
    assert status == 200
    assert f"http://[::1]:{port}/" in result.output


def test_url_for_formats_hosts() -> None:
    assert server_cli.url_for("::1", 8000) == "http://[::1]:8000/"
    assert server_cli.url_for("[::1]", 80) == "http://[::1]:80/"
    assert server_cli.url_for("0.0.0.0", 8000) == "http://127.0.0.1:8000/"
    assert server_cli.url_for("::", 1) == "http://[::1]:1/"
    assert server_cli.url_for("localhost", 5) == "http://localhost:5/"


@pytest.mark.parametrize(
    "host", ["[::1", "::1]", "[127.0.0.1]", "", "exa mple", "http://127.0.0.1", "a" * 300]
)
def test_a_malformed_host_is_refused_with_a_sentence(monkeypatch, host: str) -> None:
    monkeypatch.setattr(server_cli, "serve_forever", lambda app, sock: pytest.fail("served"))
    result = CliRunner().invoke(cli_app, ["serve", "--host", host, "--port", "0"])
    assert result.exit_code == 2, result.output
    assert "--host" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(("host", "hinted"), [("127.0.0.1", False), ("127.0.0.2", True)])
def test_a_busy_port_hint_names_only_what_would_help(host: str, hinted: bool) -> None:
    with socket.socket() as taken:
        taken.bind((host, 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(cli_app, ["serve", "--host", host, "--port", str(port)])
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert f"cannot listen on {host}:{port}" in text and "--port 0" in text
    assert ("--host 127.0.0.1" in text) is hinted


def test_uvicorns_own_400_carries_the_security_headers() -> None:
    """A request uvicorn cannot parse never reaches the app; its 400 has the headers too."""
    sock = server_cli.bind("127.0.0.1", 0)
    with running(create_app(preload=()), sock) as (host, port):
        status, headers = _raw(host, port, b"GET / HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n")
        assert status == 400 and _secure(headers)
        status, headers = _raw(host, port, b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert status == 200 and _secure(headers)


def test_a_real_chunked_upload_over_the_limit_is_413() -> None:
    sock = server_cli.bind("127.0.0.1", 0)
    with running(create_app(preload=()), sock) as (host, port):
        conn = http.client.HTTPConnection(host, port, timeout=30)
        body = (b"x" * 8192 for _ in range(MAX_BODY_BYTES // 8192 + 2))
        conn.request("POST", "/api/shapes", body=body, encode_chunked=True,
                     headers={"content-type": "application/json"})  # fmt: skip
        r = conn.getresponse()
        assert r.status == 413 and _secure(dict(r.getheaders()))
        assert re.search(rb"larger than \d+ bytes", r.read())


def test_a_500_keeps_the_connection_open() -> None:
    """Issue 18, item 1: after a 500 uvicorn dropped the keep-alive connection."""
    app = create_app(preload=())

    def broken() -> None:
        raise RuntimeError("a bug")

    app.add_api_route("/api/broken", broken)
    sock = server_cli.bind("127.0.0.1", 0)
    with running(app, sock) as (host, port):
        conn = http.client.HTTPConnection(host, port, timeout=30)
        conn.request("GET", "/api/broken")
        r = conn.getresponse()
        assert r.status == 500 and _secure(dict(r.getheaders())) and not r.will_close
        r.read()
        first = conn.sock
        conn.request("GET", "/api/health")
        again = conn.getresponse()
        assert again.status == 200 and conn.sock is first  # the same connection


def _no_resolver(monkeypatch) -> list[str]:
    """Record each host handed to getaddrinfo; a name that is not an IP literal fails the test
    (it would have asked the system resolver)."""
    import ipaddress

    asked: list[str] = []
    real = socket.getaddrinfo

    def numeric_only(host, *args, **kwargs):
        asked.append(host)
        ipaddress.ip_address(host)  # ValueError: a name lookup
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", numeric_only)
    return asked


@pytest.mark.parametrize("host", ["256.1.1.1", "1.2.3", "example.org", "localhost.", "0x7f.1"])
def test_a_host_that_is_no_ip_literal_is_refused_without_a_lookup(monkeypatch, host: str) -> None:
    """`serve --host 256.1.1.1` passed the check and asked the system resolver."""
    asked = _no_resolver(monkeypatch)
    monkeypatch.setattr(server_cli, "serve_forever", lambda app, sock: pytest.fail("served"))
    result = CliRunner().invoke(cli_app, ["serve", "--host", host, "--port", "0"])
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert f"--host {host!r} is not an IP address or localhost" in said, said
    assert "Traceback" not in result.output and asked == []


@pytest.mark.parametrize(
    ("host", "bound"), [("localhost", "127.0.0.1"), ("127.0.0.1", "127.0.0.1")]
)
def test_ip_literals_and_localhost_are_bound_without_a_lookup(monkeypatch, host, bound) -> None:
    asked = _no_resolver(monkeypatch)
    with server_cli.bind(host, 0) as sock:
        assert sock.getsockname()[0] == bound
    assert asked == [bound]


def _answer(host: str, port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send one request as bytes; the status, headers and body of the answer (read to EOF or
    to its content-length)."""
    with socket.create_connection((host, port), timeout=30) as s:
        s.sendall(request)
        data = b""
        while True:
            head, _, body = data.partition(b"\r\n\r\n")
            if _:
                lines = head.decode("latin-1").split("\r\n")
                headers = {k.lower(): v for k, v in (x.split(": ", 1) for x in lines[1:])}
                if len(body) >= int(headers.get("content-length", 1 << 62)):
                    return int(lines[0].split()[1]), headers, body
            chunk = s.recv(65536)
            if not chunk:
                return int(lines[0].split()[1]), headers, body
            data += chunk


def test_serve_answers_one_host_header_of_its_own_and_head_like_get(monkeypatch) -> None:
    """Two Host headers (127.0.0.1, then a foreign one) were answered; `Host: testserver` (the
    TestClient's) was accepted by a real serve; HEAD on a GET route was 405."""

    def ask(host: str, port: int) -> dict:
        get = f"GET /api/health HTTP/1.1\r\nHost: {host}:{port}\r\n"
        return {
            "two": _answer(host, port, (get + "Host: evil.example\r\n\r\n").encode()),
            "testserver": _answer(
                host, port, b"GET /api/health HTTP/1.1\r\nHost: testserver\r\n\r\n"
            ),
            "none": _answer(host, port, b"GET /api/health HTTP/1.0\r\n\r\n"),
            "get": _answer(host, port, (get + "\r\n").encode()),
            "head": _answer(
                host, port, (get.replace("GET", "HEAD", 1) + "Connection: close\r\n\r\n").encode()
            ),
        }

    result, seen = _serve_cli(monkeypatch, "--port", "0", ask=ask)
    assert result.exit_code == 0, result.output
    asked = seen["asked"]
    for refused, needle in (("two", b"2 Host headers"), ("testserver", b"'testserver'"),
                            ("none", b"without a Host header")):  # fmt: skip
        status, headers, body = asked[refused]
        assert status == 400 and _secure(headers), refused
        assert headers["content-type"] == "application/json" and needle in body, body
    status, get_headers, body = asked["get"]
    assert status == 200 and body.startswith(b"{")
    status, headers, body = asked["head"]
    assert status == 200 and body == b"" and _secure(headers)
    assert headers["content-length"] == get_headers["content-length"]
    assert headers["content-type"] == "application/json"
