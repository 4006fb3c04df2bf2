"""``headlab heads``: what each attention head does, on one probe, or averaged over many prompts
(shared among torchrun ranks by :func:`headlab.scaling.heads_over_prompts`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from headlab.cli.circuit import (
    AblationOption,
    check_ablation,
    check_exact,
    parse_exact,
    print_evidence,
    run_evidence,
)
from headlab.cli.common import (
    ModelName,
    console,
    ensure_fetched,
    err_console,
    fail,
    progress_bar,
    seed_option,
)
from headlab.cli.switch import OFF_HELP, check_off, switch_heads

Prompts = Annotated[
    str | None,
    typer.Option(
        "--prompts",
        help=(
            "Average every head's scores over many prompts: a file with one text per line, or "
            'JSONL with a "text" field. Under torchrun the prompts are shared out among the ranks. '
            "Labels are gated by the floors of the same means with random weights: 3 more passes "
            "over the prompts (--no-floors: one)."
        ),
    ),
]
DeviceMap = Annotated[
    str | None,
    typer.Option(
        "--device-map",
        help=("Spread a model larger than memory with accelerate: auto, balanced, sequential."),
    ),
]
MaxMemory = Annotated[
    str | None,
    typer.Option(
        "--max-memory",
        help=("Memory per device, e.g. cpu=8GiB,0=20GiB; gpu=SIZE for every GPU (implies auto)."),
    ),
]
DistTimeout = Annotated[
    float,
    typer.Option(
        "--dist-timeout",
        min=1.0,
        max=86_400.0,
        help=("Under torchrun: seconds the ranks wait to reach each other."),
    ),
]
TEXT_FILE_HELP = (
    "A UTF-8 text file as the probe, at most 100,000 characters (long inputs; a bar per layer)."
)
PROBE_HELP = (
    "Built-in probe, in place of a text: repeat (a sentence with a repeat; the default), "
    "random-repeat, or needle (a number hidden in a long text, asked for at the end: scores "
    "retrieval heads, Wu et al. 2024)."
)
SHOW_HELP = (
    "Draw head L.H's pattern, e.g. --show 0.2 (layers and heads count from 0); L.avg draws "
    "layer L's averaged head."
)
EVIDENCE_HELP = (
    "Back every label: scores beside random-weight and shuffled baselines (a label needs its "
    "margin), each head ablated alone, composition scores, and a sentence per head."
)
EXACT_HELP = (
    "With --evidence: 'all' ablates every head exactly; LAYER.HEAD,... ablates those exactly "
    "beside the first-order estimate of every head (default: exact where that is as cheap)."
)
SEED_HELP = (
    "Seed of the random probes: random-repeat's tokens, the needle's numbers and haystack (a "
    "text or --prompts takes none):"
)
FLOORS_HELP = (
    "--floors (the default): a label needs its score at or above its threshold and its "
    "layer's random-weights floor (the same architecture with random weights, mean + 3 sd); "
    "--no-floors: thresholds alone, labels unchecked against chance (faster the first time)."
)
HtmlOut = Annotated[
    str | None,
    typer.Option(
        "--html",
        help=(
            "Also write the interactive head view and grid to one HTML file (opens from "
            "file://, no server, no network)."
        ),
    ),
]


def heads(
    model: ModelName = "default",
    text: str | None = typer.Option(None, help="Your own text as the probe."),
    text_file: str | None = typer.Option(None, "--text-file", help=TEXT_FILE_HELP),
    prompts: Prompts = None,
    out: str | None = typer.Option(
        None, "--out", help="With --prompts: write the table to a .json or .csv file."
    ),
    probe: str | None = typer.Option(None, help=PROBE_HELP),
    show: str | None = typer.Option(None, help=SHOW_HELP),
    seed: int = seed_option(SEED_HELP),
    content: bool = typer.Option(
        True, "--content/--no-content", help="Score content heads (from the same forward)."
    ),
    device: str = typer.Option("cpu", help="Where the model runs: cpu, cuda or mps."),
    dtype: str = typer.Option("float32", help="Weights as float32, bfloat16 or float16."),
    device_map: DeviceMap = None,
    max_memory: MaxMemory = None,
    offload_folder: str | None = typer.Option(
        None, "--offload-folder", help="Where the layers that do not fit in --max-memory go."
    ),
    dist_timeout: DistTimeout = 60.0,
    syntax: bool = typer.Option(
        False,
        "--syntax",
        help="Also score syntactic heads on the evaluation text (spaCy): a syn column beside "
        "the others; the labels stay those without it.",
    ),
    syntax_labels: bool = typer.Option(
        False,
        "--syntax-labels",
        help="Score syntactic heads and label with that score too (implies --syntax; other "
        "heads' labels can change).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the scores as JSON."),
    html_out: HtmlOut = None,
    floors: bool = typer.Option(True, "--floors/--no-floors", help=FLOORS_HELP),
    evidence: bool = typer.Option(False, "--evidence", help=EVIDENCE_HELP),
    ablation: AblationOption = "mean",
    exact: str | None = typer.Option(None, "--exact", help=EXACT_HELP),
    off: str | None = typer.Option(None, "--off", help=OFF_HELP),
) -> None:
    """Score every attention head of a model on a probe and label it (see docs/heads.md), or
    average the scores over many prompts (--prompts; shared among torchrun ranks)."""
    syntax = syntax or syntax_labels
    _check_heads_options(text, text_file, prompts, out, html_out, dist_timeout, syntax)
    if off is not None:
        check_off(off, probe, show, prompts, evidence, html_out, syntax)
        _check_probe(probe, text, text_file, prompts)
        _check_outputs(None, offload_folder)
        load = _load_options(device, dtype, device_map, max_memory, offload_folder)
        text = _read_text_file(text_file) if text_file is not None else text
        target = _parse_head(show) if show is not None else None
        mode = check_ablation(ablation)
        switch_heads(model, text, probe or "repeat", seed, load, off, mode, target, as_json)
        return
    mode, picked = _check_evidence(evidence, ablation, exact, prompts, floors)
    _check_probe(probe, text, text_file, prompts)
    _check_outputs(html_out, offload_folder)
    load = _load_options(device, dtype, device_map, max_memory, offload_folder)
    if prompts is not None:
        where = Path(out) if out is not None else None
        _heads_over_prompts(
            model, Path(prompts), where, content, load, dist_timeout, as_json, floors
        )
    else:
        text = _read_text_file(text_file) if text_file is not None else text
        html = Path(html_out) if html_out is not None else None
        rule = "labels" if syntax_labels else "scores" if syntax else ""
        _heads_on_probe(
            model,
            text,
            probe or "repeat",
            show,
            seed,
            content,
            load,
            as_json,
            rule,
            html,
            mode,
            picked,
            floors,
        )


def _check_evidence(
    evidence: bool, ablation: str, exact: str | None, prompts: str | None, floors: bool
) -> Any:
    """--evidence's ablation mode (None without it) and --exact's heads, or exit 2 saying why."""
    if evidence and not floors:
        raise fail(
            "--evidence checks every label against its random-weights floor; leave out --no-floors"
        )
    if evidence and prompts is not None:
        raise fail("--evidence backs the labels of one probe; leave it out with --prompts")
    if exact is not None and not evidence:
        raise fail("--exact picks heads to ablate exactly for --evidence; add --evidence")
    return (check_ablation(ablation) if evidence else None), parse_exact(exact)


def _check_heads_options(
    text: str | None,
    text_file: str | None,
    prompts: str | None,
    out: str | None,
    html_out: str | None,
    dist_timeout: float,
    syntax: bool,
) -> None:
    """Exit 2 with one sentence for options that do not go together."""
    if sum(x is not None for x in (text, text_file, prompts)) > 1:
        raise fail("give one of --text, --text-file and --prompts")
    if html_out is not None and prompts is not None:
        raise fail("--html draws one probe's patterns; --prompts averages scores only")
    if not 1 <= dist_timeout <= 86_400:  # NaN passes click's range check, not this one
        raise fail(f"--dist-timeout must be 1 to 86400 seconds, got {dist_timeout}")
    if out is not None and prompts is None:
        raise fail("--out writes the table of --prompts; for one probe use --json")
    if syntax and prompts is not None:
        raise fail("--syntax scores the heads of one probe; leave it out with --prompts")


def _check_probe(
    probe: str | None, text: str | None, text_file: str | None, prompts: str | None
) -> None:
    """A built-in probe takes no text (as :func:`headlab.measure.build_probe` and the API
    say): --probe with --text, --text-file or --prompts would be quietly ignored."""
    given = "--text" if text is not None else "--text-file" if text_file is not None else None
    given = given or ("--prompts" if prompts is not None else None)
    if probe is not None and probe != "text" and given is not None:
        raise fail(
            f"probe {probe!r} takes no text; leave out --probe to score {given}, or "
            f"leave out {given} to run the {probe} probe"
        )
    from headlab.measure import PROBES

    if probe is not None and probe not in (*PROBES, "needle"):
        raise fail(f"unknown probe {probe!r}; valid probes: {', '.join((*PROBES, 'needle'))}")


def _check_outputs(html_out: str | None, offload_folder: str | None) -> None:
    """Every place ``heads`` writes, tried before any work: the --html file
    (:func:`headlab.files.check_writable`) and the --offload-folder (a folder we can write in)."""
    from headlab.cli.support import out_dir_problem
    from headlab.files import check_writable

    problem = None if html_out is None else check_writable(html_out, try_it=True)
    if problem is not None:
        raise fail(f"--html {problem}")
    if offload_folder is not None:
        problem = out_dir_problem(offload_folder, "--offload-folder")
        if problem is not None:
            raise fail(problem)


def _read_text_file(text_file: str) -> str:
    """--text-file's text, read before any work: a regular UTF-8 file of at most
    :data:`headlab.scaling.MAX_PROMPT_CHARS` characters (exit 2 with the reason)."""
    from headlab.scaling import read_text

    try:
        return read_text(text_file)
    except ValueError as exc:
        raise fail(str(exc)) from None


DTYPES = ("float32", "bfloat16", "float16")


def _load_options(
    device: str, dtype: str, device_map: str | None, max_memory: str | None, offload: str | None
) -> dict:
    """zoo.load's keywords from the CLI's (exit 2 with a sentence for a bad one)."""
    import torch

    from headlab.devices import check_device

    if dtype not in DTYPES:
        raise fail(f"--dtype {dtype!r}: valid dtypes are {', '.join(DTYPES)}")
    try:
        dev = check_device(device)
    except ValueError as exc:
        raise fail(str(exc)) from None
    kinds = {"dtype": getattr(torch, dtype)}
    if device_map is None and max_memory is None and offload is None:
        return {**kinds, "device": dev}
    budget = _parse_max_memory(max_memory) if max_memory is not None else None
    return {
        **kinds,
        "device_map": device_map or "auto",
        "max_memory": budget,
        "offload_folder": offload,
    }


def _parse_max_memory(spec: str) -> dict:
    """'cpu=8GiB,0=20GiB' → {"cpu": "8GiB", 0: "20GiB"}; "gpu=SIZE" sets every GPU here."""
    import torch

    try:
        pairs = [item.split("=", 1) for item in spec.split(",") if item.strip()]
        budget = {(int(k) if k.strip().isdigit() else k.strip()): v.strip() for k, v in pairs}
    except ValueError:
        raise fail(
            f"--max-memory takes DEVICE=SIZE pairs, e.g. cpu=8GiB,0=20GiB; got {spec!r}"
        ) from None
    if "gpu" in budget:
        size = budget.pop("gpu")
        if not torch.cuda.is_available():
            raise fail("--max-memory gpu=…: there is no GPU here; give cpu=SIZE")
        budget.update({i: size for i in range(torch.cuda.device_count()) if i not in budget})
    return budget


def _heads_on_probe(
    model: str,
    text: str | None,
    probe: str,
    show: str | None,
    seed: int,
    content: bool,
    load: dict,
    as_json: bool,
    syntax: str = "",
    html: Path | None = None,
    evidence: str | None = None,
    exact: Any = None,
    floors: bool = True,
) -> None:
    """One probe: the table (or JSON) of every head, and the pattern of --show's head; with
    ``syntax`` "scores" the syntactic scores from the evaluation text too (headlab.heads.syntax),
    shown beside the others, "labels" also labelling with them; with ``html`` the interactive
    view of every head in one offline file, and with ``evidence`` (an ablation mode) each
    label's evidence (headlab.heads.evidence); ``floors`` False labels by thresholds alone."""
    from headlab import zoo
    from headlab.shapes.layout import attention_layout

    target = _parse_head(show) if show is not None else None
    ensure_fetched(model)
    try:
        m, tokenizer = zoo.load(model, **load)
        L, h = m.config.n_layers, m.config.n_heads
        if target is not None and not (0 <= target[0] < L and -1 <= target[1] < h):
            raise fail(
                f"--show {show}: this model has layers 0..{L - 1} and heads 0..{h - 1}; "
                "L.avg draws layer L's averaged head"
            )
        p, retrieval, needles = _probe(m, tokenizer, text, probe, seed)
        if needles and evidence is not None:
            raise fail(
                "--evidence backs the pattern probes' labels; the needle probe's are "
                "tested by masking: `headlab experiment retrieval`"
            )
        # the patterns of the other heads go, unless the HTML file draws them all
        keep = None if html is not None else {target} if target is not None else ()
        margins = _syntax_margins(m, tokenizer, model) if syntax else None
        ruled = syntax == "labels"
        if evidence is not None:
            check_exact(exact, L, h)
            backed = run_evidence(m, p, evidence, content, keep, margins, ruled, exact)
            report = backed.report
        else:
            report = _analyse(m, p, content, keep, margins, ruled, floors, retrieval)
    except ValueError as exc:
        raise fail(_problem(exc, evidence)) from None
    out = err_console if as_json else console  # keep stdout pure JSON
    extra = {} if evidence is None else {"evidence": backed.to_dict()}
    extra |= {"needles": needles} if needles else {}
    _print_probe_report(report, model, as_json, {**attention_layout(m.config), **extra})
    if evidence is not None and not as_json:
        print_evidence(extra["evidence"])
    if target is not None:
        _draw_head(report, target, out)
    if html is not None:
        _write_head_page(report, model, html, out, m.config)


