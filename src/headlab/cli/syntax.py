"""``headlab syntax``: each dependency relation's best head against a parse (Clark et al. 2019's
rule, :mod:`headlab.heads.syntax`)."""

from __future__ import annotations

import typer

from headlab.cli.common import ModelName, console, fail


def syntax_command(
    model: ModelName = "default",
    text_file: str | None = typer.Option(
        None,
        "--text-file",
        help="English text to parse, a UTF-8 file of at most 100,000 characters (default: the "
        "shipped evaluation text).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the table as JSON."),
) -> None:
    """Syntactic heads (Clark et al. 2019): per dependency relation, the head that finds the
    parser's arcs most often by Clark et al.'s rule in either direction, against the best
    fixed-offset baseline."""
    import json

    from headlab import files, zoo
    from headlab.heads.syntax import ParserUnavailable, syntax_report
    from headlab.scaling import MAX_PROMPT_CHARS

    try:  # as heads reads it: a regular file, at most as long, but an empty text is no error
        text = (
            None if text_file is None else files.read_text(text_file, MAX_PROMPT_CHARS, "text file")
        )
    except ValueError as exc:
        raise fail(f"--text-file: cannot read it: {exc}") from None
    try:
        m, tokenizer = zoo.load(model)
        report = syntax_report(m, tokenizer, text, name=model).to_dict()
    except ParserUnavailable as exc:
        raise fail(str(exc)) from None
    except ValueError as exc:
        raise fail(str(exc)) from None
    if as_json:
        typer.echo(json.dumps(report, ensure_ascii=False))
        return
    _print_syntax_table(report, model)


def _print_syntax_table(report: dict, model: str) -> None:
    """Per relation: the best head, its accuracy, and its margin over the offset baseline."""
    from rich.table import Table

    table = Table(
        "relation",
        "arcs",
        "head",
        "direction",
        "accuracy",
        "offset baseline",
        "margin",
        title=f"{model}: {report['sentences']} sentences, {report['words']} words",
        box=None,
        padding=(0, 1, 0, 0),
        header_style="bold underline",
    )
    for r in report["relations"]:
        margin = r["accuracy"] - r["baseline_accuracy"]
        table.add_row(
            r["relation"],
            str(r["count"]),
            f"{r['layer']}.{r['head']}",
            r["direction"].replace("dependent", "dep"),
            f"{r['accuracy']:.1%}",
            f"{r['baseline_accuracy']:.1%} (δ {r['baseline_offset']:+d})",
            f"{margin:+.1%}",
        )
    console.print(table)
    # one naming: headlab's layer.head from 0; the paper's tables count from 1
    console.print(
        "head: layer.head, both counted from 0 as everywhere in headlab (Clark et al. "
        "2019 count both from 1: their layer 8, head 10 is 7.9 here)",
        highlight=False,
    )
    if report.get("note"):
        console.print(f"note: {report['note']}", highlight=False)
