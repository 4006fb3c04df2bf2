"""Live training runs for the page: one at a time per server, each on its own thread.

A run is :func:`headlab.experiments.induction.study` with a listener that hands every event of
the watched run (:mod:`headlab.training.watch`) to the event loop of the request streaming it,
and a :class:`~headlab.training.train.StopToken` that ends the run when it is cancelled, when its
client goes away, or when it runs out of time; the run ends with Done, Cancelled or Failed.
Nothing is written to disk. The route (``routes/live.py``) turns the events into server-sent
events. :data:`LIVE_KNOBS` is the one statement of what a reader may set: the route validates
requests against it and serves it, and the page builds its controls from it.

Threads. A run trains on torch CPU threads, and how many matters more than anything else about
its speed: on a two-core machine with other work running, two threads wait on each other
(benchmarks/bench_live.py, load average about 8.6: 15× fewer steps a second than one thread,
21× beside one more busy process), while one thread slows little; on an idle machine two
threads are faster, by about 10% (seed 0: 9.1 s against 10.3 s to the phase change). The
reader picks 1, 2 … or "auto"; "auto" is
:func:`auto_threads`, a rule on the machine's load average over the last minute, read when the
run starts. The finished run says how long it took, on how many threads and why
(:func:`ending_text`).
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from headlab.experiments import induction as ind
from headlab.files import torch_threads
from headlab.training.train import StopToken
from headlab.training.watch import Cancelled, Done, Event, Failed, Listener, Step

MAX_SECONDS = 600.0  # a run is stopped after this much wall time (a busy machine is slow)


@dataclass(frozen=True)
class Knob:
    """One thing the reader sets: whole numbers in ``low..high``, or one of ``choices``."""

    label: str  # what the page writes beside the control
    default: int | str
    help: str  # what it changes
    low: int = 0  # a range's bounds, inclusive (unused when there are choices)
    high: int = 0
    choices: tuple[tuple[int | str, str], ...] = ()  # (value, what the page's option says)

    def problem(self, value: int | str) -> str | None:
        """Why ``value`` is refused, in words naming what is valid; None when it is allowed."""
        if self.choices:
            valid = [v for v, _ in self.choices]
            ok = any(type(value) is type(v) and value == v for v in valid)
            named = ", ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in valid)
            return None if ok else f"should be one of {named}"
        if isinstance(value, str):
            return f"should be a whole number in {self.low}..{self.high}"
        return None if self.low <= value <= self.high else f"should be in {self.low}..{self.high}"

    def describe(self) -> dict[str, Any]:
        """The knob as ``GET /api/live`` serves it."""
        if self.choices:
            options = [{"value": v, "text": t} for v, t in self.choices]
            return {
                "label": self.label,
                "default": self.default,
                "help": self.help,
                "choices": options,
            }
        return {
            "label": self.label,
            "default": self.default,
            "help": self.help,
            "min": self.low,
            "max": self.high,
        }


AUTO = "auto"  # the threads knob's value that leaves the count to auto_threads
AUTO_MOST = 2  # auto never picks more threads: the live model is small (d_model 64)
# a core counts as free when at least this share of it was idle over the last minute: two
# threads gain about 10% on an idle machine and lose 15-21x beside other work (module
# docstring), so auto asks for a nearly idle core before it trains on a second thread
FREE_SHARE = 0.75


def _thread_choices(cores: int) -> tuple[tuple[int | str, str], ...]:
    """auto, then 1, 2, 4 … up to the machine's cores (1 and 2 always)."""
    counts = [n for n in (1, 2, 4, 8, 16, 32, 64) if n <= max(2, cores)]
    auto = (AUTO, "auto (from the machine's load)")
    return (auto, *((n, f"{n} thread{'s' * (n > 1)}") for n in counts))


LIVE_KNOBS = {
    "seed": Knob("seed", 0, "seeds the weights and the data", low=0, high=9999),
    "n_layers": Knob(
        "layers",
        2,
        "1 cannot form an induction head; 2 can",
        choices=((2, "2 layers"), (1, "1 layer (control)")),
    ),
    "n_heads": Knob(
        "heads per layer",
        4,
        "heads per layer (d_model stays 64)",
        choices=((2, "2"), (4, "4"), (8, "8")),
    ),
    "threads": Knob(
        "threads",
        AUTO,
        "torch CPU threads the server trains on: one is safe on a "
        "busy machine, two are a little faster on an idle one; auto picks from the "
        "load",
        choices=_thread_choices(os.cpu_count() or 1),
    ),
}