def _problem(exc: ValueError, evidence: str | None) -> str:
    """What ``heads`` says for a ValueError: its message, except where the floors' random copy
    does not fit and --evidence, which cannot go without the floors, was asked for."""
    from headlab.heads.baselines import FloorsDoNotFit

    if isinstance(exc, FloorsDoNotFit) and evidence is not None:
        return (
            f"{exc.sizes()}: --evidence needs them; leave it out and add --no-floors to "
            "label without them"
        )
    return str(exc)


def _probe(m: Any, tokenizer: Any, text: str | None, probe: str, seed: int) -> Any:
    """The probe of ``headlab heads``: the text (of --text or --text-file) or the built-in
    --probe; with the needle probe also each head's retrieval score and each needle's answer
    (:func:`headlab.heads.retrieval.needle_analysis`), else None and []."""
    from headlab.measure import build_probe

    if text is None and probe == "needle":
        from headlab.heads.retrieval import needle_analysis

        return needle_analysis(m, tokenizer, seed)
    name = "text" if text is not None else probe
    return build_probe(name, tokenizer, m.config.max_len, m.config.vocab_size, text, seed), None, []


def _analyse(
    m: Any,
    p: Any,
    content: bool,
    keep: Any,
    margins: Any,
    label_syntax: bool,
    floors: bool = True,
    retrieval: Any = None,
) -> Any:
    """:func:`headlab.heads.baselines.label_heads` with a progress bar, a step per layer (of
    the random models too, the first time their floors are computed)."""
    from headlab.heads.baselines import label_heads

    what = f"{p.n} tokens, layer" + (" (3 random models' first, for the floors)" if floors else "")
    with progress_bar() as bar:
        bar(0, m.config.n_layers, what)
        return label_heads(
            m,
            p,
            content=content,
            keep=keep,
            syntactic=margins,
            label_syntactic=label_syntax,
            floors=floors,
            retrieval=retrieval,
            progress=lambda done, total: bar(done, total, what),
        )


