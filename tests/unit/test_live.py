"""Live training from the page (POST /api/live/induction, server-sent events) through a real
uvicorn server: bad knobs, a second concurrent run, cancelling, a dropped connection and the time
limit all get clear answers, the server keeps serving, and no thread outlives its run."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from headlab.server import create_app

pytestmark = pytest.mark.slow
URL = "/api/live/induction"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(**kw: float) -> Iterator[str]:
    import uvicorn

    port = _free_port()
    srv = uvicorn.Server(
        uvicorn.Config(create_app(preload=(), **kw), port=port, log_level="warning")
    )
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not srv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(timeout=30)


@pytest.fixture
def client(server: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server, timeout=60) as c:
        c.get("/api/health")  # the thread pool of plain endpoints exists before the baseline
        yield c


def events(response: httpx.Response) -> Iterator[tuple[str, dict]]:
    """(name, data) of each server-sent event, as they arrive."""
    name = "message"
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            yield name, json.loads(line[6:])


def live_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("live-")]


def wait_idle(client: httpx.Client, baseline: int, seconds: float = 60) -> None:
    """Until no run trains and the thread count is back to ``baseline``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        idle = client.get("/api/live").json()["running"] is None and not live_threads()
        if idle and threading.active_count() <= baseline:
            return
        time.sleep(0.05)
    raise AssertionError(f"still running: {live_threads()}, {threading.active_count()} threads")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"n_layers": 3}, "n_layers"),
        ({"n_heads": 5}, "n_heads"),
        ({"seed": -1}, "seed"),
        ({"seed": "zero"}, "seed"),
        ({"seed": "3"}, "seed"),  # a JSON number, not a string that reads as one
        ({"seed": True}, "seed"),  # true is not 1
        ({"n_layers": True}, "n_layers"),
        ({"n_heads": "4"}, "n_heads"),
        ({"lr": 0.1}, "lr"),
        ({"threads": 0}, "threads"),
        ({"threads": "two"}, "threads"),
        ({"threads": "2"}, "threads"),  # a JSON number or "auto", not a string that reads as one
        ({"threads": True}, "threads"),
        ({"threads": 1.5}, "threads"),
        ({"threads": None}, "threads"),
    ],
)
def test_unknown_knob_values_get_a_clear_422(client: httpx.Client, body: dict, field: str) -> None:
    baseline = threading.active_count()
    r = client.post(URL, json=body)
    assert r.status_code == 422
    assert r.json()["detail"].startswith(field)
    if field == "threads":  # the sentence names what is valid
        assert r.json()["detail"].startswith('threads: should be one of "auto", 1, 2')
    assert client.get("/api/live").json()["running"] is None  # nothing was started
    assert client.get("/api/health").status_code == 200
    assert threading.active_count() == baseline


def test_the_status_names_the_recipe_and_the_knobs(client: httpx.Client) -> None:
    from headlab.experiments.induction import LIVE

    body = client.get("/api/live").json()
    assert body["running"] is None
    assert body["recipe"]["steps"] == LIVE.steps and body["recipe"]["seq_len"] == LIVE.seq_len
    knobs = body["knobs"]
    assert sorted(c["value"] for c in knobs["n_layers"]["choices"]) == [1, 2]
    assert sorted(c["value"] for c in knobs["n_heads"]["choices"]) == [2, 4, 8]
    assert (knobs["seed"]["min"], knobs["seed"]["max"]) == (0, 9999)
    assert {k["default"] for k in knobs.values()} and knobs["n_layers"]["default"] == 2