def machine_load() -> float | None:
    """The machine's load average over the last minute (runnable processes, averaged), or None
    where the system reports none."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):  # Windows has no load average
        return None


def auto_threads(cores: int, load: float | None, most: int = AUTO_MOST) -> int:
    """The threads of an "auto" run: the cores at least :data:`FREE_SHARE` idle, given the load
    average ``load`` over the last minute, at least 1 and at most ``most``; 1 when the load is
    unknown (one thread is the choice that never collapses). E.g. on 2 cores: load 0.2 → 2,
    load 0.3 or more → 1."""
    if load is None or not math.isfinite(load):
        return 1
    free = math.floor(cores - max(0.0, load) + (1 - FREE_SHARE))
    return max(1, min(most, cores, free))


@dataclass(frozen=True)
class Threads:
    """The torch threads a run trains on, and why: what was asked, the cores and load seen."""

    count: int
    asked: int | str  # a count, or AUTO
    cores: int
    load: float | None  # the load average over the last minute when the run started
    fixed: bool = False  # the server's --live-threads decided, not the reader

    @property
    def why(self) -> str:
        """The reason in words, for the run's messages."""
        if self.fixed:
            return "set by headlab serve --live-threads"
        if self.asked != AUTO:
            return "as picked"
        if self.load is None:
            return "auto: this system reports no load average, so one thread, the safe choice"
        return f"auto: load average {self.load:.2f} over the last minute on {self.cores} cores"

    def describe(self) -> dict[str, Any]:
        return {
            "threads": self.count,
            "threads_asked": self.asked,
            "threads_why": self.why,
            "cores": self.cores,
            "load": self.load,
        }


def choose_threads(
    asked: int | str, cores: int, load: float | None, fixed: int | None = None
) -> Threads:
    """The threads of a run: a count the reader picked; for "auto", the server's fixed count
    (``headlab serve --live-threads``) when it has one, else :func:`auto_threads`."""
    if asked != AUTO:
        return Threads(int(asked), asked, cores, load)
    if fixed is not None:
        return Threads(fixed, asked, cores, load, fixed=True)
    return Threads(auto_threads(cores, load), asked, cores, load)


def ending_text(
    threads: Threads, seconds: float, steps: int, load_end: float | None, ended: str
) -> str:
    """How a run ended, in words: ``ended`` (e.g. "Run ab finished:" or "Run ab stopped:
    cancelled, after"), its steps, wall time, threads and why; and when the load averages say
    other work ran, that it shared the cores (the load at the end counts this run's own
    threads, hence it is discounted by them)."""
    unit = "thread" if threads.count == 1 else "threads"
    text = (
        f"{ended} {steps} steps in {seconds:.1f} s on {threads.count} torch {unit} ({threads.why})."
    )
    others = [
        x
        for x in (threads.load, None if load_end is None else load_end - threads.count)
        if x is not None
    ]
    if others and max(others) >= 1 - FREE_SHARE:
        end = "" if load_end is None else f", {load_end:.2f} at the end with this run's included"
        text += (
            f" Other work shared the cores (load average {_load(threads.load)} at the "
            f"start{end}), which slows a run."
        )
    return text


def _load(load: float | None) -> str:
    return "unknown" if load is None else f"{load:.2f}"


def run_study(
    knobs: Knobs, threads: int, listener: Listener | None = None, stop: StopToken | None = None
) -> dict[str, Any] | None:
    """One live run, as the route trains it: :func:`headlab.experiments.induction.study` of the
    knobs' recipe on ``threads`` torch threads (benchmarks/bench_live.py times this call)."""
    with torch_threads(threads):
        return ind.study(
            knobs.config(),
            knobs.n_layers,
            knobs.seed,
            listener=listener,
            stop=stop,
            weights_view=circuit_scores,
        )


def circuit_scores(model: Any) -> dict[str, Any]:
    """The K-composition of every layer-0 head into every last-layer head (the induction
    circuit's candidate edges, :func:`headlab.heads.composition.composition_scores`, from the
    weights alone) and its random-matrix floor: ``{"from_layer", "to_layer", "k" (h × h),
    "floor"}``. The page redraws the circuit from it at each evaluation."""
    from headlab.heads.composition import composition_scores

    last = int(model.config.n_layers) - 1
    if last < 1:  # one layer: no pair of heads in different layers
        return {"from_layer": 0, "to_layer": 0, "k": [], "floor": None}
    found = composition_scores(model)
    k = found.scores["k"][0, :, last, :]  # (h, h)
    return {
        "from_layer": 0,
        "to_layer": last,
        "k": k.round(decimals=4).tolist(),
        "floor": round(found.floor("k"), 4),
    }


