"""``headlab serve``: run the app on uvicorn, with a warning when it is reachable from outside."""

from __future__ import annotations

import ipaddress
import socket
import threading
import webbrowser

from rich.console import Console

LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and "localhost"; False for 0.0.0.0 and every other address."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_port(host: str, port: int) -> None:
    """Raise ValueError with a clear message when ``host:port`` cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host.strip("[]"), port))
        except OSError as exc:
            raise ValueError(
                f"cannot listen on {host}:{port} ({exc.strerror}); pick another --port, "
                "or --host 127.0.0.1"
            ) from None


def run_server(host: str, port: int, open_browser: bool, console: Console) -> None:
    """Start uvicorn on host:port and block until Ctrl-C."""
    import uvicorn

    from headlab.server.app import LOOPBACK_HOSTS, create_app

    check_port(host, port)
    # Requests run side by side on a few cores: one intra-op thread each. With torch's default
    # (a thread per core) a loaded 2-core machine answered /api/attention ~20x slower.
    import torch

    torch.set_num_threads(1)
    allowed: tuple[str, ...] = LOOPBACK_HOSTS
    if not is_loopback(host):
        console.print(
            f"[bold yellow]warning:[/] binding to {host} makes the explainer reachable from other "
            "machines on your network; it has no authentication. Use --host 127.0.0.1 to keep it "
            "local."
        )
        allowed = ("*",)
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}/"
    console.print(f"headlab explainer on {url}  (API docs: {url}docs; Ctrl-C stops)")
    if open_browser:
        threading.Timer(1.0, webbrowser.open, args=(url,)).start()
    uvicorn.run(
        create_app(allowed_hosts=allowed), host=host.strip("[]"), port=port, log_level="warning"
    )
