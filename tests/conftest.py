"""Shared test helpers: seeded generators, the CI rule for missing dependencies, the one server
and the one browser of a run, and how the tests are shared among pytest-xdist's workers.

``make test`` runs the suite on two workers (``-n 2 --dist loadgroup``). A test that uses a
fixture wider than itself must run in the process that holds that fixture, or the fixture is
built again in the other one: :func:`pytest_collection_modifyitems` puts such tests in one
``xdist_group`` (the tests of the run-wide server and browser together, the others by module);
every other test goes to whichever worker is free.
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import torch

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
# the group of the tests that use this file's run-wide fixtures
SHARED = "tests/conftest.py"
RUN_WIDE = ("server", "browser")


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


@pytest.fixture(scope="session", autouse=True)
def _threads_per_worker() -> Iterator[None]:
    """Under xdist, each worker's torch takes its share of the cores: two workers of two
    threads each on two cores would fight over them. Tests that need a count set their own."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, before // workers))
    yield
    torch.set_num_threads(before)


# --- one server and one browser for the whole run ------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def available_model() -> str | None:
    """The model the page tests read: the shipped one, else the first available, else None."""
    from headlab import zoo

    available = [i.name for i in zoo.list_models() if i.available]
    return "default" if "default" in available else (available[0] if available else None)


@pytest.fixture(scope="session")
def server() -> Iterator[str]:
    """The explainer's app on uvicorn, in a thread on a free port, for every test of the run
    that talks to a real server (the page's tests, live training): its base URL. The model the
    page shows is loaded at start."""
    import uvicorn

    from headlab.server import create_app

    model = available_model()
    app = create_app(preload=(model,) if model else ())
    srv = uvicorn.Server(uvicorn.Config(app, port=free_port(), log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not srv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{srv.config.port}"
    srv.should_exit = True
    thread.join(timeout=30)


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    """Debian's headless Chromium, driven by Playwright, for every browser test of the run."""
    from pathlib import Path

    from playwright.sync_api import sync_playwright

    require(Path(CHROMIUM).exists(), "Chromium is not installed (apt-get install chromium)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


# --- sharing the tests among xdist's workers -----------------------------------------------------


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test that shares a fixture with others with the ``xdist_group`` of that fixture
    (``--dist loadgroup`` runs a group in one worker); a test without one may run anywhere."""
    for item in items:
        group = shared_group(item)
        if group is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))


def shared_group(item: pytest.Item) -> str | None:
    """:data:`SHARED` for a test that uses this file's :data:`RUN_WIDE` fixtures; the test's
    module for one that uses a module-, class- or session-wide fixture of its own module; else
    None. The other wide fixtures (pytest's ``tmp_path_factory``, the thread share above) cost
    nothing to build in each worker."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    module = item.nodeid.split("::")[0]
    group = None
    for defs in info.name2fixturedefs.values():
        fixture = defs[-1]  # the definition this test gets (the closest override)
        if fixture.scope == "function":
            continue
        if fixture.baseid == module:
            group = module
        elif fixture.argname in RUN_WIDE:
            return SHARED
    return group
