"""How `make test` shares the suite among pytest-xdist's workers (conftest.WholeModules): every
collected test is sent exactly once, tests that share an id included, and a module never spans
two workers. Driven as xdist's controller drives a scheduler, with stand-in workers."""

from __future__ import annotations

import random
from collections import Counter
from types import SimpleNamespace

from conftest import WholeModules


class Config:
    """The two options a scheduler reads: two local workers, no chunk limit."""

    def getvalue(self, name: str) -> object:
        return {"tx": ["2*popen"], "maxschedchunk": None}[name]

    getoption = getvalue


class Worker:
    """Records what it is sent; ``queue`` is what it has not finished."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.queue: list[int] = []
        self.shutting_down = False

    def send_runtest_some(self, indices: list[int]) -> None:
        self.queue.extend(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


# modules of 3, 4, 1, 5 and 2 tests; b.py's four cases share one id (as schemathesis's do)
COLLECTION = [
    *(f"a.py::t{i}" for i in range(3)),
    *["b.py::fuzz"] * 4,
    "c.py::t0",
    *(f"d.py::t{i}" for i in range(5)),
    *(f"e.py::t{i}" for i in range(2)),
]


def run(seed: int) -> tuple[Counter[int], dict[str, set[int]]]:
    """Schedule COLLECTION on two workers finishing tests in a random order: how often each
    index was sent, and which workers ran each module."""
    sched = WholeModules(Config())
    workers = [Worker("gw0"), Worker("gw1")]
    for w in workers:
        sched.add_node(w)
        sched.add_node_collection(w, COLLECTION)
    sched.schedule()
    rng, sent, where = random.Random(seed), Counter(), {}
    ran: dict[int, int] = {}
    while any(w.queue for w in workers):
        number = rng.choice([n for n, w in enumerate(workers) if w.queue])
        index = workers[number].queue.pop(0)
        ran[index] = number
        sched.mark_test_complete(workers[number], index)
    for w in workers:
        assert w.shutting_down
    for index, number in ran.items():
        sent[index] += 1
        where.setdefault(COLLECTION[index].split("::")[0], set()).add(number)
    return sent, where


def test_every_test_runs_once_and_each_module_in_one_worker() -> None:
    for seed in range(20):
        sent, where = run(seed)
        assert sent == Counter(range(len(COLLECTION)))  # the four b.py::fuzz cases too
        assert all(len(workers) == 1 for workers in where.values()), where
