"""Live training runs for the page: one at a time per server, each on its own thread.

A run is :func:`headlab.experiments.induction.study` with a listener that hands every progress
event to the event loop of the request streaming it, and a ``stop`` callback that ends the run
when it is cancelled, when its client goes away, or when it runs out of time. Nothing is written
to disk. The route (``routes/live.py``) turns the events into server-sent events.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from headlab.experiments import induction as ind
from headlab.experiments import torch_threads

MAX_SECONDS = 600.0  # a run is stopped after this much wall time (a busy machine is slow)


class Busy(RuntimeError):
    """Another run is training; ``run_id`` names it."""

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id)
        self.run_id = run_id


@dataclass(frozen=True)
class Knobs:
    """What the reader sets: the seed, the number of layers and heads per layer."""

    seed: int = 0
    n_layers: int = 2
    n_heads: int = 4

    def config(self) -> ind.InductionConfig:
        """The live recipe with the reader's number of heads."""
        return replace(ind.LIVE, n_heads=self.n_heads)


@dataclass
class LiveRun:
    """One run: its id, its knobs, the thread training it and the queue its events go to."""

    knobs: Knobs
    loop: asyncio.AbstractEventLoop
    max_seconds: float
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    events: asyncio.Queue[dict[str, Any] | None] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    reason: str = "cancelled"
    started: float = field(default_factory=time.monotonic)
    thread: threading.Thread | None = None

    def cancel(self, reason: str = "cancelled") -> None:
        """Ask the run to stop before its next step."""
        if not self.cancelled.is_set():
            self.reason = reason
            self.cancelled.set()

    def stop_reason(self) -> str | None:
        """``study``'s stop callback: why the run should end now, or None."""
        if self.cancelled.is_set():
            return self.reason
        if time.monotonic() - self.started > self.max_seconds:
            return f"time limit: stopped after {self.max_seconds:.0f} s"
        return None

    def push(self, event: dict[str, Any] | None) -> None:
        """Hand an event (None: the end) to the streaming request's loop, from any thread."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the loop is closed: the server is shutting down
            self.cancel("server stopped")

    def describe(self) -> dict[str, Any]:
        return {"run_id": self.id, **asdict(self.knobs), "recipe": asdict(self.knobs.config()),
                "max_seconds": self.max_seconds}  # fmt: skip


class LiveRuns:
    """The server's live runs: at most one trains at a time."""

    def __init__(self, max_seconds: float = MAX_SECONDS, threads: int = 1) -> None:
        self.max_seconds = max_seconds
        self.threads = threads  # torch threads of a run (settings.live_threads)
        self._lock = threading.Lock()
        self.current: LiveRun | None = None

    def start(self, knobs: Knobs, loop: asyncio.AbstractEventLoop) -> LiveRun:
        """Start a run on a new thread; :class:`Busy` if one is training."""
        with self._lock:
            if self.current is not None:
                raise Busy(self.current.id)
            run = LiveRun(knobs, loop, self.max_seconds)
            self.current = run
        run.thread = threading.Thread(target=self._work, args=(run,), name=f"live-{run.id}")
        run.thread.start()
        return run

    def cancel(self, run_id: str) -> bool:
        """Cancel run ``run_id``; False if no such run is training."""
        with self._lock:
            run = self.current
        if run is None or run.id != run_id:
            return False
        run.cancel()
        return True

    def running(self) -> str | None:
        with self._lock:
            return None if self.current is None else self.current.id

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the running run and wait for its thread (the app's lifespan ends)."""
        with self._lock:
            run = self.current
        if run is not None:
            run.cancel("server stopped")
            if run.thread is not None:
                run.thread.join(timeout)

    def _work(self, run: LiveRun) -> None:
        knobs = run.knobs
        try:
            with torch_threads(self.threads):
                ind.study(knobs.config(), knobs.n_layers, knobs.seed,
                          listener=run.push, stop=run.stop_reason)  # fmt: skip
            run.push({"event": "done", "run_id": run.id})
        except ind.Stopped as stopped:
            run.push({"event": "stopped", "run_id": run.id, "reason": str(stopped)})
        except Exception as exc:  # a bug must end the stream with a message, not hang it
            run.push({"event": "error", "run_id": run.id, "detail": f"{type(exc).__name__}: {exc}"})
        finally:
            with self._lock:
                self.current = None
            run.push(None)
