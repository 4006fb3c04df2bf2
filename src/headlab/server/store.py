"""The models the server holds in memory: loaded through ``headlab.zoo``, a few at a time."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any

from fastapi import HTTPException


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
    }


class ModelStore:
    """Loads zoo models on first use and keeps the ``max_loaded`` most recently used.

    A load runs outside the store's lock, so a slow load (SmolLM2 takes seconds) holds back
    neither the requests for models already loaded nor the load of another model; requests for
    a model being loaded wait on that one load (a future per name) instead of loading it again.
    A loaded model is only read afterwards (inference mode), so requests may share it.
    """

    def __init__(self, max_loaded: int = 2) -> None:
        self.max_loaded = max_loaded
        self._loaded: OrderedDict[str, tuple[Any, Any]] = OrderedDict()
        self._loading: dict[str, Future[tuple[Any, Any]]] = {}
        self._lock = threading.Lock()  # guards _loaded and _loading; never held during a load
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
        with self._lock:
            if name in self._loaded:
                self._loaded.move_to_end(name)
                return self._loaded[name]
            pending = self._loading.get(name)
            if pending is None:
                mine: Future[tuple[Any, Any]] = Future()
                self._loading[name] = mine
        if pending is not None:
            return pending.result()  # another request is loading it: wait for that one load
        try:
            pair = self._load(name)
        except BaseException as exc:
            with self._lock:
                del self._loading[name]
            mine.set_exception(exc)
            raise
        with self._lock:
            del self._loading[name]
            self._loaded[name] = pair
            while len(self._loaded) > self.max_loaded:
                self._loaded.popitem(last=False)
        mine.set_result(pair)
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
