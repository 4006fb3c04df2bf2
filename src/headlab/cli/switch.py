"""``headlab heads --off L.H,...``: switch a set of heads off and print the probe run intact and
without them, side by side (:func:`headlab.heads.switch.switch_off`): the loss on the repeat, the
induction scores, each position's likeliest next token, and with --show one head's pattern in
both runs. torch and the library load inside the command."""

from __future__ import annotations

from typing import Any

import typer

from headlab.cli.common import console, ensure_fetched, err_console, fail

OFF_HELP = (
    "Switch these heads off together, e.g. --off 0.0,1.3 (layers and heads count from 0), and "
    "print the probe run intact and without them side by side: the loss on the repeat, every "
    "head's induction score, each position's likeliest next token (--ablation mean replaces "
    "each head's output by its average over the text, zero by zeros)."
)
SHOWN = 0.1  # induction scores listed: a head at or above this in either run


def parse_off(spec: str) -> list[tuple[int, int]]:
    """--off's heads: 'L.H,L.H' → [(L, H), ...] (exit 2 for anything else)."""
    try:
        pairs = [tuple(int(x) for x in part.strip().split(".")) for part in spec.split(",")]
    except ValueError:
        pairs = []
    if not pairs or any(len(p) != 2 for p in pairs):
        raise fail(f"--off takes LAYER.HEAD,... e.g. 0.0,1.3; got {spec!r}")
    return [(p[0], p[1]) for p in pairs]


def check_off(
    spec: str,
    probe: str | None,
    show: str | None,
    prompts: str | None,
    evidence: bool,
    html: str | None,
    syntax: bool,
) -> None:
    """Exit 2, before any work, for a malformed --off or one given with an option it does not
    run with (each would otherwise be quietly left out): --prompts, --evidence, --html,
    --syntax, the needle probe, or --show of a layer's averaged head."""
    parse_off(spec)
    given = {"--prompts": prompts is not None, "--evidence": evidence, "--html": html is not None}
    for option, there in {**given, "--syntax": syntax}.items():
        if there:
            raise fail(f"--off compares two runs of one probe; leave out {option}")
    if probe == "needle":
        raise fail("--off runs on a pattern probe or a text; the needle probe is not one")
    if show is not None and show.endswith(".avg"):
        raise fail(f"--show {show}: with --off it draws one head in both runs; give LAYER.HEAD")


def switch_heads(
    model: str,
    text: str | None,
    probe: str,
    seed: int,
    load: dict,
    spec: str,
    mode: Any,
    show: tuple[int, int] | None,
    as_json: bool,
) -> None:
    """Run ``probe`` (or ``text``) on ``model`` intact and with --off's heads switched off, and
    print both (JSON with ``as_json``)."""
    import json

    from headlab import zoo
    from headlab.heads.switch import switch_off
    from headlab.measure import build_probe

    heads = parse_off(spec)
    ensure_fetched(model)
    try:
        m, tokenizer = zoo.load(model, **load)
        L, h = m.config.n_layers, m.config.n_heads
        for option, (l, i) in [("--off", pair) for pair in heads] + [("--show", show or (0, 0))]:
            if not (0 <= l < L and 0 <= i < h):
                raise fail(
                    f"{option} {l}.{i}: this model has layers 0..{L - 1} and heads 0..{h - 1}"
                )
        name = "text" if text is not None else probe
        p = build_probe(name, tokenizer, m.config.max_len, m.config.vocab_size, text, seed)
        with err_console.status("running the probe intact and with the heads off…"):
            result = switch_off(m, p, heads, mode)
    except ValueError as exc:
        raise fail(str(exc)) from None
    if as_json:
        body = {"model": model, "probe": p.name, "tokens": p.labels}
        typer.echo(json.dumps({**body, **result.to_dict(tokenizer.token_strings)}))
        return
    print_switched(model, p, result, tokenizer.token_strings, show)


def _say(line: str) -> None:
    console.print(line, highlight=False, soft_wrap=True)


def print_switched(model: str, p: Any, s: Any, strings: Any, show: tuple[int, int] | None) -> None:
    """The two runs as lines and a table: what was switched off and how, the losses, the
    induction scores that moved, each position's likeliest next token; --show's head drawn in
    both runs."""
    from rich.table import Table
    from rich.text import Text

    from headlab.heads.render import heatmap, key_legend

    off = ", ".join(f"{l}.{i}" for l, i in s.heads)
    how = (
        "each replaced by its average output over the text"
        if s.mode == "mean"
        else "each one's output replaced by zeros"
    )
    _say(f"{model}: {p.name} probe, {p.n} tokens; switched off: {off} ({s.mode}: {how})")
    loss = s.losses()
    for name, where in (("repeat", "on the repeat"), ("all", "on every position")):
        v = loss[name]
        if v is None:
            _say(f"loss {where}: the text repeats no token, so there is no repeat to predict")
        else:
            _say(
                f"loss {where} ({v['rows']} predictions): {v['intact']:.2f} → {v['off']:.2f} nats "
                f"({v['rise']:+.2f})"
            )
    moved = [
        f"{l}.{i} {float(a):.2f} → {float(b):.2f}"
        for l, (row_a, row_b) in enumerate(zip(s.intact.induction, s.off.induction, strict=True))
        for i, (a, b) in enumerate(zip(row_a, row_b, strict=True))
        if max(float(a), float(b)) >= SHOWN
    ]
    _say("induction scores (intact → off): " + (", ".join(moved) or f"none at or above {SHOWN}"))
    table = Table("pos", "token", "next", "intact: likeliest", "off: likeliest", "loss", "loss off")
    for j in range(p.n):
        top = [strings([int(r.top_ids[0, j, 0])])[0] for r in (s.intact, s.off)]
        probs = [float(r.top_probs[0, j, 0]) for r in (s.intact, s.off)]
        has_next = j + 1 < p.n
        cells = [
            str(j),
            f"'{p.labels[j]}'",
            f"'{p.labels[j + 1]}'" if has_next else "",
            f"'{top[0]}' {probs[0]:.2f}",
            f"'{top[1]}' {probs[1]:.2f}" + ("" if top[0] == top[1] else " *"),
            f"{float(s.intact.losses[0, j]):.2f}" if has_next else "",
            f"{float(s.off.losses[0, j]):.2f}" if has_next else "",
        ]
        table.add_row(*(Text(c) for c in cells))  # a token such as "[/" is no markup
    console.print(table)
    B = s.repeat_rows.shape[0]
    first = f"; the table shows the first of the probe's {B} sequences" if B > 1 else ""
    _say(f"* the likeliest next token changed{first}")
    if show is not None:
        layer, head = show
        for r, run in ((s.intact, "intact"), (s.off, f"with {off} off")):
            console.print(
                heatmap(r.weights[layer, 0, head], p.labels, f"head {layer}.{head}, {run}")
            )
        _say(key_legend(p.labels))