@pytest.mark.parametrize(
    ("name", "good", "bad"),
    [
        ("seed", [0, 9999], [-1, 10000]),
        ("n_layers", [1, 2], [0, 3]),
        ("n_heads", [2, 8], [3, 16]),
        ("threads", ["auto", 1, 2, 2.0], [0, 3, -1, "Auto", "1"]),
    ],
)
def test_the_served_knobs_are_what_the_request_accepts(
    client: httpx.Client, name: str, good: list[int], bad: list[int]
) -> None:
    """One statement of the knobs: what GET /api/live offers is what POST accepts (a good value
    is checked without training: it passes validation and meets the running run, so 409)."""
    knob = client.get("/api/live").json()["knobs"][name]
    offered = [c["value"] for c in knob["choices"]] if "choices" in knob else None
    for value in bad:
        r = client.post(URL, json={name: value})
        assert r.status_code == 422 and r.json()["detail"].startswith(name), r.json()
        assert offered is None or value not in offered
    baseline = threading.active_count()
    with client.stream("POST", URL, json={"seed": 7}) as first:
        stream = events(first)
        run_id = next(stream)[1]["run_id"]
        for value in good:
            assert offered is None or value in offered
            assert client.post(URL, json={name: value}).status_code == 409  # valid, but busy
        client.delete(f"/api/live/runs/{run_id}")
        assert list(stream)[-1][0] == "stopped"
    wait_idle(client, baseline)


def test_second_run_is_busy_and_cancel_stops_the_first(client: httpx.Client) -> None:
    baseline = threading.active_count()
    with client.stream("POST", URL, json={"seed": 3}) as first:
        assert first.status_code == 200
        assert first.headers["content-type"].startswith("text/event-stream")
        stream = events(first)
        name, run = next(stream)
        assert name == "run" and run["seed"] == 3 and run["n_layers"] == 2
        busy = client.post(URL, json={"seed": 4})
        assert busy.status_code == 409
        assert busy.json()["run_id"] == run["run_id"] and "busy" in busy.json()["detail"]
        assert client.get("/api/live").json()["running"] == run["run_id"]
        assert client.get("/api/health").status_code == 200  # still serving meanwhile
        assert next(e for e in stream if e[0] == "step")[1]["step"] > 0
        r = client.delete(f"/api/live/runs/{run['run_id']}")
        assert r.status_code == 200 and r.json() == {"cancelled": run["run_id"]}
        rest = list(stream)
    assert rest[-1][0] == "stopped" and rest[-1][1]["reason"] == "cancelled"
    said = rest[-1][1]["text"]  # what the run did before it stopped, and on what
    assert said.startswith(f"Run {run['run_id']} stopped: cancelled, after ") and "torch" in said
    assert "verdict" not in [n for n, _ in rest]
    wait_idle(client, baseline)


def test_cancel_of_an_unknown_run_is_404_naming_what_runs(client: httpx.Client) -> None:
    r = client.delete("/api/live/runs/0123456789ab")
    assert r.status_code == 404
    assert (
        "no run '0123456789ab'" in r.json()["detail"] and "no run is training" in r.json()["detail"]
    )
    assert client.delete("/api/live/runs/not-a-run!").status_code == 422
    assert client.get("/api/health").status_code == 200


def test_a_dropped_connection_stops_its_run(client: httpx.Client) -> None:
    baseline = threading.active_count()
    with client.stream("POST", URL, json={"seed": 1}) as r:
        stream = events(r)
        run_id = next(stream)[1]["run_id"]
        next(e for e in stream if e[0] == "step")
        assert client.get("/api/live").json()["running"] == run_id
    # the connection is closed here, mid-run, as a closed tab would
    wait_idle(client, baseline)
    assert client.get("/api/health").status_code == 200
    with client.stream("POST", URL, json={"seed": 2, "n_layers": 1}) as again:  # free again
        name, run = next(events(again))
        assert name == "run" and run["n_layers"] == 1
    wait_idle(client, baseline)


def test_a_run_is_bounded_in_time() -> None:
    for base in _serve(live_seconds=0.5):
        with httpx.Client(base_url=base, timeout=60) as client:
            client.get("/api/health")
            baseline = threading.active_count()
            with client.stream("POST", URL, json={}) as r:
                last = list(events(r))[-1]
            assert last[0] == "stopped" and last[1]["reason"].startswith("time limit")
            wait_idle(client, baseline)


