"""The documentation says what the code and the results files say.

- every figure marker in docs/ renders, and no table of numbers in docs/ is typed in by hand;
- the rendered tables carry the results files' numbers (read here independently), and each
  caption the versions its file records (or that it records none);
- README.md's written figures are fresh, and a stale one is caught;
- the README's and the guides' Python examples print what the pages say they print;
- the stored command answers in docs/data/ are what the commands print now;
- the generated references cover every command and every API operation;
- the README stays a ten-minute read whose install lines work from a checkout.

The site's strict build is `make docs` (run by `make test`); tests/browser/test_docs_site.py opens
it in Chromium.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts/docs"))

import figures  # noqa: E402  (scripts/docs, put on the path above)
import reference  # noqa: E402
import snippets  # noqa: E402

DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = sorted(DOCS.rglob("*.md"))
RESULTS = ROOT / "src/headlab/experiments/results"


def results(name: str) -> dict:
    return json.loads((RESULTS / f"{name}.json").read_text(encoding="utf-8"))


def prose(markdown: str) -> str:
    """The page without its code, blocks and inline (code shows examples, not figures)."""
    return "".join(p for i, p in enumerate(figures.FENCE.split(markdown)) if i % 2 == 0)


def table_rows(markdown: str) -> list[list[str]]:
    """Every Markdown table row's cells, header and separator rows left out."""
    rows = []
    for line in markdown.splitlines():
        if line.startswith("|") and not re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", line.strip()):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


