"""The mkdocs hook that makes the site's generated parts (mkdocs.yml: ``hooks``):

- reference/cli.md and reference/json-api.md, from the typer app and the OpenAPI schema
  (scripts/docs/reference.py);
- the experiments' figures, results/figures/NAME-FIGURE.png, drawn by each experiment's own
  figure code from its shipped results file;
- every ``<!-- figure: ... -->`` and ``<!-- value: ... -->`` marker, expanded from its results
  file (scripts/docs/figures.py), and ``<!-- benchmarks -->``, every benchmark with its command,
  machine and results (scripts/docs/benchmark_pages.py).

A marker that names a missing file, table or value stops the build with the page's name. The
docstrings' Sphinx roles (``:func:`analyse```) show as plain code.
"""

from __future__ import annotations

import re

import figures
from benchmark_pages import benchmarks_section
from experiment_figures import draw_all
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from reference import cli_page, json_api_page


def on_files(files: Files, config: dict) -> Files:
    """Add the generated reference pages and the experiments' figures."""
    figures.load.cache_clear()  # `mkdocs serve` rebuilds: read the results files again
    for uri, make in (("reference/cli.md", cli_page), ("reference/json-api.md", json_api_page)):
        files.append(File.generated(config, uri, content=make()))
    for uri, png in draw_all().items():
        files.append(File.generated(config, uri, content=png))
    return files


def on_page_markdown(markdown: str, page, config: dict, files: Files) -> str:
    """Expand the page's figure, value and benchmarks markers."""
    try:
        markdown = markdown.replace("<!-- benchmarks -->", benchmarks_section())
        return figures.expand(markdown)
    except figures.FigureError as e:
        raise PluginError(f"{page.file.src_uri}: {e}") from e


ROLE = re.compile(r":(?:func|class|meth|mod|data|attr|exc|obj):(?=<code)")


def on_page_content(html: str, page, config: dict, files: Files) -> str:
    """Drop the Sphinx role in front of a docstring's code: ``:func:`x``` reads as ``x``."""
    return ROLE.sub("", html)
