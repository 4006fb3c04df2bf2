"""Every writer of a results or benchmark file records the versions it ran on (``"versions"``,
headlab.provenance): each writer is run here into a temporary folder with its measuring stubbed
out, and the versions read back are checked against importlib.metadata and this interpreter.
(The experiments' writers: tests/unit/test_experiments_design.py.)"""

from __future__ import annotations

import json
import platform
import sys
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from headlab.provenance import lock_match

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def scripts(monkeypatch: pytest.MonkeyPatch) -> None:
    """benchmarks/ and scripts/docs/ importable, as their scripts import their neighbours."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    monkeypatch.syspath_prepend(str(ROOT / "scripts/docs"))


def ran_on(path: Path) -> dict[str, Any]:
    """The file's ``versions``, checked to name this interpreter, torch, numba and the lock."""
    found = json.loads(path.read_text(encoding="utf-8"))["versions"]
    assert found["python"] == platform.python_version()
    assert found["torch"] == metadata.version("torch")
    assert found["numba"] == metadata.version("numba")
    assert found["transformers"] == metadata.version("transformers")
    assert found["lock"] == lock_match()
    return found


def test_a_benchmarks_saved_file_records_its_versions(
    scripts: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import record

    monkeypatch.setattr(sys, "argv", ["benchmarks/bench_x.py", "--rounds", "3"])
    path = record.save(tmp_path / "x.json", ["what", "value"], [["a", 1]], {"raw": [1]})
    ran_on(path)
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["table"] == {"columns": ["what", "value"], "rows": [["a", 1]]}
    assert not {"python", "torch"} & set(data["machine"])  # one home: versions


def test_the_cold_start_benchmark_records_its_versions(
    scripts: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import bench_cold_start as bench

    fake = {name: {"wall": [1.0] * 5, "cpu": [0.5] * 5} for name in bench.COMMANDS}
    monkeypatch.setattr(bench, "measure", lambda rounds: fake)
    out = tmp_path / "cold_start.json"
    monkeypatch.setattr(sys, "argv", ["bench_cold_start.py", "--rounds", "5", "--json", str(out)])
    bench.main()
    ran_on(out)


def test_the_live_benchmark_records_its_versions(
    scripts: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import bench_live as bench

    run = {
        "threads": 1,
        "load": 0.5,
        "capped": False,
        "steps": 10,
        "total_seconds": 1.0,
        "steps_per_second": 10.0,
        "phase_seconds": 0.5,
        "window": [1, 2],
    }
    monkeypatch.setattr(bench, "one_run", lambda asked, seed, cap: run)
    out = tmp_path / "live.json"
    argv = ["bench_live.py", "--conditions", "idle", "--rounds", "1", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    bench.main()
    ran_on(out)


def test_the_phase_change_benchmark_records_its_versions(
    scripts: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import bench_phase_change as bench

    seed_run = {
        "seed": 0,
        "layers": 2,
        "window": [10, 20],
        "found": True,
        "seconds": 3.0,
        "cpu_seconds": 2.5,
        "induction_share": 0.5,
        "feeder_prev_token": 0.4,
        "feeders": ["0.1"],
        "circuit": True,
        "train_seconds": 4.0,
        "load": [0.5, 0.6],
    }
    monkeypatch.setattr(bench, "one", lambda cfg, n_layers, seed: seed_run)
    out, before = tmp_path / "phase.json", torch.get_num_threads()
    try:
        assert bench.main(["--seeds", "0", "--json", str(out)]) == 0
    finally:
        torch.set_num_threads(before)  # main sets its --threads
    ran_on(out)
    assert json.loads(out.read_text(encoding="utf-8"))["live"] == [seed_run]


def test_the_docs_stored_answers_record_their_versions(
    scripts: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import data

    monkeypatch.setattr(data, "DATA", tmp_path)
    monkeypatch.setattr(data, "run", lambda command: {"tokens": ["a"], "heads": []})
    assert data.main(["heads-default"]) == 0
    ran_on(tmp_path / "heads-default.json")


def test_the_default_models_card_records_its_versions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from headlab.default_model import card
    from headlab.default_model.recipe import DefaultRecipe
    from headlab.model import ModelConfig, Transformer

    model = Transformer(ModelConfig(vocab_size=20, d_model=16, n_layers=1, n_heads=2, max_len=8))
    model.save(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{}", encoding="utf-8")
    per_head = {"previous_token": [[0.1]], "induction": [[0.2]], "prefix_matching": [[0.3]]}
    monkeypatch.setattr(card, "measure", lambda model, evals: {"val_loss": 1.0, **per_head})
    monkeypatch.setattr(card, "head_tables", lambda d: ({}, {"repeat": []}))
    monkeypatch.setattr(card, "load_seconds", lambda d: 0.1)
    monkeypatch.setattr(card, "model_card", lambda c, tables: "# card\n")
    prepared = SimpleNamespace(recipe=DefaultRecipe(), corpus={"works": 1}, evals=None)
    card._write_card(model, prepared, [], tmp_path)
    ran_on(tmp_path / "card.json")