def _print_probe_report(report: Any, model: str, as_json: bool, extra: dict | None = None) -> None:
    """Every head's scores as JSON on stdout (with ``extra`` fields), or as a table with the
    attention-sink lines."""
    import json

    from headlab.heads.render import heads_legend, heads_table, sink_lines
    from headlab.shapes.layout import layout_lines

    if as_json:
        body = {"model": model, **report.to_dict(), **(extra or {})}
        typer.echo(json.dumps(body, ensure_ascii=False))
        return
    title = f"{model}: {report.probe} probe, {len(report.tokens)} tokens"
    console.print(heads_table(report, title))
    console.print(heads_legend(report), highlight=False, soft_wrap=True)
    for line in sink_lines(report):
        console.print(line, highlight=False)
    if extra and "layer_kinds" in extra:  # the model's layout: K/V sharing, local/global layers
        for line in layout_lines(extra):
            console.print(line, highlight=False, soft_wrap=True)
    if extra and "needles" in extra:
        right, total = sum(n["correct"] for n in extra["needles"]), len(extra["needles"])
        line = f"needle: the model repeated the number in {right} of {total} probes (depths 0-1)"
        console.print(line, highlight=False)


def _draw_head(report: Any, target: tuple[int, int], out: Console) -> None:
    """The pattern of head ``target`` (layer, head; head −1: the layer's mean) as a heatmap."""
    from headlab.heads.render import heatmap, key_legend

    layer, head = target
    label = report.averaged[layer].label if head < 0 else report.head(layer, head).label
    title = f"layer {layer} head {'avg' if head < 0 else head}: {label}"
    out.print(heatmap(report.pattern(layer, head), report.tokens, title))
    out.print(key_legend(report.tokens), highlight=False)


