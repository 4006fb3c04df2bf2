"""Shared test helpers: seeded generators and the CI rule for missing dependencies."""

from __future__ import annotations

import os

import pytest
import torch

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def require(condition: bool, reason: str) -> None:
    """Skip with a visible reason on a user's machine; fail under CI=true, where it must run."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"required under CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
