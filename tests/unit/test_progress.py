"""GET /api/progress/{id} while POST /api/heads runs: the steps in the order they run, each with
its count, the plan's expected times (estimated before any run, measured after one, none for
what is cached), and the times kept on disk checked when read. The request is held at each new
step until the test has read the progress there, so no report is missed and nothing is timed."""

from __future__ import annotations

import json
import queue
import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from conftest import require
from headlab import zoo
from headlab.heads import baselines, composition
from headlab.server import create_app, progress
from headlab.server.progress import Timings

ID = "0123456789abcdef"
STEP = progress.Job.step  # the real one, which the tests wrap


@pytest.fixture
def client(tmp_path, monkeypatch) -> Iterator[TestClient]:
    """A server on an empty cache, nothing kept in memory, the default model loaded."""
    require(zoo._default_info().available, "the default model is not built")
    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(baselines, "_MEMORY", {})
    monkeypatch.setattr(composition, "_KEPT", OrderedDict())
    with TestClient(create_app(preload=("default",))) as c:
        yield c


def watched(client: TestClient, monkeypatch, body: dict[str, Any]) -> list[dict[str, Any]]:
    """POST /api/heads with ``body`` and progress id :data:`ID`; the progress answer read at
    each new step the request reports (the request waits there until it is read), then the
    last one. Returns them in order."""
    reached: queue.Queue[str] = queue.Queue()
    release = threading.Semaphore(0)

    def held(self, name: str, done: int, total: int) -> None:
        new = name != self.current
        STEP(self, name, done, total)
        if new and self.id == ID:
            reached.put(name)
            assert release.acquire(timeout=120), "the test never read this step"

    monkeypatch.setattr(progress.Job, "step", held)
    answer: dict[str, Any] = {}
    request = threading.Thread(
        target=lambda: answer.update(
            r=client.post("/api/heads", json={"model": "default", **body, "progress_id": ID})
        )
    )
    request.start()
    seen = []
    while request.is_alive() or not reached.empty():
        try:
            name = reached.get(timeout=0.05)
        except queue.Empty:
            continue
        report = client.get(f"/api/progress/{ID}").json()
        assert report["step"] == name and report["state"] == "running", report
        seen.append(report)
        release.release()
    request.join()
    assert answer["r"].status_code == 200, answer["r"].text
    seen.append(client.get(f"/api/progress/{ID}").json())
    return seen


def test_the_evidence_reports_its_steps_in_order(client, monkeypatch) -> None:
    """On a cold cache: the shuffled orders (3), the random-weights floors (3 random models),
    the scores, the composition scores, every head of the default model ablated (16); the
    plan before the first step names all five with an expected time from the model's size."""
    reports = watched(client, monkeypatch, {"evidence": True})
    running, last = reports[:-1], reports[-1]
    assert [r["step"] for r in running] == [
        "shuffled",
        "floors",
        "scores",
        "composition",
        "ablation",
    ]
    totals = {r["step"]: r["total"] for r in running}
    assert totals["shuffled"] == 3 and totals["floors"] == 3
    assert [r["label"] for r in running][1] == "random-weights floors"
    plan = running[0]["steps"]
    assert [s["step"] for s in plan] == [r["step"] for r in running]
    assert {s["basis"] for s in plan} == {"estimate"} and running[0]["expected_s"] is not None
    assert "estimate from the model's size" in running[0]["expected"]
    assert "measured" not in running[0]["expected"]
    assert last["state"] == "finished" and last["step"] is None
    assert all(s["state"] == "done" and s["seconds"] is not None for s in last["steps"])
    ablated = client.post("/api/heads", json={"model": "default", "evidence": True}).json()
    assert totals["ablation"] == ablated["evidence"]["ablation"]["heads"] == 16


def test_a_second_run_expects_the_times_the_first_took(client, monkeypatch) -> None:
    """After one run, the plan quotes each step's measured time (the same tokens: unscaled)
    and nothing for the floors and the composition scores, now cached."""
    first = watched(client, monkeypatch, {"evidence": True})[-1]
    again = watched(client, monkeypatch, {"evidence": True})[0]
    took = {s["step"]: s["seconds"] for s in first["steps"]}
    plan = {s["step"]: s for s in again["steps"]}
    assert plan["floors"]["basis"] == plan["composition"]["basis"] == "cached"
    assert plan["floors"]["expected_s"] == plan["composition"]["expected_s"] == 0.0
    for name in ("shuffled", "scores", "ablation"):
        assert plan[name]["basis"] == "measured"
        assert plan[name]["expected_s"] == pytest.approx(took[name], abs=0.051)
    assert again["expected"].startswith("measured here by the last run")
    assert "random-weights floors" in again["expected"] and "estimate" not in again["expected"]


def test_labels_alone_report_the_floors_then_the_scores(client, monkeypatch) -> None:
    reports = watched(client, monkeypatch, {})
    assert [r["step"] for r in reports[:-1]] == ["floors", "scores"]
    assert reports[-1]["state"] == "finished"


def test_a_refused_request_says_why(client) -> None:
    r = client.post(
        "/api/heads",
        json={"model": "default", "probe": "text", "text": " ", "progress_id": ID},
    )
    assert r.status_code == 422
    report = client.get(f"/api/progress/{ID}").json()
    assert report["state"] == "failed" and report["failed"] == r.json()["detail"]


def test_an_id_not_seen_is_waiting_and_a_bad_one_refused(client) -> None:
    report = client.get("/api/progress/00000000").json()
    assert report["state"] == "waiting" and report["steps"] == []
    assert client.get("/api/progress/XYZ").status_code == 422
    r = client.post("/api/heads", json={"model": "default", "progress_id": "not hex"})
    assert r.status_code == 422 and "progress_id" in r.text


def test_kept_times_are_checked_when_read(tmp_path, monkeypatch) -> None:
    """A kept time is used only as written, for the model, config and machine it was measured
    on: an edited value, another config or another machine reads as nothing kept."""
    from headlab.model import ModelConfig

    config = ModelConfig(vocab_size=16, n_layers=1, n_heads=2, d_model=8, max_len=8)
    timings = Timings(tmp_path)
    timings.record("m", config, {"scores": {"seconds": 2.5, "tokens": 10}})
    assert timings.read("m", config) == {"scores": {"seconds": 2.5, "tokens": 10}}
    other = ModelConfig(vocab_size=16, n_layers=2, n_heads=2, d_model=8, max_len=8)
    assert timings.read("m", other) == {}
    (path,) = tmp_path.iterdir()
    stored = json.loads(path.read_text())
    stored["steps"]["scores"]["seconds"] = 0.1
    path.write_text(json.dumps(stored))
    assert timings.read("m", config) == {}
    timings.record("m", config, {"scores": {"seconds": 2.5, "tokens": 10}})
    monkeypatch.setattr(progress, "machine_record", lambda: {"cpu": "another"})
    assert timings.read("m", config) == {}
