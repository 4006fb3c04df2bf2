"""Live training runs for the page: one at a time per server, each on its own thread.

A run is :func:`headlab.experiments.induction.study` with a listener that hands every event of
the watched run (:mod:`headlab.training.watch`) to the event loop of the request streaming it,
and a :class:`~headlab.training.train.StopToken` that ends the run when it is cancelled, when its
client goes away, or when it runs out of time; the run ends with Done, Cancelled or Failed.
Nothing is written to disk. The route (``routes/live.py``) turns the events into server-sent
events. :data:`LIVE_KNOBS` is the one statement of what a reader may set: the route validates
requests against it and serves it, and the page builds its controls from it.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from headlab.experiments import induction as ind
from headlab.files import torch_threads
from headlab.training.train import StopToken
from headlab.training.watch import Cancelled, Done, Event, Failed

MAX_SECONDS = 600.0  # a run is stopped after this much wall time (a busy machine is slow)


@dataclass(frozen=True)
class Knob:
    """One thing the reader sets: whole numbers in ``low..high``, or one of ``choices``."""

    label: str  # what the page writes beside the control
    default: int
    help: str  # what it changes
    low: int = 0  # a range's bounds, inclusive (unused when there are choices)
    high: int = 0
    choices: tuple[tuple[int, str], ...] = ()  # (value, what the page's option says)

    def problem(self, value: int) -> str | None:
        """Why ``value`` is refused, in words naming what is valid; None when it is allowed."""
        if self.choices:
            valid = [v for v, _ in self.choices]
            return None if value in valid else f"should be one of {', '.join(map(str, valid))}"
        return None if self.low <= value <= self.high else f"should be in {self.low}..{self.high}"

    def describe(self) -> dict[str, Any]:
        """The knob as ``GET /api/live`` serves it."""
        if self.choices:
            options = [{"value": v, "text": t} for v, t in self.choices]
            return {"label": self.label, "default": self.default, "help": self.help,
                    "choices": options}  # fmt: skip
        return {"label": self.label, "default": self.default, "help": self.help,
                "min": self.low, "max": self.high}  # fmt: skip


LIVE_KNOBS = {
    "seed": Knob("seed", 0, "seeds the weights and the data", low=0, high=9999),
    "n_layers": Knob("layers", 2, "1 cannot form an induction head; 2 can",
                     choices=((2, "2 layers"), (1, "1 layer (control)"))),
    "n_heads": Knob("heads per layer", 4, "heads per layer (d_model stays 64)",
                    choices=((2, "2"), (4, "4"), (8, "8"))),
}  # fmt: skip


class Busy(RuntimeError):
    """Another run is training; ``run_id`` names it."""

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id)
        self.run_id = run_id


@dataclass(frozen=True)
class Knobs:
    """What the reader sets: the seed, the number of layers and heads per layer."""

    seed: int = LIVE_KNOBS["seed"].default
    n_layers: int = LIVE_KNOBS["n_layers"].default
    n_heads: int = LIVE_KNOBS["n_heads"].default

    def config(self) -> ind.InductionConfig:
        """The live recipe with the reader's number of heads."""
        return replace(ind.LIVE, n_heads=self.n_heads)


@dataclass
class LiveRun:
    """One run: its id, its knobs, the thread training it, the queue its events go to and the
    token that stops it (its clock starts here)."""

    knobs: Knobs
    loop: asyncio.AbstractEventLoop
    max_seconds: float
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    events: asyncio.Queue[Event | None] = field(default_factory=asyncio.Queue)
    thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        self.token = StopToken(self.max_seconds)

    def cancel(self, reason: str = "cancelled") -> None:
        """Ask the run to stop before its next step."""
        self.token.stop(reason)

    def push(self, event: Event | None) -> None:
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
                result = ind.study(knobs.config(), knobs.n_layers, knobs.seed,
                                   listener=run.push, stop=run.token)  # fmt: skip
            stopped = Cancelled(run.id, run.token.reason or "stopped")
            run.push(Done(run.id) if result is not None else stopped)
        except Exception as exc:  # a bug must end the stream with a message, not hang it
            run.push(Failed(run.id, f"{type(exc).__name__}: {exc}"))
        finally:
            with self._lock:
                self.current = None
            run.push(None)
