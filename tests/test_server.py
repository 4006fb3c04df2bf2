"""The explainer's API through FastAPI's TestClient: every endpoint, valid and invalid requests."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from headlab.server import create_app
from headlab.server.cli import check_port, is_loopback
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
            check_port("127.0.0.1", port)
        result = CliRunner().invoke(app, ["serve", "--port", str(port)])
    assert result.exit_code == 2
    assert "cannot listen" in result.output and "Traceback" not in result.output