class Busy(RuntimeError):
    """Another run is training; ``run_id`` names it."""

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id)
        self.run_id = run_id


@dataclass(frozen=True)
class Knobs:
    """What the reader sets: the seed, the number of layers and heads per layer, the threads."""

    seed: int = int(LIVE_KNOBS["seed"].default)
    n_layers: int = int(LIVE_KNOBS["n_layers"].default)
    n_heads: int = int(LIVE_KNOBS["n_heads"].default)
    threads: int | str = LIVE_KNOBS["threads"].default

    def config(self) -> ind.InductionConfig:
        """The live recipe with the reader's number of heads."""
        return replace(ind.LIVE, n_heads=self.n_heads)


@dataclass
class LiveRun:
    """One run: its id, its knobs and threads, the thread training it, the queue its events go
    to and the token that stops it (its clock starts here)."""

    knobs: Knobs
    loop: asyncio.AbstractEventLoop
    max_seconds: float
    threads: Threads
    load: Callable[[], float | None] = machine_load  # read again when the run ends
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    events: asyncio.Queue[Event | None] = field(default_factory=asyncio.Queue)
    thread: threading.Thread | None = None
    step: int = 0  # the last step a Step event reported

    def __post_init__(self) -> None:
        self.token = StopToken(self.max_seconds)
        self.started = time.perf_counter()

    def cancel(self, reason: str = "cancelled") -> None:
        """Ask the run to stop before its next step."""
        self.token.stop(reason)

    def push(self, event: Event | None) -> None:
        """Hand an event (None: the end) to the streaming request's loop, from any thread."""
        if isinstance(event, Step):
            self.step = event.step
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the loop is closed: the server is shutting down
            self.cancel("server stopped")

    def describe(self) -> dict[str, Any]:
        return {
            "run_id": self.id,
            **asdict(self.knobs),
            "recipe": asdict(self.knobs.config()),
            "max_seconds": self.max_seconds,
            **self.threads.describe(),
        }

    def ending(self, ended: str, steps: int | None = None) -> dict[str, Any]:
        """What the last event says besides its name: seconds, steps, threads and the text."""
        seconds, steps = time.perf_counter() - self.started, self.step if steps is None else steps
        text = ending_text(self.threads, seconds, steps, self.load(), f"Run {self.id} {ended}")
        return {
            "seconds": round(seconds, 3),
            "steps": steps,
            "threads": self.threads.count,
            "text": text,
        }


class LiveRuns:
    """The server's live runs: at most one trains at a time. ``threads``: a fixed count for
    "auto" runs (``headlab serve --live-threads``), None for :func:`auto_threads`; ``load``
    reads the machine's load (injected by tests)."""

    def __init__(
        self,
        max_seconds: float = MAX_SECONDS,
        threads: int | None = None,
        load: Callable[[], float | None] = machine_load,
        cores: int | None = None,
    ) -> None:
        self.max_seconds = max_seconds
        self.threads = threads
        self.load = load
        self.cores = cores or os.cpu_count() or 1
        self._lock = threading.Lock()
        self.current: LiveRun | None = None

    def start(self, knobs: Knobs, loop: asyncio.AbstractEventLoop) -> LiveRun:
        """Start a run on a new thread; :class:`Busy` if one is training."""
        with self._lock:
            if self.current is not None:
                raise Busy(self.current.id)
            threads = self.threads_now(knobs.threads)
            run = LiveRun(knobs, loop, self.max_seconds, threads, self.load)
            self.current = run
        run.thread = threading.Thread(target=self._work, args=(run,), name=f"live-{run.id}")
        run.thread.start()
        return run

    def threads_now(self, asked: int | str) -> Threads:
        """The threads a run asking for ``asked`` would train on if it started now."""
        return choose_threads(asked, self.cores, self.load(), self.threads)

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
        try:
            result = run_study(run.knobs, run.threads.count, run.push, run.token)
            if result is None:
                reason = run.token.reason or "stopped"
                run.push(Cancelled(run.id, reason, run.ending(f"stopped: {reason}, after")))
            else:
                steps = run.knobs.config().steps
                run.push(Done(run.id, run.ending("finished:", steps)))
        except Exception as exc:  # a bug must end the stream with a message, not hang it
            run.push(Failed(run.id, f"{type(exc).__name__}: {exc}"))
        finally:
            with self._lock:
                self.current = None
            run.push(None)
