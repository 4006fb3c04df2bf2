"""Trace: a recorder that the attention layer and the model write named tensors into.

A trace is the named cache of activations that head analysis, the shape calculator and the page
read from, e.g. ``blocks.0.attn.weights`` (B, h, n, s). Names are dotted paths; a child trace made
with :meth:`Trace.scope` writes into the same store under a prefix. On the ``meta`` device the
recorded tensors carry shapes and dtypes but no data, which is how ``headlab.shapes`` works.

A trace can also reduce as it records: ``Trace(only=("weights",), reduce=f)`` hands every kept
tensor to ``f(name, tensor)`` the moment it is recorded and stores what ``f`` returns instead
(nothing when it returns None). Head analysis uses this to turn each layer's (B, h, n, n)
weights into per-head scores while the next layer has not run yet, so a long input holds one
layer's patterns at a time instead of every layer's (:func:`headlab.measure.reduce_patterns`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch import Tensor

# reduce(full_name, tensor) -> what to store under that name, or None to store nothing
Reducer = Callable[[str, Tensor], Tensor | None]
# place(full_name, shape, dtype, device) -> the tensor to compute that record into, or None
Placer = Callable[[str, tuple[int, ...], torch.dtype, torch.device], Tensor | None]


class Enough(Exception):
    """A reducer raises it once it holds every record it needs: whoever runs the forward
    catches it, and the rest of the forward is not run (:func:`headlab.measure.reduce_patterns`
    stops after the last layer's weights)."""


class Trace:
    """An ordered store of named tensors, filled during a forward pass.

    ``Trace()`` records everything; ``Trace(only=("weights",))`` records only names whose last
    part is listed (cheaper for long runs); ``Trace.off()`` records nothing. With ``reduce``,
    each kept record goes through ``reduce(full_name, tensor)`` first (see the module docstring).
    """

    def __init__(
        self,
        only: tuple[str, ...] | None = None,
        detach: bool = True,
        reduce: Reducer | None = None,
        place: Placer | None = None,
    ) -> None:
        self.enabled = True
        self.only = only
        self.detach = detach
        self.reduce = reduce
        self.placer = place
        self._store: dict[str, Tensor] = {}
        self._prefix = ""

    @classmethod
    def off(cls) -> Trace:
        """A trace that ignores every record (the default when none is passed)."""
        t = cls()
        t.enabled = False
        return t

    def scope(self, prefix: str) -> Trace:
        """A view of this trace that records under ``prefix.`` into the same store."""
        child = Trace.__new__(Trace)
        child.__dict__.update(self.__dict__)
        child._prefix = f"{self._prefix}{prefix}."
        return child

    def wants(self, name: str) -> bool:
        """Whether :meth:`record` would keep ``name`` (lets callers skip costly extras)."""
        return self.enabled and (self.only is None or name in self.only)

    def place(
        self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> Tensor | None:
        """A tensor of this shape, dtype and device to compute the record ``name`` into, where
        the trace's ``place`` gives one (a reducer's buffer, which it would copy the record
        into anyway), else None: the computation makes its own. It is recorded all the same."""
        if self.placer is None or not self.wants(name):
            return None
        out = self.placer(self._prefix + name, shape, dtype, device)
        if out is None or out.shape != shape or out.dtype != dtype or out.device != device:
            return None
        return out

    def record(self, name: str, tensor: Tensor) -> Trace:
        """Store ``tensor`` under the scoped ``name`` (or what ``reduce`` makes of it); returns
        self so records can chain."""
        if not self.wants(name):
            return self
        value = tensor.detach() if self.detach else tensor
        kept = self.reduce(self._prefix + name, value) if self.reduce is not None else value
        if kept is not None:
            self._store[self._prefix + name] = kept
        return self

    def __getitem__(self, name: str) -> Tensor:
        try:
            return self._store[name]
        except KeyError:
            known = ", ".join(list(self._store)[:12]) or "nothing yet"
            raise KeyError(f"no tensor named {name!r} in this trace; it holds: {known}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._store

    def __iter__(self) -> Iterator[str]:
        return iter(self._store)

    def __len__(self) -> int:
        return len(self._store)

    def items(self) -> Iterator[tuple[str, Tensor]]:
        return iter(self._store.items())

    def layers(self, name: str) -> list[Tensor]:
        """The record ``blocks.{l}.<name>`` of every layer l = 0, 1, … in order, e.g.
        ``trace.layers("attn.weights")``; a KeyError names what the trace holds if none is."""
        found: list[Tensor] = []
        while f"blocks.{len(found)}.{name}" in self._store:
            found.append(self._store[f"blocks.{len(found)}.{name}"])
        if not found:
            self[f"blocks.0.{name}"]  # raises the KeyError that lists what is recorded
        return found

    def stack(self, name: str) -> Tensor:
        """Every layer's ``blocks.{l}.<name>`` stacked on a new first axis:
        ``stack("attn.weights")`` is (L, B, h, n, s). Layers must agree in shape."""
        return torch.stack(self.layers(name))

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every recorded name with its shape, in recording order."""
        return {name: tuple(t.shape) for name, t in self._store.items()}
