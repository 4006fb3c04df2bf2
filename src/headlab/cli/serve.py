"""``headlab serve``: the explainer page and its API on one port."""

from __future__ import annotations

from typing import Any

import typer

from headlab.cli.common import err_console, fail


def _limit(most: int, help_text: str) -> Any:
    """An optional server limit, 1..``most``; unset, the server reads its environment."""
    return typer.Option(None, min=1, max=most, help=help_text)


def serve(
    host: str = typer.Option(
        "127.0.0.1", help="Address to bind (IPv6 with or without brackets); beyond loopback warns."
    ),
    port: int = typer.Option(8000, min=0, max=65535, help="TCP port; 0 picks a free one."),
    open_browser: bool = typer.Option(False, "--open", help="Open the page in a browser."),
    max_tokens: int | None = _limit(
        4096, "Tokens one request may run (default 128, or $HEADLAB_MAX_TOKENS; ≤ 4096)."
    ),
    max_text_chars: int | None = _limit(
        100_000, "Characters in a request's text (default 2000, or $HEADLAB_MAX_TEXT_CHARS)."
    ),
    live_threads: int | None = _limit(
        256,
        "Torch threads of a live run left on auto (default: chosen per run from the load, "
        "or $HEADLAB_LIVE_THREADS).",
    ),
    warm: bool = typer.Option(
        True,
        "--warm/--no-warm",
        envvar="HEADLAB_WARM",
        help="Compute each available model's one-time figures (composition scores, the "
        "page's random-weights floors) in the background after starting, once per machine "
        "(or $HEADLAB_WARM: 0 for none).",
    ),
) -> None:
    """Serve the explainer page and its API (FastAPI on uvicorn) on http://HOST:PORT."""
    import os

    # the limits are settings the server reads from the environment when it is imported
    for name, value in (
        ("HEADLAB_MAX_TOKENS", max_tokens),
        ("HEADLAB_MAX_TEXT_CHARS", max_text_chars),
        ("HEADLAB_LIVE_THREADS", live_threads),
    ):
        if value is not None:
            os.environ[name] = str(value)
    try:
        from headlab.server import settings

        settings.max_tokens(), settings.max_text_chars(), settings.live_threads()
        from headlab.server.cli import run_server

        run_server(host, port, open_browser, console=err_console, warm=warm)
    except ValueError as exc:
        raise fail(str(exc)) from None
