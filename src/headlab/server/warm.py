"""Each model's one-time figures, computed before the page asks for them.

The first head analysis of a model on a probe pays for figures that never change afterwards:
the random-weights floors of the probe (three random copies of the architecture, built and
analysed: SmolLM2's took 20 s on one thread) and, for the evidence and the circuit, the
composition scores of its weights (17 s). Both are kept on disk, each with a record of what made
it (:func:`headlab.heads.baselines.random_spreads`, :func:`headlab.heads.composition.
composition_scores`), so paying them once per machine is enough. :func:`warm_model` pays them for
the probes the page runs without a text (:func:`page_probes`); ``headlab models --fetch NAME``
runs it once the model is in the cache, and ``headlab serve`` runs it for every model available
here in a background thread (:class:`Warmer`), which never holds back the server's start and
never downloads anything: a model not fetched is not available, so not warmed.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from headlab.server.progress import Timings

NICE = 10  # the warming thread's niceness on Linux: requests come first


def page_probes(model: Any, tokenizer: Any) -> list[tuple[str, Any, bool]]:
    """``(name, probe, content)`` of each probe the page runs ``model`` on without a text, as
    the server builds them: /api/heads's "repeat" (the page's first run) and "random-repeat"
    within its token limit, and /api/circuit's random tokens (seed 0), scored without the
    content score."""
    from headlab.measure import build_probe
    from headlab.server.routes.attention import CIRCUIT_PROBE, token_limit

    c = model.config
    limit = token_limit(model)
    return [
        ("repeat", build_probe("repeat", tokenizer, limit, c.vocab_size), True),
        ("random-repeat", build_probe("random-repeat", tokenizer, limit, c.vocab_size), True),
        ("circuit", build_probe(CIRCUIT_PROBE, tokenizer, c.max_len, c.vocab_size, seed=0), False),
    ]


def warm_model(
    model: Any, tokenizer: Any, say: Callable[[str], None] | None = None
) -> dict[str, dict[str, float]]:
    """Compute and keep on disk what is not kept yet of ``model``'s composition scores and of
    the random-weights floors of each of :func:`page_probes`; ``say(what)`` before each.
    Returns the wall time of each computed with content scores, as
    :meth:`headlab.server.progress.Timings.record` takes it (step → {"seconds", "tokens"}).
    Floors that would not fit in memory (:class:`headlab.heads.baselines.FloorsDoNotFit`)
    are left out."""
    from headlab.heads.baselines import (
        BASELINE_SEEDS,
        FloorsDoNotFit,
        floors_cached,
        random_spreads,
    )
    from headlab.heads.composition import composition_cached, composition_scores

    tell = say or (lambda what: None)
    measured: dict[str, dict[str, float]] = {}
    if not composition_cached(model):
        tell("composition scores")
        start = time.perf_counter()
        composition_scores(model, on_disk=True)
        measured["composition"] = {"seconds": time.perf_counter() - start, "tokens": 1}
    for name, probe, content in page_probes(model, tokenizer):
        if floors_cached(model, probe, BASELINE_SEEDS, content):
            continue
        tell(f"random-weights floors on the {name} probe ({probe.n} tokens)")
        start = time.perf_counter()
        try:
            random_spreads(model, probe, BASELINE_SEEDS, content)
        except FloorsDoNotFit:
            continue
        if content and "floors" not in measured:
            measured["floors"] = {"seconds": time.perf_counter() - start, "tokens": probe.n}
    return measured


class Warmer:
    """Runs :func:`warm_model` for each of ``names`` in turn, in a daemon thread of low
    priority, and records the times it measured (:class:`headlab.server.progress.Timings`). A
    model the server holds is warmed in place; another is loaded for the purpose and dropped
    after. ``state[name]`` says how far each is: "waiting", "warming", "ready" or why it failed.
    """

    def __init__(self, store: Any, timings: Timings, names: Sequence[str]) -> None:
        self.store, self.timings = store, timings
        self.state = dict.fromkeys(names, "waiting")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="headlab-warm", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """No model is started after this (the one under way finishes: torch cannot be
        interrupted)."""
        self._stop.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread; True when it has ended."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        with contextlib.suppress(OSError, AttributeError):  # Linux: this thread only
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
        for name in list(self.state):
            if self._stop.is_set():
                return
            self.state[name] = "warming"
            try:
                model, tokenizer = self._model(name)
                measured = warm_model(model, tokenizer)
                self.timings.record(name, model.config, measured)
            except Exception as exc:  # a thread of its own: say why, never take the server down
                self.state[name] = f"failed: {exc}"
                continue
            self.state[name] = "ready"

    def _model(self, name: str) -> tuple[Any, Any]:
        """The server's copy of ``name`` when it holds one, else one loaded from the cache."""
        if name in self.store.loaded_names():
            pair: tuple[Any, Any] = self.store.get(name)
            return pair
        from headlab import zoo

        model, tokenizer = zoo.load(name)
        return model.eval(), tokenizer


def available_models(store: Any) -> list[str]:
    """The names of the models available here (fetched, never to be downloaded), those the
    server holds first."""
    loaded = store.loaded_names()
    rows = [r["name"] for r in store.catalogue() if r["available"]]
    return [n for n in loaded if n in rows] + [n for n in rows if n not in loaded]