# --- the docs' figures -----------------------------------------------------------------------


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_every_figure_marker_renders(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    expanded = figures.expand(text)  # raises FigureError naming a missing file, table or path
    assert "<!-- figure:" not in prose(expanded) and "<!-- value:" not in prose(expanded)


def test_no_table_of_measured_numbers_is_typed_into_the_docs() -> None:
    """A table row in a page's source holding a decimal number, a percentage or a ratio was
    pasted from a run: it must be a figure marker, rendered from its results file."""
    measured = re.compile(r"(?<![\w.])\d+\.\d+(?![\w.])|\d%|×\d")
    pasted = [
        f"{page.relative_to(ROOT)}: {' | '.join(row)}"
        for page in PAGES
        for row in table_rows(prose(page.read_text(encoding="utf-8")))
        if any(measured.search(cell) for cell in row)
    ]
    assert not pasted, "tables typed in by hand:\n" + "\n".join(pasted)


def test_a_wrong_marker_stops_the_build_with_its_reason() -> None:
    for marker, reason in [
        ("<!-- figure: experiments/nonesuch#seeds -->", "no results file"),
        ("<!-- figure: experiments/induction#nonesuch -->", "no table"),
        ("<!-- value: experiments/induction#final.nonesuch -->", "nonesuch"),
        ("<!-- value: elsewhere/x#y -->", "unknown source"),
    ]:
        with pytest.raises(figures.FigureError, match=reason):
            figures.expand(f"Text.\n\n{marker}\n")


def test_the_induction_table_carries_every_seed_of_its_results_file() -> None:
    shipped = results("induction")
    rows = {r[0]: r[1:] for r in table_rows(figures.render("experiments/induction#seeds"))}
    steps = rows["phase change: steepest fall of the in-context gain, step (window)"]
    assert len(steps) == len(shipped["seeds"]) == 3
    for cell, seed in zip(steps, shipped["seeds"], strict=True):
        lo, hi = seed["window"]
        assert cell == f"{seed['phase_change_step']} ({lo}–{hi})"
    control = rows["1-layer control: best induction score"]
    assert control == [f"{s['control_max_induction_score']:.2f}" for s in shipped["seeds"]]


def test_the_pruning_and_gqa_tables_carry_their_results() -> None:
    shipped = results("prune")
    rows = {r[0]: r for r in table_rows(figures.render("experiments/prune#summary"))}
    for s in shipped["summary"]:
        half = s["half_pruned_rel_importance"]["mean"], s["half_pruned_rel_random_mean"]["mean"]
        assert rows[s["model"]][4] == f"×{half[0]:.2f} / ×{half[1]:.2f}"
    gqa = results("gqa")
    rows = {r[0]: r for r in table_rows(figures.render("experiments/gqa#decode"))}
    mqa = [r["ratio_vs_mha"] for r in gqa["decode"] if r["n_kv_heads"] == 1]
    assert rows["h_kv 1 (MQA)"][1:] == [f"×{x:.2f}" for x in mqa]


def test_a_benchmark_table_is_its_results_file_table() -> None:
    files = sorted((ROOT / "benchmarks/results").glob("*.json"))
    assert files, "no benchmark results file"
    for path in files:
        data = json.loads(path.read_text(encoding="utf-8"))
        assert {"command", "machine"} <= set(data), f"{path.name}: needs command and machine"
        if "table" in data:
            rendered = table_rows(figures.render(f"bench/{path.stem}#table"))
            expected = [data["table"]["columns"], *data["table"]["rows"]]
            assert rendered == [[str(c) for c in row] for row in expected]


# --- what each table ran on ----------------------------------------------------------------------


def toy_results(monkeypatch: pytest.MonkeyPatch, root: Path, data: dict) -> str:
    """``data`` as the benchmark results file bench/toy under ``root``, which figures reads."""
    folder = root / "benchmarks/results"
    folder.mkdir(parents=True)
    table = {"columns": ["what", "value"], "rows": [["x", "1"]]}
    command = {"command": "python benchmarks/bench_toy.py", "date": "2026-12-03"}
    (folder / "toy.json").write_text(json.dumps({**command, **data, "table": table}))
    monkeypatch.setattr(figures, "ROOT", root)
    monkeypatch.setitem(figures.FOLDERS, "bench", folder)
    figures.load.cache_clear()
    caption = figures.render("bench/toy#table").splitlines()[-1]
    figures.load.cache_clear()
    return caption


def test_a_tables_caption_names_the_versions_it_ran_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    versions = {
        "python": "3.11.7",
        "platform": "Linux x86_64",
        "torch": "2.13.0+cpu",
        "numba": "0.68.1",
        "transformers": "not installed",
        "lock": "dev 0123456789ab",
    }
    caption = toy_results(monkeypatch, tmp_path / "a", {"versions": versions})
    assert caption == (
        "*From `benchmarks/results/toy.json`: `python benchmarks/bench_toy.py`, 2026-12-03. "
        "Ran on Python 3.11.7, torch 2.13.0+cpu, numba 0.68.1, lock dev 0123456789ab.*"
    )
    versions |= {"transformers": "5.25.0", "lock": "none: the installed versions are not a lock's"}
    caption = toy_results(monkeypatch, tmp_path / "b", {"versions": versions})
    assert caption.endswith(
        "Ran on Python 3.11.7, torch 2.13.0+cpu, numba 0.68.1, transformers 5.25.0, "
        "no lock: the installed versions are not a lock's.*"
    )


def test_a_file_written_before_versions_were_recorded_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    caption = toy_results(monkeypatch, tmp_path / "a", {"machine": "a 2-core machine"})
    assert caption.endswith("`python benchmarks/bench_toy.py`, 2026-12-03. Versions not recorded.*")
    machine = {"cores": 2, "python": "3.11.2", "torch": "2.12.0"}
    caption = toy_results(monkeypatch, tmp_path / "b", {"machine": machine})
    assert caption.endswith(" Versions not recorded beyond Python 3.11.2 and torch 2.12.0.*")


def test_every_table_in_the_docs_says_what_it_ran_on() -> None:
    """Each table a page renders ends in a caption quoting its file's versions (read here from
    the JSON), or saying plainly that the file has none; the benchmarks page's sections too."""
    found = (figures.FIGURE.finditer(prose(page.read_text())) for page in PAGES)
    refs = {m["ref"] for markers in found for m in markers}
    files = sorted((ROOT / "benchmarks/results").glob("*.json"))
    refs |= {f"bench/{path.stem}#table" for path in files}
    assert len(refs) > 20
    for ref in sorted(refs):
        source, _, name = ref.partition("#")
        kind, _, stem = source.partition("/")
        folder = {
            "bench": "benchmarks/results",
            "experiments": "src/headlab/experiments/results",
            "data": "docs/data",
        }[kind]
        data = json.loads((ROOT / folder / f"{stem}.json").read_text(encoding="utf-8"))
        caption = figures.render(f"{source}#{name}").splitlines()[-1]
        assert caption.startswith(f"*From `{folder}/{stem}.json`: "), caption
        if "versions" in data:
            v = data["versions"]
            assert f"Ran on Python {v['python']}, torch {v['torch']}, " in caption, caption
            assert v["lock"].split(" ")[-1] in caption, caption
        else:
            assert "Versions not recorded" in caption, caption
    from benchmark_pages import benchmarks_section

    page = benchmarks_section()
    assert page.count(". Versions not recorded") + page.count(". Ran on Python ") == len(files)


# --- the README's figures ----------------------------------------------------------------------


def test_the_readmes_figures_agree_with_their_results_files() -> None:
    text = README.read_text(encoding="utf-8")
    written = list(figures.VALUE.finditer(text)) + list(figures.FIGURE.finditer(text))
    assert len([m for m in written if m["body"] is not None]) >= 8
    assert figures.stale(text) == []
    # the headline claim, recomputed from the results file by hand
    steps = [s["phase_change_step"] for s in results("induction")["seeds"]]
    number = r"<!--[^>]*-->(\d+)<!--[^>]*-->"
    claim = re.search(rf"between steps\s+{number}\s+and\s+{number}", text)
    assert claim and (int(claim[1]), int(claim[2])) == (min(steps), max(steps))


def test_a_stale_readme_figure_is_caught() -> None:
    text = README.read_text(encoding="utf-8")
    m = next(m for m in figures.VALUE.finditer(text) if m["body"])
    wrong = text[: m.start("body")] + m["body"] + "9" + text[m.end("body") :]
    assert figures.stale(wrong) == [m["ref"]]
    assert figures.stale(figures.expand(wrong, written=True)) == []


# --- examples that print what the pages say ------------------------------------------------------


def check_examples(page: Path, at_least: int) -> None:
    ran = snippets.run(page.read_text(encoding="utf-8"))
    assert len(ran) >= at_least
    for ex in ran:
        assert ex.ok, f"{page.name}: the example\n{ex.code}\nprinted\n{ex.got}\nnot\n{ex.expected}"


def test_the_readme_library_example_prints_what_it_says() -> None:
    check_examples(README, 1)


@pytest.mark.slow
def test_the_tutorial_examples_print_what_they_say() -> None:
    check_examples(DOCS / "tutorial.md", 8)


@pytest.mark.slow
@pytest.mark.parametrize("page", ["heads.md", "how-to/own-model.md", "how-to/generate.md"])
def test_the_guides_examples_print_what_they_say(page: str) -> None:
    pytest.importorskip("transformers")
    check_examples(DOCS / page, 1)


def test_an_example_that_prints_otherwise_is_caught() -> None:
    page = "```python\nprint(1 + 1)\n```\n\n```text\n3\n```\n"
    (ex,) = snippets.run(page)
    assert ex.got.strip() == "2" and not ex.ok


# --- stored command answers ------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", ["heads-default", "heads-default-random"])
def test_a_stored_answer_is_what_its_command_prints(name: str) -> None:
    stored = json.loads((DOCS / "data" / f"{name}.json").read_text(encoding="utf-8"))
    argv = [sys.executable, "-m", "headlab.cli", *stored["command"].split()[1:]]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    now = json.loads(
        subprocess.run(argv, capture_output=True, text=True, env=env, check=True).stdout
    )
    old = stored["output"]
    assert now["tokens"] == old["tokens"]
    for a, b in zip(now["heads"], old["heads"], strict=True):
        assert a["label"] == b["label"] and a["offset"] == b["offset"]
        for key, value in a["scores"].items():
            assert value == pytest.approx(b["scores"][key], abs=0.01), (a["layer"], a["head"], key)


# --- the generated references ------------------------------------------------------------------


def test_the_cli_reference_has_every_command_and_option() -> None:
    import typer.main

    from headlab.cli import app

    page = reference.cli_page()
    group = typer.main.get_command(app)
    for name, command in group.commands.items():
        assert f"## `headlab {name}`" in page
        for param in command.params:
            for opt in getattr(param, "opts", []):
                if opt.startswith("--") and not getattr(param, "hidden", False):
                    assert f"`{opt}" in page, (name, opt)


def test_the_json_api_reference_has_every_operation() -> None:
    from headlab.server import create_app

    page = reference.json_api_page()
    spec = create_app().openapi()
    for path, ops in spec["paths"].items():
        for method in ops:
            assert f"## `{method.upper()} {path}`" in page
    for name in spec["components"]["schemas"]:
        assert f"### {name}" in page


# --- the README ------------------------------------------------------------------------------


def test_the_readme_is_a_ten_minute_read_with_the_three_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    for command in ("make serve", "make test", "make docs"):
        assert command in text
    assert "docs/screenshot.png" in text


def test_install_lines_work_from_a_checkout() -> None:
    """headlab is not on a package index: every install line installs the checkout."""
    for path in [README, *PAGES]:
        for line in path.read_text(encoding="utf-8").splitlines():
            if "pip install" in line and "headlab" in line.split("pip install", 1)[1]:
                pytest.fail(f"{path.relative_to(ROOT)}: {line.strip()}: use pip install -e '.[x]'")
