"""The server's size limits, as settings read from the environment when the app is imported
(``headlab serve --max-tokens N --max-text-chars N`` sets them for you).

    HEADLAB_MAX_TOKENS      tokens one request may run (default 128, at most 4,096)
    HEADLAB_MAX_TEXT_CHARS  characters in a request's text (default 2,000, at most 100,000)
    HEADLAB_LIVE_THREADS    torch threads of a live run left on "auto" (default: unset, chosen
                            per run from the machine's load, headlab.server.live.auto_threads)
    HEADLAB_CLIENT_TIMEOUT  seconds a client may take to send a request's headers, or its body,
                            or to start a request on a new connection (default 10, at most 3,600)

Each is a whole number written in ASCII digits: "１２" (full-width) is refused, not read as 12.

Whatever the settings, an answer holds at most :data:`MAX_WEIGHTS` per-head weights
(layers · h · n²): a model with more heads gets a shorter token limit (see
:func:`headlab.zoo.token_budget`), so no setting lets one request build an unbounded answer.
The request body limit grows with the text limit (4 bytes a character, plus room for the rest).
"""

from __future__ import annotations

import os

MAX_WEIGHTS = 8_000_000  # about 60 MB of JSON at 4 decimals
LIMITS = {  # name: (default, ceiling)
    "HEADLAB_MAX_TOKENS": (128, 4096),
    "HEADLAB_MAX_TEXT_CHARS": (2000, 100_000),
    "HEADLAB_LIVE_THREADS": (1, 256),  # unset: live_threads() is None, the server's auto rule
    "HEADLAB_CLIENT_TIMEOUT": (10, 3600),
}


def setting(name: str) -> int:
    """The value of one of :data:`LIMITS` from the environment, or its default; a ValueError
    with one sentence when it is not a whole number in 1..ceiling."""
    default, ceiling = LIMITS[name]
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    # str.isdigit and int() also take other scripts' digits ("１２", "٣"): ASCII digits only
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= ceiling:
        raise ValueError(
            f"{name}={raw!r} is not valid; give a whole number from 1 to {ceiling:,} in ASCII "
            "digits (0-9)"
        )
    return int(raw)


def max_tokens() -> int:
    return setting("HEADLAB_MAX_TOKENS")


def max_text_chars() -> int:
    return setting("HEADLAB_MAX_TEXT_CHARS")


def live_threads() -> int | None:
    """Torch threads of a live training run whose reader left threads on "auto": None when
    HEADLAB_LIVE_THREADS is unset, for the server's rule on the machine's load
    (:func:`headlab.server.live.auto_threads`: on a machine busier than its cores one thread,
    which slows little, where two wait on each other and slowed 12-23×)."""
    if not os.environ.get("HEADLAB_LIVE_THREADS", "").strip():
        return None
    return setting("HEADLAB_LIVE_THREADS")


def client_timeout() -> int:
    """Seconds a client may take to start a request on a new or idle connection, to send its
    headers, or to send its body; a connection that takes longer is closed (a body: 408)."""
    return setting("HEADLAB_CLIENT_TIMEOUT")


def max_body_bytes() -> int:
    """The request body limit: 64 KiB, or room for the longest text in UTF-8 if that is more."""
    return max(64 * 1024, 4 * max_text_chars() + 4096)
