"""`headlab serve` on a real uvicorn (issue 18, items 5, 7 and 8): the address it prints is the
one it serves (any loopback address, --port 0, IPv6 in brackets), bad hosts and busy ports are a
sentence, and what only a real HTTP server does is checked over sockets: uvicorn's own 400s carry
the security headers, no `server` banner, a chunked body over 64 KiB is 413, and a 500 keeps the
connection open."""

from __future__ import annotations

import contextlib
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
        conn.request(
            "POST",
            "/api/shapes",
            body=body,
            encode_chunked=True,
            headers={"content-type": "application/json"},
        )
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
    for refused, needle in (
        ("two", b"2 Host headers"),
        ("testserver", b"'testserver'"),
        ("none", b"without a Host header"),
    ):
        status, headers, body = asked[refused]
        assert status == 400 and _secure(headers), refused
        assert headers["content-type"] == "application/json" and needle in body, body
    status, get_headers, body = asked["get"]
    assert status == 200 and body.startswith(b"{")
    status, headers, body = asked["head"]
    assert status == 200 and body == b"" and _secure(headers)
    assert headers["content-length"] == get_headers["content-length"]
    assert headers["content-type"] == "application/json"


# --- a real `headlab serve` against slow, idle and oversized clients (issue 24) ---------------

CLIENT_TIMEOUT = 2  # HEADLAB_CLIENT_TIMEOUT of the served process: short, so the test is too
FILE_LIMIT = 512  # the served process's file handles (its soft RLIMIT_NOFILE): 256 connections
SERVE_WITH_FILE_LIMIT = f"""
import resource, runpy, sys
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, ({FILE_LIMIT}, hard))
sys.argv = ["headlab", "serve", "--port", "0"]
runpy.run_module("headlab.cli", run_name="__main__")
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[int, int]]:
    """`headlab serve --port 0` in its own process (its file handles are its own to count),
    with a client timeout of CLIENT_TIMEOUT seconds and FILE_LIMIT file handles: (pid, port)
    once it answers."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import headlab

    log = tmp_path_factory.mktemp("serve") / "serve.log"
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(headlab.__file__).parents[1]),
        "HEADLAB_CLIENT_TIMEOUT": str(CLIENT_TIMEOUT),
    }
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", SERVE_WITH_FILE_LIMIT],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline, port = time.monotonic() + 120, None
        while port is None or _answer("127.0.0.1", port, _get(port))[0] != 200:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
            found = re.search(r"http://127\.0\.0\.1:(\d+)/", log.read_text())
            port = int(found.group(1)) if found else None
            if port is not None:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=5).close()
                except OSError:
                    port = None
        yield proc.pid, port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _get(port: int, path: str = "/api/health") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode()


def _open_files(pid: int) -> int:
    import os

    return len(os.listdir(f"/proc/{pid}/fd"))


def _wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_half_sent_idle_and_trickling_clients_are_closed_within_the_timeout(served) -> None:
    """200 clients sending `Content-Length: 1000` and one byte, plus 300 idle ones, held 316
    file handles for ever. Here 50 of each, and 10 that send their headers a byte at a time,
    are all closed within the client timeout, and the server's handles come back down."""
    import selectors

    pid, port = served
    before = _open_files(pid)
    head = (
        f"POST /api/shapes HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
    ).encode()
    kinds: dict[socket.socket, str] = {}
    try:
        for kind in ("body",) * 50 + ("idle",) * 50 + ("trickle",) * 10:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.setblocking(False)
            kinds[s] = kind
            if kind == "body":
                s.sendall(head)
        opened = time.monotonic()
        assert _wait_for(lambda: _open_files(pid) >= before + 100, 10), "not all were accepted"
        said: dict[socket.socket, bytes] = {s: b"" for s in kinds}
        open_ = set(kinds)
        with selectors.DefaultSelector() as sel:
            for s in kinds:
                sel.register(s, selectors.EVENT_READ)
            sent = 0
            while open_ and time.monotonic() < opened + CLIENT_TIMEOUT + 10:
                for key, _ in sel.select(timeout=0.25):
                    try:
                        chunk = key.fileobj.recv(65536)
                    except ConnectionResetError:
                        chunk = b""
                    said[key.fileobj] += chunk
                    if not chunk:  # closed by the server
                        open_.discard(key.fileobj)
                        sel.unregister(key.fileobj)
                trickle = b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\n"[sent : sent + 1]
                sent += 1
                for s in [s for s in open_ if kinds[s] == "trickle"]:
                    s.send(trickle or b"X")  # a header that never ends
        closed_after = time.monotonic() - opened
        assert not open_, f"{len(open_)} connections still open: {sorted(kinds[s] for s in open_)}"
        assert closed_after < CLIENT_TIMEOUT + 5, closed_after
        assert all(b" 408 " in said[s] for s in kinds if kinds[s] in ("body", "trickle"))
        assert all(said[s] == b"" for s in kinds if kinds[s] == "idle")
        assert _wait_for(lambda: _open_files(pid) <= before + 2, 10), (before, _open_files(pid))
        assert _answer("127.0.0.1", port, _get(port))[0] == 200  # and it still serves
    finally:
        for s in kinds:
            s.close()


