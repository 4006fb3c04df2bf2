"""The models the server holds in memory: loaded through ``headlab.zoo``, a few at a time."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import Future
from typing import Any, TypeVar

from fastapi import HTTPException

T = TypeVar("T")


def _field(entry: Any, name: str, default: Any = "") -> Any:
    """Read a field of a zoo entry, whether it is a mapping or an object."""
    if isinstance(entry, dict):
        return entry.get(name, default)
    return getattr(entry, name, default)


def _sizes(zoo: Any, name: str) -> dict[str, Any] | None:
    """One attention layer's sizes for the shape calculator, read from the model's config
    (no weights loaded); None when the config cannot be read."""
    try:
        c = zoo.model_config(name)
    except (ValueError, OSError, ImportError):
        return None
    return {
        "d_model": c.d_model,
        "n_heads": c.n_heads,
        "n_kv_heads": c.n_kv_heads,
        "n_layers": c.n_layers,
        "context": c.max_len,
        "bias": c.bias,
        # null where d_k = d_model / h, as the calculator's own default (Gemma 3: 256 at 640 / 4)
        "d_k": None if c.d_k * c.n_heads == c.d_model else c.d_k,
        "window": c.sliding_window if c.local_layers else None,
        "local_layers": list(c.local_layers),
    }


class SingleFlight:
    """Runs ``compute`` once per key at a time: a caller asking for a key whose computation is
    under way waits for that one's result (or its exception) instead of starting its own.
    Keeping results is the caller's: its ``compute`` stores the result before returning and
    first checks whether a computation that just finished stored it already."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _running; never held while computing
        self._running: dict[Hashable, Future[Any]] = {}

    def run(self, key: Hashable, compute: Callable[[], T]) -> T:
        """``compute()``'s result, computed by this caller or by the one already computing it."""
        with self._lock:
            pending = self._running.get(key)
            if pending is None:
                mine: Future[Any] = Future()
                self._running[key] = mine
        if pending is not None:
            result: T = pending.result()  # another request computes it: wait for that one
            return result
        try:
            result = compute()
        except BaseException as exc:
            with self._lock:
                del self._running[key]
            mine.set_exception(exc)
            raise
        with self._lock:
            del self._running[key]
        mine.set_result(result)
        return result


class Recent:
    """The results of ``compute`` for the ``max_kept`` most recently asked keys; each computed
    once at a time (:class:`SingleFlight`), so requests asking for a key under way wait for it.
    Bounded because a key may come from the request: a new seed each time would otherwise keep
    every answer for as long as the server runs."""

    def __init__(self, max_kept: int) -> None:
        self.max_kept = max_kept
        self._kept: OrderedDict[Hashable, Any] = OrderedDict()
        self._flights = SingleFlight()
        self._lock = threading.Lock()  # guards _kept; never held while computing

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        """The kept result for ``key`` (now the most recent), or ``compute()``'s, then kept."""
        with self._lock:
            if key in self._kept:
                self._kept.move_to_end(key)
                found: T = self._kept[key]
                return found
        return self._flights.run(key, lambda: self._compute_and_keep(key, compute))

    def _compute_and_keep(self, key: Hashable, compute: Callable[[], T]) -> T:
        result = compute()
        with self._lock:
            self._kept[key] = result
            self._kept.move_to_end(key)
            while len(self._kept) > self.max_kept:
                self._kept.popitem(last=False)
        return result

    def keys(self) -> list[Hashable]:
        """The keys kept, least recently asked first."""
        with self._lock:
            return list(self._kept)


class ModelStore:
    """Loads zoo models on first use and keeps the ``max_loaded`` most recently used.

    A load runs outside the store's lock, so a slow load (SmolLM2 takes seconds) holds back
    neither the requests for models already loaded nor the load of another model; requests for
    a model being loaded wait on that one load (:class:`SingleFlight`) instead of loading it
    again.
    A loaded model is only read afterwards (inference mode), so requests may share it.
    """

    def __init__(self, max_loaded: int = 2) -> None:
        self.max_loaded = max_loaded
        self._loaded: OrderedDict[str, tuple[Any, Any]] = OrderedDict()
        self._loading = SingleFlight()
        self._lock = threading.Lock()  # guards _loaded; never held during a load
        self.preload_errors: dict[str, str] = {}
        self._sizes: dict[str, dict[str, Any]] = {}

    def catalogue(self) -> list[dict[str, Any]]:
        """Every model the zoo knows: name, whether it is available here, and why not."""
        try:
            from headlab import zoo
        except ImportError as exc:
            return [{"name": "default", "available": False, "reason": f"zoo missing: {exc}"}]
        rows = []
        for entry in zoo.list_models():
            name = str(_field(entry, "name"))
            rows.append(
                {
                    "name": name,
                    "available": bool(_field(entry, "available", True)),
                    "description": str(_field(entry, "description", "") or ""),
                    "reason": str(_field(entry, "reason", "") or ""),
                    "loaded": name in self._loaded,
                }
            )
        return rows

    def sizes(self) -> dict[str, dict[str, Any]]:
        """Each available model's attention sizes, read from its config once and kept (an HF
        model's config needs transformers, whose import is kept off the model list's path)."""
        from headlab import zoo

        for row in self.catalogue():
            if row["available"] and row["name"] not in self._sizes:
                found = _sizes(zoo, row["name"])
                if found is not None:
                    self._sizes[row["name"]] = found
        return dict(self._sizes)

    def preload(self, names: Iterable[str]) -> None:
        """Load ``names`` now (at startup); a failure is recorded, not raised."""
        for name in names:
            try:
                self.get(name)
            except HTTPException as exc:
                self.preload_errors[name] = str(exc.detail)

    def loaded_names(self) -> list[str]:
        return list(self._loaded)

    def get(self, name: str) -> tuple[Any, Any]:
        """(model, tokenizer) for ``name``; 404 for a name the zoo does not offer here (the
        answer lists those it does), 503 for one that fails to load."""
        kept = self._kept(name)
        if kept is not None:
            return kept
        return self._loading.run(name, lambda: self._load_and_keep(name))

    def _kept(self, name: str) -> tuple[Any, Any] | None:
        """The loaded ``name``, now the most recently used; None if it is not loaded."""
        with self._lock:
            if name not in self._loaded:
                return None
            self._loaded.move_to_end(name)
            return self._loaded[name]

    def _load_and_keep(self, name: str) -> tuple[Any, Any]:
        """Load ``name`` (unless a load that just finished kept it) and keep the most recent."""
        kept = self._kept(name)
        if kept is not None:
            return kept
        pair = self._load(name)
        with self._lock:
            self._loaded[name] = pair
            while len(self._loaded) > self.max_loaded:
                self._loaded.popitem(last=False)
        return pair

    def _load(self, name: str) -> tuple[Any, Any]:
        """Load ``name`` from the zoo, in eval mode (called without the lock)."""
        available = {r["name"]: r for r in self.catalogue()}
        row = available.get(name)
        if row is None or not row["available"]:
            offered = sorted(n for n, r in available.items() if r["available"])
            why = f" ({row['reason']})" if row and row["reason"] else ""
            raise HTTPException(
                404,
                f"model {name!r} is not available{why}; available models: "
                f"{', '.join(offered) or 'none'}",
            )
        from headlab import zoo

        try:
            model, tokenizer = zoo.load(name)
        except (ValueError, OSError) as exc:
            raise HTTPException(503, f"model {name!r} could not be loaded: {exc}") from None
        model.eval()
        return model, tokenizer

    def clear(self) -> None:
        with self._lock:
            self._loaded.clear()