def _write_head_page(report: Any, model: str, path: Path, out: Console, config: Any) -> None:
    """The head view and grid of ``report`` as one self-contained HTML file (headlab.show), its
    layers marked local or global and its heads grouped by K/V head as ``config`` has them."""
    from headlab.show import head_view

    title = f"headlab: {model}, {report.probe} probe, {len(report.tokens)} tokens"
    try:
        written = head_view(report, model, grid=True, config=config).save(path, title)
    except (ValueError, OSError) as exc:
        raise fail(f"--html {path}: {exc}") from None
    size = written.stat().st_size / 1024
    out.print(f"wrote {written} ({size:.0f} KiB): open it in a browser; it needs no server")


def _heads_over_prompts(
    model: str,
    prompts: Path,
    out: Path | None,
    content: bool,
    load: dict,
    timeout: float,
    as_json: bool,
    floors: bool = True,
) -> None:
    """Every head's scores averaged over a prompts file (headlab.scaling.heads_over_prompts),
    labels gated by the random-weights floors unless ``floors`` is False; rank 0 prints and
    writes the table, the other ranks only compute."""
    from headlab import head_table, scaling

    try:
        out = head_table.check_out_path(out) if out is not None else None
        with progress_bar() as bar:

            def advance(done: int, total: int, ranks: scaling.Ranks) -> None:
                if ranks.rank == 0:
                    what = " (then 3 random models' for the floors)" if floors else ""
                    bar(
                        done,
                        total,
                        (f"prompts (rank 0 of {ranks.world})" if ranks.world > 1 else "prompts")
                        + what,
                    )

            table, ranks = scaling.heads_over_prompts(
                model,
                prompts,
                content=content,
                load=load,
                timeout_s=timeout,
                progress=advance,
                floors=floors,
            )
    except ValueError as exc:
        raise fail(str(exc)) from None
    if ranks.rank == 0:
        info = {"model": model, "prompts_file": str(prompts), "content": content}
        _write_prompts_table(table, info, out, as_json)