def test_a_20_mb_header_is_refused_with_431(served) -> None:
    """A 20 MB header was read whole and answered 200."""
    _, port = served
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(f"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Big: ".encode())
        sent = 0
        try:
            while sent < 20 * 2**20:
                s.sendall(b"x" * 65536)
                sent += 65536
            s.sendall(b"\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused while it was being sent
        data = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := s.recv(65536):
                data += chunk
    assert data.startswith(b"HTTP/1.1 431 "), data[:200]
    lines = data.split(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
    assert _secure(dict(line.split(": ", 1) for line in lines[1:]))
    assert b"request headers over 65536 bytes" in data


def test_connections_beyond_the_limit_take_the_place_of_idle_ones(served) -> None:
    """However many clients connect, the server holds at most half its file handles' worth of
    them (FILE_LIMIT / 2); one more is answered in the place of an idle one (issue 43: at a
    fixed limit of 200 every newcomer was closed unanswered)."""
    pid, port = served
    limit = FILE_LIMIT // 2
    before = _open_files(pid)
    clients = []
    try:
        for _ in range(limit + 20):
            clients.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        _wait_for(lambda: _open_files(pid) >= before + limit, 10)
        time.sleep(0.3)
        assert _open_files(pid) <= before + limit + 2
        assert _answer("127.0.0.1", port, _get(port))[0] == 200
    finally:
        for s in clients:
            s.close()
    assert _wait_for(lambda: _open_files(pid) <= before + 2, CLIENT_TIMEOUT + 10)


def test_make_serve_installs_what_serving_needs_and_make_test_the_development_set(tmp_path):
    """`make serve` installed the whole development set (Playwright, spaCy, schemathesis: a
    2.3 GB .venv) though serving the default model needs headlab's own dependencies alone;
    `make test` installs the development set. Both from the lock (locks/serve.txt, locks/dev.txt).
    Read from make's own plan (make -n), nothing installed."""
    import shutil
    import subprocess
    from pathlib import Path

    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    root = Path(__file__).resolve().parents[2]

    def plan(target: str) -> str:
        done = subprocess.run(
            [make, "-n", target, f"VENV={tmp_path / 'venv'}"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout

    serve, test = plan("serve"), plan("test")
    installs = [line for line in serve.splitlines() if "uv pip" in line]
    assert any(line.endswith("-r locks/serve.txt") for line in installs), serve
    assert any(line.endswith("-e .") for line in installs), serve
    assert "locks/dev.txt" not in serve and "[" not in " ".join(installs), serve
    assert "headlab serve" in serve
    assert "locks/dev.txt" in test
    # the serving lock holds PyTorch's CPU build and none of the development set
    lock = (root / "locks" / "serve.txt").read_text()
    assert re.search(r"^torch==2\.13\.0\+cpu ", lock, re.M)
    for dev_only in ("playwright", "spacy", "schemathesis", "transformers", "pytest"):
        assert not re.search(rf"^{dev_only}==", lock, re.M), dev_only
