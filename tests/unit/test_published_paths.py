"""What the server and the static site publish names no folder of the machine that built them
(issue 43): a model not fetched said "into /root/.cache/headlab/smollm2" in GET /api/models,
in the static site's api/models.json and in the 404 for it. Now a path under the home folder is
shown from ``~`` and a cache outside it as "the headlab cache".

The oracle is the plain text of each answer: neither the cache's absolute path nor the home
folder's may appear in it, whatever the cache is (under home, or elsewhere).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from headlab import site
from headlab.server import create_app
from headlab.server.stored import page_answers


@pytest.fixture(params=["elsewhere", "under home"])
def machine(request, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A builder's home folder and headlab cache, both in tmp: (home, cache)."""
    home = tmp_path / "home" / "alice"
    home.mkdir(parents=True)
    cache = tmp_path / "cache" if request.param == "elsewhere" else home / ".cache" / "headlab"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HEADLAB_CACHE", str(cache))
    for variable in ("HF_HOME", "HF_HUB_CACHE"):  # the Hugging Face cache follows HOME
        monkeypatch.delenv(variable, raising=False)
    return home, cache


def private(text: str, home: Path, cache: Path) -> list[str]:
    """The absolute folders of the machine that ``text`` names."""
    return [str(folder) for folder in (home, cache) if str(folder) in text]


def test_the_model_list_and_the_404_name_no_folder_of_the_machine(machine) -> None:
    home, cache = machine
    shown = "~/.cache/headlab" if cache.is_relative_to(home) else "the headlab cache"
    with TestClient(create_app(preload=())) as client:
        listed = client.get("/api/models")
        refused = client.post("/api/attention", json={"model": "smollm2"})
    assert listed.status_code == 200
    rows = {row["name"]: row for row in listed.json()}
    assert not rows["smollm2"]["available"]  # an empty cache: not fetched
    assert shown in rows["smollm2"]["reason"], rows["smollm2"]
    assert private(listed.text, home, cache) == [], listed.text
    assert refused.status_code == 404 and "not fetched" in refused.text, refused.text
    assert shown in refused.text and private(refused.text, home, cache) == [], refused.text


@pytest.mark.slow
def test_the_static_sites_answers_name_no_folder_of_the_machine(machine, tmp_path) -> None:
    home, cache = machine
    out = tmp_path / "site"
    routes = site.write_answers(out, page_answers())
    assert "models" in routes
    models = (out / "api" / "models.json").read_text()
    assert "smollm2" in models and private(models, home, cache) == [], models
    for answer in (out / "api").rglob("*.json"):  # every stored answer, not the list alone
        assert private(answer.read_text(), home, cache) == [], answer
