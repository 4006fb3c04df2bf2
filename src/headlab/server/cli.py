"""``headlab serve``: run the app on uvicorn, with a warning when it is reachable from outside.

The socket is bound here, before the app starts, so a bad ``--host`` or a busy port is a one-line
error, ``--port 0`` prints the port the system picked, and the address printed is the address
served (IPv6 in brackets). uvicorn runs on that socket with its ``server`` header off, the
security headers on the answers its own HTTP parser sends, and each client bounded
(:mod:`headlab.server.protocol`).
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import webbrowser
from collections.abc import Callable
from typing import Any

from rich.console import Console

LOOPBACK_NAMES = ("localhost",)
# the one name taken, bound without asking a resolver (what "localhost" means on every system)
NAME_ADDRESSES = {"localhost": "127.0.0.1"}


def parse_host(host: str) -> str:
    """``host`` without IPv6 brackets; ValueError unless it is an IP address (IPv4, or IPv6 with
    or without brackets) or ``localhost``. No name is looked up: ``256.1.1.1`` or a DNS name
    would ask the system resolver, so they are refused here."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        address = ipaddress.ip_address(bare)
    except ValueError:
        if bare == host and host.lower() in NAME_ADDRESSES:
            return host.lower()
        raise ValueError(
            f"--host {host!r} is not an IP address or localhost; e.g. 127.0.0.1, ::1, 0.0.0.0 "
            "or localhost (host names are not looked up)"
        ) from None
    if bare != host and address.version != 6:
        raise ValueError(f"--host {host!r}: only IPv6 addresses go in brackets; use {bare}")
    return bare


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and "localhost"; False for 0.0.0.0 and every other address."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def url_for(host: str, port: int) -> str:
    """The page's URL for a server bound to ``host:port``: IPv6 in brackets, and the wildcard
    addresses (which accept every interface) shown as the loopback address."""
    host = parse_host(host)
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port``; ValueError with a clear message when it cannot be
    bound (a bad address, a busy port, no permission)."""
    bare = parse_host(host)
    numeric = NAME_ADDRESSES.get(bare, bare)
    try:  # a numeric host: getaddrinfo only parses it (AI_NUMERICHOST), never asks a resolver
        family, kind, proto, _, address = socket.getaddrinfo(
            numeric,
            port,
            type=socket.SOCK_STREAM,
            flags=socket.AI_PASSIVE | socket.AI_NUMERICHOST | socket.AI_NUMERICSERV,
        )[0]
    except (OSError, UnicodeError) as exc:
        raise ValueError(
            f"cannot listen on {host}: {exc}; use an address of this machine"
        ) from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        hint = "pick another --port (or --port 0 for a free one)"
        if bare != "127.0.0.1":
            hint += ", or --host 127.0.0.1"
        raise ValueError(f"cannot listen on {host}:{port} ({exc.strerror}); {hint}") from None
    sock.set_inheritable(True)
    return sock


def allowed_hosts(host: str, sock: socket.socket) -> tuple[str, ...]:
    """The Host headers the app answers: loopback names plus the address bound, or any host
    when the server is reachable from other machines."""
    from headlab.server.app import LOOPBACK_HOSTS

    if not is_loopback(parse_host(host)):
        return ("*",)
    bound = str(sock.getsockname()[0])
    names = {parse_host(host), bound}
    return tuple(dict.fromkeys([*LOOPBACK_HOSTS, *(f"[{n}]" if ":" in n else n for n in names)]))


def make_server(app: Any) -> Any:
    """The ``uvicorn.Server`` for ``app``: no ``server`` header, security headers on the answers
    uvicorn sends itself, warnings only in the log, and every client bounded in connections,
    time and header size (:mod:`headlab.server.protocol`; the body: the app's BodyLimit)."""
    import uvicorn

    from headlab.server.protocol import MAX_HEAD_BYTES, guarded_protocol
    from headlab.server.settings import client_timeout

    timeout = client_timeout()
    config = uvicorn.Config(
        app,
        log_level="warning",
        server_header=False,
        http=guarded_protocol(timeout),
        ws="none",  # the app has no WebSocket route: an upgrade is not taken
        lifespan="on",
        timeout_keep_alive=min(5, timeout),  # an idle keep-alive connection (uvicorn's default 5)
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,  # the head's bound if httptools is missing
    )
    return uvicorn.Server(config)


def serve_forever(app: Any, sock: socket.socket) -> None:
    """Run ``app`` on uvicorn on the bound socket until Ctrl-C."""
    make_server(app).run(sockets=[sock])


def run_server(
    host: str,
    port: int,
    open_browser: bool,
    console: Console,
    serve: Callable[[Any, socket.socket], None] | None = None,
    warm: bool = True,
) -> None:
    """Bind host:port, print the URL served, and run the app until Ctrl-C (``serve(app, sock)``,
    by default :func:`serve_forever`); with ``warm`` every available model's one-time figures
    are computed in the background (:mod:`headlab.server.warm`)."""
    from headlab.server import settings
    from headlab.server.app import create_app

    settings.client_timeout()  # a bad setting is a sentence before anything is bound
    sock = bind(host, port)
    # Requests run side by side on a few cores: one intra-op thread each. With torch's default
    # (a thread per core) a loaded 2-core machine answered /api/attention ~20x slower.
    import torch

    torch.set_num_threads(1)
    if not is_loopback(parse_host(host)):
        console.print(
            f"[bold yellow]warning:[/] binding to {host} makes the explainer reachable from other "
            "machines on your network; it has no authentication. Use --host 127.0.0.1 to keep it "
            "local."
        )
    url = url_for(host, sock.getsockname()[1])
    console.print(f"headlab explainer on {url}  (API docs: {url}docs; Ctrl-C stops)")
    if open_browser:
        threading.Timer(1.0, webbrowser.open, args=(url,)).start()
    with sock:
        app = create_app(allowed_hosts=allowed_hosts(host, sock), warm=None if warm else ())
        (serve or serve_forever)(app, sock)
