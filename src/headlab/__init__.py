"""headlab: multi-head attention you can run, measure and see.

The core names below load on first use (PEP 562's module ``__getattr__``), so importing
``headlab`` — which every ``headlab`` command does — costs nothing until a name needs torch:
``headlab --help`` and ``headlab models`` never import it. ``from headlab import attention``
works as before; the first core name asked for imports torch and binds them all.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the checker sees the real names; at run time they load on first use
    from headlab.attention import (
        KVCache,
        MultiHeadAttention,
        attention,
        causal_allowed,
        merge_heads,
        repeat_kv,
        split_heads,
    )
    from headlab.trace import Trace

__version__ = "0.1.0"

__all__ = [
    "KVCache",
    "MultiHeadAttention",
    "Trace",
    "__version__",
    "attention",
    "causal_allowed",
    "merge_heads",
    "repeat_kv",
    "split_heads",
]


def __getattr__(name: str) -> Any:
    """A core name of ``__all__``, imported on first access and kept as a module attribute.

    Anything else raises AttributeError, which ``from headlab import zoo`` relies on: Python
    then imports the submodule ``headlab.zoo`` itself."""
    if name not in __all__:
        raise AttributeError(f"module 'headlab' has no attribute {name!r}")
    from headlab.attention import (
        KVCache,
        MultiHeadAttention,
        attention,
        causal_allowed,
        merge_heads,
        repeat_kv,
        split_heads,
    )
    from headlab.trace import Trace

    core: dict[str, Any] = {
        "KVCache": KVCache,
        "MultiHeadAttention": MultiHeadAttention,
        "Trace": Trace,
        "attention": attention,
        "causal_allowed": causal_allowed,
        "merge_heads": merge_heads,
        "repeat_kv": repeat_kv,
        "split_heads": split_heads,
    }
    globals().update(core)
    return core[name]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(types.ModuleType):
    """The package's module type: ``headlab.attention`` stays the function.

    The name is both a submodule and the function it defines. Whoever first imports the
    submodule (``from headlab.model import ...`` does) makes Python set the package's
    ``attention`` to that module, before the lazy ``__getattr__`` above ever ran; this keeps
    the package's ``attention`` the function, as an eager re-export always left it."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "attention" and isinstance(value, types.ModuleType):
            value = value.attention
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
