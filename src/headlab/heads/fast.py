"""Where the scores' compiled loops (:mod:`headlab.heads.kernels`) stand in for their PyTorch
definition (:mod:`headlab.heads.scores`, :func:`headlab.heads.content.content_parts`): the one
place that decides.

The loops compute the same numbers (the tests hold them equal to the definition) on the CPU in
float32, several times faster. Everywhere else the definition runs: on a GPU, in float64 or
half precision, while torch.export or torch.compile traces the scores, where Numba is not
installed or cannot load, and wherever ``HEADLAB_KERNELS=0`` asks for it.
"""

from __future__ import annotations

import functools
import os

import torch
from torch import Tensor


def usable(weights: Tensor) -> bool:
    """True where the compiled loops score ``weights``: CPU float32, outside any trace, with
    the loops loadable."""
    return (
        weights.device.type == "cpu"
        and weights.dtype == torch.float32
        and not torch.compiler.is_compiling()
        and available()
    )


@functools.cache
def available() -> bool:
    """Whether the compiled loops load here (Numba installed and not switched off by
    ``HEADLAB_KERNELS=0``); asked once a process."""
    if os.environ.get("HEADLAB_KERNELS", "").strip() == "0":
        return False
    try:
        import headlab.heads.kernels  # noqa: F401
    except ImportError:
        return False
    return True