def _write_prompts_table(table: Any, info: dict, out: Path | None, as_json: bool) -> None:
    """The averaged table to --out (atomically), as JSON on stdout, or as a terminal table."""
    import json

    from headlab import head_table
    from headlab.files import write_atomic
    from headlab.heads.render import heads_legend, heads_table

    if out is not None:
        write_atomic(out, head_table.table_text(table, out, info))
        err_console.print(f"{table.prompts} prompts, {table.tokens} tokens: table in {out}")
    if as_json:
        typer.echo(json.dumps({**info, **table.to_dict()}, ensure_ascii=False))
    elif out is None:
        title = f"{info['model']}: mean over {table.prompts} prompts ({table.tokens} tokens)"
        console.print(heads_table(table, title))
        console.print(heads_legend(table), highlight=False, soft_wrap=True)


def _syntax_margins(model: object, tokenizer: object, name: str) -> dict:
    """Each head's margin over the offset baseline on the evaluation text (headlab.heads.syntax)."""
    from headlab.heads.syntax import syntax_report

    return syntax_report(model, tokenizer, name=name).margins()


def _parse_head(spec: str) -> tuple[int, int]:
    """'L.H' → (L, H); 'L.avg' → (L, -1), the layer's averaged head. A negative number is no
    head: it comes back below −1 (or as layer −1), out of every model's range."""
    try:
        layer, head = spec.split(".")
        number = int(head) if head != "avg" else -1
        return int(layer), number - 1 if number < 0 and head != "avg" else number
    except ValueError:
        raise fail(f"--show takes LAYER.HEAD or LAYER.avg, e.g. 0.2; got {spec!r}") from None
