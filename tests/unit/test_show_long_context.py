"""The notebook views of the long-context runs: executed in a kernel by nbclient, each cell's
HTML carries the run's verdicts and a PNG of its figures."""

from __future__ import annotations

import base64
import html
import json
import re

import pytest

from headlab.experiments import results_path


def test_retrieval_and_sinks_views_render_in_a_notebook() -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("from headlab.show import retrieval_view, sinks_view"),
        nbformat.v4.new_code_cell("retrieval_view()"),
        nbformat.v4.new_code_cell("sinks_view()"),
    ]
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3").execute()
    for cell, name in zip(nb.cells[1:], ("retrieval", "sinks"), strict=True):
        shown = [o for o in cell.outputs if o.get("output_type") == "execute_result"]
        assert len(shown) == 1, cell.outputs
        body = shown[0]["data"]["text/html"]
        stored = json.loads(results_path(name).read_text())
        said = [html.unescape(x) for x in re.findall(r"<li>(.*?)</li>", body)]
        assert said == stored["verdict"]
        assert f"headlab experiment {name}, {stored['date']}" in body
        png = base64.b64decode(re.search(r"base64,([A-Za-z0-9+/=]+)", body).group(1))
        assert png.startswith(b"\x89PNG") and len(png) > 10_000