def test_a_live_run_trains_on_the_threads_set_and_restores_them(monkeypatch) -> None:
    """HEADLAB_LIVE_THREADS (headlab serve --live-threads) sets the torch threads of a run's
    training; the process's own count is back when the run ends; a bad value is refused."""
    import asyncio

    import torch

    from headlab.experiments import induction as ind
    from headlab.server import settings
    from headlab.server.live import Knobs, LiveRuns

    seen: list[int] = []

    def fake_study(*args, **kwargs):
        seen.append(torch.get_num_threads())
        kwargs["stop"].stop("enough")

    monkeypatch.setattr(ind, "study", fake_study)
    before = torch.get_num_threads()
    monkeypatch.setenv("HEADLAB_LIVE_THREADS", "3")
    runs = LiveRuns(threads=settings.live_threads())
    run = runs.start(Knobs(), asyncio.new_event_loop())
    assert run.thread is not None
    run.thread.join(timeout=30)
    assert seen == [3] and torch.get_num_threads() == before
    for bad in ("0", "two", "999"):
        monkeypatch.setenv("HEADLAB_LIVE_THREADS", bad)
        with pytest.raises(ValueError, match="HEADLAB_LIVE_THREADS"):
            settings.live_threads()
    monkeypatch.delenv("HEADLAB_LIVE_THREADS")
    assert settings.live_threads() is None  # unset: each run chooses from the machine's load


def test_the_live_sections_code_link_shows_the_score_the_panel_draws():
    """The "Show the code" link beside the live panel names the head score the panel's curves
    are: the experiment's per-evaluation induction scores equal that function on the weights."""
    import re
    from pathlib import Path

    import torch

    import headlab.heads
    from headlab.experiments import induction as ind

    page = (Path(headlab.__file__).parent / "server/static/index.html").read_text()
    live = page[
        page.index('id="live-train-h"') : page.index("</section>", page.index("live-train-h"))
    ]
    linked = re.findall(r'data-code="headlab\.heads\.([a-z_]+)"', live)
    assert linked == ["induction_score"]
    model, data = ind.make_model(ind.LIVE, 2, 0), ind.held_out(ind.LIVE, 0)
    with torch.no_grad():  # as the training loop evaluates
        record, weights = ind.metrics(model.eval(), data)
    score = getattr(headlab.heads, linked[0])
    assert record["induction"] == [score(w, data.inputs).tolist() for w in weights]


# --- threads: the rule, the choice, the words -------------------------------------------------


@pytest.mark.parametrize(
    ("cores", "load", "threads"),
    [
        (2, 0.0, 2),  # idle: both cores
        (2, 0.2, 2),  # a core counts as free when at least 3/4 of it was idle
        (2, 0.3, 1),
        (2, 1.0, 1),  # one other busy process: one thread
        (2, 7.5, 1),  # never fewer than one
        (1, 0.0, 1),  # never more than the cores
        (8, 0.0, 2),  # never more than AUTO_MOST
        (8, 6.2, 2),
        (8, 6.3, 1),
        (2, None, 1),  # no load average on this system: the safe choice
        (2, float("nan"), 1),
    ],
)
def test_auto_threads_count_the_free_cores_in_the_load(cores, load, threads) -> None:
    from headlab.server.live import AUTO_MOST, auto_threads

    assert AUTO_MOST == 2
    assert auto_threads(cores, load) == threads


def test_the_threads_a_run_gets_and_why() -> None:
    from headlab.server.live import choose_threads

    picked = choose_threads(1, cores=2, load=0.0)
    assert (picked.count, picked.why) == (1, "as picked")
    fixed = choose_threads("auto", cores=2, load=0.0, fixed=3)
    assert fixed.count == 3 and "--live-threads" in fixed.why
    busy = choose_threads("auto", cores=2, load=1.24)
    assert busy.count == 1 and busy.why == "auto: load average 1.24 over the last minute on 2 cores"
    assert "no load average" in choose_threads("auto", cores=2, load=None).why


