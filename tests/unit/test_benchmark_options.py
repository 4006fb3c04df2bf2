"""Every benchmark refuses a count of rounds (or loads, or repeats) that leaves a median with no
value, in argparse's one line and exit 2, before it times anything; `bench_analysis.py
--slow-rounds 0` leaves the ablations out instead of failing on their empty median.

The oracle is each benchmark's own ``main`` run in this process with that one option: it must
stop in argument parsing (SystemExit 2, the option named on stderr), never reach the work."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
COUNTS = re.compile(r'add_argument\(\s*"(--rounds|--loads|--repeats|--slow-rounds)"')


def _counted() -> list[tuple[str, str]]:
    """(script, option) for every count option a benchmark script declares."""
    found = []
    for path in sorted(BENCHMARKS.glob("*.py")):
        found += [(path.stem, opt) for opt in COUNTS.findall(path.read_text(encoding="utf-8"))]
    return found


@pytest.fixture
def benchmarks_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))


def test_every_count_option_is_found():
    """The scan below sees the options it should (a renamed option would slip past it)."""
    found = _counted()
    assert ("bench_analysis", "--slow-rounds") in found and ("bench_gemma3", "--loads") in found
    assert len({script for script, _ in found}) >= 14


@pytest.mark.parametrize(("script", "option"), _counted())
def test_a_count_that_leaves_no_median_is_refused_in_one_line(
    script, option, benchmarks_on_path, monkeypatch, capsys
):
    module = importlib.import_module(script)
    least = 0 if option == "--slow-rounds" else 5 if script == "bench_cold_start" else 1
    for bad in (str(least - 1), "two"):
        monkeypatch.setattr(sys, "argv", [f"{script}.py", option, bad])
        with pytest.raises(SystemExit) as stop:
            module.main()
        err = capsys.readouterr().err
        assert stop.value.code == 2, err
        assert option in err and "Traceback" not in err, err
        assert f"give at least {least}" in err or "is not a whole number" in err, err


def test_no_slow_rounds_leaves_the_slow_contenders_out(benchmarks_on_path):
    bench = importlib.import_module("bench_analysis")
    calls: list[str] = []
    fns = {name: (lambda name=name: calls.append(name)) for name in ("fast", "slow")}
    medians = bench.measure(fns, {"slow"}, rounds=3, slow_rounds=0)
    assert set(medians) == {"fast"} and calls == ["fast"] * 4  # one warm-up, three rounds
    calls.clear()
    medians = bench.measure(fns, {"slow"}, rounds=3, slow_rounds=1)
    assert set(medians) == {"fast", "slow"} and calls.count("slow") == 1


def test_a_prepared_calls_setup_runs_before_each_timing_and_outside_it(
    benchmarks_on_path, monkeypatch
):
    """bench_analysis' "the same probe again" row builds its probe's targets before each timed
    call (the other rows' probes take their place in between), and that build is not timed: a
    clock that only the calls move reads the call's cost alone."""
    bench = importlib.import_module("bench_analysis")
    now, calls = [0.0], []

    def setup() -> None:
        calls.append("setup")
        now[0] += 100.0

    def call() -> None:
        calls.append("call")
        now[0] += 1.0

    monkeypatch.setattr(bench.time, "perf_counter", lambda: now[0])
    medians = bench.measure({"again": bench.Prepared(setup, call)}, set(), rounds=3, slow_rounds=0)
    assert medians == {"again": 1.0}
    assert calls == ["setup", "call"] * 4  # the warm-up, then three rounds