def test_the_ending_says_time_threads_why_and_whether_other_work_ran() -> None:
    from headlab.server.live import choose_threads, ending_text

    idle = choose_threads("auto", cores=2, load=0.05)
    text = ending_text(idle, 9.14, 700, 0.62, "Run ab finished:")
    assert text == (
        "Run ab finished: 700 steps in 9.1 s on 2 torch threads "
        "(auto: load average 0.05 over the last minute on 2 cores)."
    )
    busy = choose_threads("auto", cores=2, load=1.31)
    text = ending_text(busy, 24.3, 700, 1.9, "Run ab finished:")
    assert "on 1 torch thread (auto: load average 1.31" in text
    assert "Other work shared the cores (load average 1.31 at the start, 1.90 at the end" in text
    # the load at the end counts the run's own threads: 2 threads and 2.1 is no other work
    assert "Other work" not in ending_text(idle, 9.0, 700, 2.1, "Run ab finished:")
    assert "Other work" in ending_text(idle, 90.0, 700, 3.2, "Run ab finished:")


@pytest.mark.parametrize(("load", "threads"), [(0.0, 2), (1.5, 1)])
def test_an_auto_run_trains_on_the_threads_the_load_allows(monkeypatch, load, threads) -> None:
    """LiveRuns reads the load (injected here) when a run starts; the run trains on the threads
    the rule gives, says so in its run and done events, and restores the process's count."""
    import asyncio

    import torch

    from headlab.experiments import induction as ind
    from headlab.server.live import Knobs, LiveRuns
    from headlab.training.watch import Done

    seen: list[int] = []
    monkeypatch.setattr(ind, "study", lambda *a, **kw: seen.append(torch.get_num_threads()) or {})
    before, pushed = torch.get_num_threads(), []
    runs = LiveRuns(load=lambda: load, cores=2)
    loop = asyncio.new_event_loop()
    run = runs.start(Knobs(), loop)
    assert run.thread is not None
    run.thread.join(timeout=30)
    loop.run_until_complete(asyncio.sleep(0))
    while not run.events.empty():
        pushed.append(run.events.get_nowait())
    loop.close()
    assert seen == [threads] and torch.get_num_threads() == before
    assert run.describe()["threads"] == threads and run.describe()["load"] == load
    done = next(e for e in pushed if isinstance(e, Done)).to_dict()
    unit = "thread" if threads == 1 else "threads"
    assert done["threads"] == threads and f"steps in {done['seconds']:.1f} s" in done["text"]
    assert f"on {threads} torch {unit} (auto: load average {load:.2f}" in done["text"]


def test_the_stream_names_the_threads_and_ends_with_time_and_threads(
    client: httpx.Client, monkeypatch
) -> None:
    """The run event says how many threads and why; done says the wall time, the steps and
    the threads in one sentence; GET /api/live says what auto would pick now."""
    from headlab.experiments import induction as ind

    monkeypatch.setattr(ind, "study", lambda *a, **kw: {})
    auto = client.get("/api/live").json()["auto"]
    # the rule, or the server's setting (a test worker fixes it to its share of the cores)
    assert auto["threads"] >= 1
    assert auto["threads_why"].startswith(("auto: ", "set by headlab serve --live-threads"))
    baseline = threading.active_count()
    with client.stream("POST", URL, json={"threads": 1}) as r:
        got = dict(events(r))
    assert (got["run"]["threads"], got["run"]["threads_why"]) == (1, "as picked")
    done = got["done"]
    assert done["threads"] == 1 and done["steps"] == ind.LIVE.steps and done["seconds"] >= 0
    assert done["text"].startswith(f"Run {got['run']['run_id']} finished: {ind.LIVE.steps} steps")
    assert "on 1 torch thread (as picked)" in done["text"]
    wait_idle(client, baseline)
