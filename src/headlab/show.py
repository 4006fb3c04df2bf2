"""Views for notebooks and for one offline file: a head view, the all-heads grid and a shapes
report, each as self-contained HTML and JavaScript (no CDN, no server, no network).

In Jupyter or VS Code the value of a cell's last line draws itself::

    from headlab.show import show
    heads_view(model, probe, name="default")    # every head, each label above its chance floor
    show(report, grid=True)                     # report = headlab.heads.baselines.label_heads(…)
    show(trace_shapes(d_model=512, n_heads=8))  # the layer, drawn, with every shape
    circuit_view(induction_circuit(model, probe))  # previous-token → induction heads (SVG)
    retrieval_view(), sinks_view()              # the stored long-context runs (or a results dict)
    evidence_view(evidence(model, probe))        # each label and the sentence backing it
    show(series)                                # headlab.series.compare: heads × checkpoints

:func:`write_html` writes one page that works from ``file://`` (``headlab heads --html out.html``).
The drawing code is the explainer page's own (``server/static/js``), bundled here into one script
whose ES modules become functions; the data travels as JSON beside it, the weights as base64.
The modules import each other by relative URL (``"./x.js"``): a file:// page or a notebook cell
serves no such URL, and a module inlined as a data: or blob: URL cannot resolve one, import map or
not. So the bundler rewrites only each module's import lines and ``export`` keywords, and refuses
any other module form.
"""

from __future__ import annotations

import base64
import functools
import html
import inspect
import json
import os
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

STATIC = Path(__file__).parent / "server" / "static"
# Rewritten by regex: from file:// or a notebook, no data:/blob: module can import "./x.js".
IMPORT = re.compile(r'^import\s*\{([^}]*)\}\s*from\s*"\./([\w-]+)\.js";?[ \t]*$', re.M)
EXPORT = re.compile(
    r"^export\s+((?:async\s+)?function\*?|const|let|class)\s+([A-Za-z_$][\w$]*)", re.M
)


def _read(name: str) -> str:
    return (STATIC / "js" / f"{name}.js").read_text(encoding="utf-8")


def _module_order(entry: str) -> list[str]:
    """The modules ``entry`` needs, each after the modules it imports (depth first)."""
    order: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in order:
            return
        if name in path:
            raise ValueError(f"the page's scripts import each other in a circle: {(*path, name)}")
        for _, dep in IMPORT.findall(_read(name)):
            visit(dep, (*path, name))
        order.append(name)

    visit(entry, ())
    return order


def _as_function(name: str) -> str:
    """One ES module as a function of the modules before it: imports read ``__m``, the exported
    names are returned. Fails on a module form this small converter does not know."""

    def imported(match: re.Match[str]) -> str:
        names = [n.strip() for n in match.group(1).split(",") if n.strip()]
        pattern = ", ".join(n.replace(" as ", ": ") for n in names)
        return f'const {{ {pattern} }} = __m["{match.group(2)}"];'

    source = IMPORT.sub(imported, _read(name))
    exported = [m.group(2) for m in EXPORT.finditer(source)]
    source = EXPORT.sub(r"\1 \2", source)
    leftover = re.search(r"^\s*(import|export)\b.*$", source, re.M)
    if leftover:
        raise ValueError(f"{name}.js: cannot bundle {leftover.group(0).strip()!r}")
    return f'__m["{name}"] = (function () {{\n{source}\nreturn {{ {", ".join(exported)} }};\n}})();'


@functools.lru_cache(maxsize=1)
def bundle() -> str:
    """The standalone views' script: every module that ``standalone.js`` needs, as one script.

    Its last line leaves ``window.headlabStandalone.mount(id)`` to draw a view."""
    parts = [_as_function(name) for name in _module_order("standalone")]
    text = "\n".join(['"use strict";', "const __m = {};", *parts])
    text = f"(function () {{\n{text}\nwindow.headlabStandalone = __m.standalone;\n}})();"
    if re.search(r"</script|<!--", text, re.I):
        raise ValueError("the bundled script holds '</script' or '<!--' and cannot sit inline")
    return text


@functools.lru_cache(maxsize=1)
def style() -> str:
    """The figures' stylesheet (class selectors only), inlined into every view."""
    return (STATIC / "css" / "figures.css").read_text(encoding="utf-8")


def encode_weights(weights: Any) -> dict[str, Any]:
    """Weights in [0, 1] as little-endian uint16 (w · 65535) in base64, with their shape: a
    quarter of the JSON digits, exact to the 4 decimals the views print."""
    w = np.clip(np.asarray(weights, dtype=np.float64), 0.0, 1.0)
    q = np.rint(w * 65535).astype("<u2")
    return {"shape": list(q.shape), "b64": base64.b64encode(q.tobytes()).decode("ascii")}


def diagram_code() -> dict[str, dict[str, Any]]:
    """The source of the functions the layer diagram's steps point to, by the names it uses."""
    from headlab.attention import MultiHeadAttention, attention
    from headlab.model import Block

    functions: dict[str, Callable[..., Any]] = {
        "headlab.attention.MultiHeadAttention.forward": MultiHeadAttention.forward,
        "headlab.attention.attention": attention,
        "headlab.model.Block.forward": Block.forward,
    }
    root = Path(__file__).parent.parent
    out = {}
    for name, fn in functions.items():
        lines, first = inspect.getsourcelines(fn)
        path = Path(inspect.getsourcefile(fn) or "")
        shown = path.relative_to(root) if path.is_relative_to(root) else Path(path.name)
        out[name] = {"path": shown.as_posix(), "line": first, "source": "".join(lines)}
    return out


@dataclass(repr=False)
class View:
    """Parts to draw (head views, grids, shape reports); renders itself in a notebook.

    Its plain-text form (a terminal, a notebook's text/plain beside the HTML) is a few lines
    saying what it draws: the data it carries (every weight) is for the drawing alone.
    """

    parts: list[dict[str, Any]] = field(default_factory=list)

    def __add__(self, other: View) -> View:
        return View([*self.parts, *other.parts])

    def __repr__(self) -> str:
        lines = [f"headlab view of {len(self.parts)} part{'s' * (len(self.parts) != 1)}:"]
        lines += [f"  {_summary(part)}" for part in self.parts]
        lines.append(
            "  drawn in a notebook (Jupyter, VS Code); view.save('view.html') writes a "
            "page that opens in a browser"
        )
        return "\n".join(lines)

    def to_html(self) -> str:
        """A self-contained HTML fragment: stylesheet, data, script; unique ids per call."""
        uid = f"headlab-{uuid.uuid4().hex[:12]}"
        data = json.dumps({"parts": self.parts}, separators=(",", ":"))
        data = data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
        return (
            f'<div class="headlab-view" id="{uid}"><style>{style()}</style>'
            f'<script type="application/json" id="{uid}-data">{data}</script>'
            f"<script>{bundle()}\nwindow.headlabStandalone.mount({json.dumps(uid)});</script></div>"
        )

    def _repr_html_(self) -> str:
        return self.to_html()

    def page(self, title: str = "headlab") -> str:
        """A whole HTML document holding this view: it works from file:// with no network."""
        return (
            '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{html.escape(title)}</title>"
            f"<style>body {{ margin: 1rem; font-family: system-ui, sans-serif; }}</style>"
            "</head>\n<body><main>"
            f'<h1 class="hv-page-title">{html.escape(title)}</h1>\n{self.to_html()}\n'
            "</main></body></html>\n"
        )

    def save(self, path: str | os.PathLike[str], title: str = "headlab") -> Path:
        """Write :meth:`page` to ``path`` atomically (a temporary file, then a rename)."""
        return write_html(path, self.page(title))


def _summary(part: dict[str, Any]) -> str:
    """One line about one part of a view: its model, probe and labels counted, or its layer."""
    report = part["report"]
    if part["kind"] == "shapes":
        c = report["config"]
        return (
            f"shapes of one {c.get('kind', '')} layer: d_model {c['d_model']}, "
            f"{c['n_heads']} heads, batch {c['batch']}, {c['seq_len']} tokens"
        )
    labels: dict[str, int] = {}
    for head in report["heads"]:
        labels[head["label"]] = labels.get(head["label"], 0) + 1
    counted = ", ".join(f"{label} {n}" for label, n in sorted(labels.items(), key=lambda x: -x[1]))
    drawn = (
        "grid and head view"
        if part["grid"] and part["detail"]
        else ("grid" if part["grid"] else "head view")
    )
    gated = {
        True: " (each above its random-weights floor)",
        False: " (by thresholds alone, unchecked against chance)",
    }.get(report.get("labels_gated"), "")
    return (
        f"{drawn} of {report['model'] or 'a model'}, {report['probe']} probe, "
        f"{len(report['tokens'])} tokens, {report['n_layers']} layers × {report['n_heads']} "
        f"heads; labels{gated}: {counted}"
    )


def write_html(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` whole or not at all (:func:`headlab.files.write_atomic`);
    ValueError, before anything is written, for a missing folder or a target that is not a
    regular file (a device, a FIFO, a folder)."""
    from headlab.files import write_atomic

    return write_atomic(path, text)


def head_view(
    report: Any, model: str = "", grid: bool = False, detail: bool = True, config: Any = None
) -> View:
    """One head at a time (a heatmap beside its layer's mean, the two-column view), and with
    ``grid`` every head as a thumbnail with its label; ``detail=False`` leaves the grid alone.

    report: a :class:`headlab.heads.HeadReport` (:func:`headlab.heads.analyse`) or its
    ``to_dict(patterns=True)`` form: weights (L, h, n, n), averaged_weights (L, n, n).
    config: the model's config, whose local/global layers and K/V heads the grid marks
    (:func:`headlab.shapes.layout.attention_layout`; a dict from the server carries them).
    """
    from headlab.shapes.layout import attention_layout

    d = report.to_dict(patterns=True) if hasattr(report, "to_dict") else dict(report)
    if config is not None:
        d = {**d, **attention_layout(config)}
    weights = np.asarray(d["weights"])
    body = {
        "model": model or d.get("model", ""),
        "probe": d.get("probe", ""),
        "tokens": list(d["tokens"]),
        "n_layers": int(weights.shape[0]),
        "n_heads": int(weights.shape[1]),
        "n_kv_heads": int(d.get("n_kv_heads") or weights.shape[1]),
        "heads": d["heads"],
        "best": d.get("best", {}),
        "labels_gated": d.get("labels_gated"),
        "weights": encode_weights(weights),
        "averaged_weights": encode_weights(d["averaged_weights"]),
        **{k: d[k] for k in ("kv_group", "window", "layer_kinds") if k in d},
    }
    return View([{"kind": "heads", "grid": grid, "detail": detail, "report": body}])


def heads_view(
    model: Any, probe: Any, name: str = "", grid: bool = False, floors: bool = True
) -> View:
    """Every head of ``model`` on ``probe`` (:func:`headlab.measure.build_probe`), labelled by
    :func:`headlab.heads.baselines.label_heads`: each label above its random-weights floor, or
    with ``floors=False`` by thresholds alone (the view then says they are unchecked against
    chance); drawn as :func:`head_view` (``grid``: every head as a thumbnail too), with the
    model's local/global layers and K/V heads marked."""
    from headlab.heads.baselines import label_heads

    report = label_heads(model, probe, floors=floors)
    return head_view(report, name, grid=grid, config=model.config)


def head_grid(report: Any, model: str = "", config: Any = None) -> View:
    """Every head of the report as a thumbnail with its label (click one for its scores);
    with the model's ``config``, its local/global layers and K/V heads marked."""
    return head_view(report, model, grid=True, detail=False, config=config)


def shapes_view(report: Any) -> View:
    """The layer, drawn from a :class:`headlab.shapes.ShapeReport` (or its ``to_dict()``), step
    by step with its code, and the table of every tensor's shape."""
    d = report.to_dict() if hasattr(report, "to_dict") else dict(report)
    if not d.get("valid", False):
        raise ValueError(f"this configuration does not work: {'; '.join(d.get('problems', []))}")
    return View([{"kind": "shapes", "report": d, "code": diagram_code()}])


@dataclass
class FigureView(View):
    """A view drawn here, with no script: a table and a PNG figure (a series of checkpoints)."""

    body: str = ""

    def __add__(self, other: View) -> View:
        raise TypeError("a figure view is shown on its own; show each view in its own cell")

    def to_html(self) -> str:
        return f'<div class="headlab-view headlab-figure">{self.body}</div>'


def series_view(series: Any, kind: str = "induction") -> FigureView:
    """A :class:`headlab.series.Series`: each head's label and ``kind`` score at each
    checkpoint as a table (the heads whose label changes marked), above the heads ×
    checkpoints figure (:meth:`~headlab.series.Series.figure`), inline as base64 PNG."""
    values, labels, changed = series.scores(kind).flatten(1), series.labels(), series.changed()
    head = "".join(f"<th>{html.escape(n)}</th>" for n in series.names)
    rows = []
    for i, (layer, h) in enumerate(series.heads):
        cells = "".join(
            f"<td>{html.escape(labels[c][i])} {values[c, i]:.2f}</td>"
            for c in range(len(series.names))
        )
        mark = "changed" if (layer, h) in changed else ""
        rows.append(f"<tr><th>{layer}.{h}</th>{cells}<td>{mark}</td></tr>")
    png = base64.b64encode(series.png(kind)).decode("ascii")
    alt = f"{kind} score and label of every head at every checkpoint"
    body = (
        f"<table><caption>{html.escape(kind)} score and label, {html.escape(series.probe)} "
        f"probe</caption><tr><th>head</th>{head}<th></th></tr>{''.join(rows)}</table>"
        f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{png}">'
    )
    return FigureView(body=body)


def _experiment_view(name: str, results: dict[str, Any] | None, png: bytes) -> FigureView:
    """A run of ``headlab experiment NAME``: its verdict sentences, where it came from, and its
    figure inline as base64 PNG."""
    where = "quick run" if results and results.get("quick") else "run"
    said = "".join(f"<li>{html.escape(str(v))}</li>" for v in (results or {}).get("verdict", []))
    made = html.escape(f"{where} of headlab experiment {name}, {(results or {}).get('date', '')}")
    img = base64.b64encode(png).decode("ascii")
    alt = html.escape(f"the figures of headlab experiment {name}")
    figure = f'<img alt="{alt}" src="data:image/png;base64,{img}">'
    return FigureView(body=f"<p>{made.rstrip(', ')}</p><ul>{said}</ul>{figure}")


def _results(name: str, results: dict[str, Any] | None) -> dict[str, Any]:
    """``results``, or the run shipped with the package (the page's stored run)."""
    if results is not None:
        return results
    from headlab.experiments import results_path

    return dict(json.loads(results_path(name).read_text(encoding="utf-8")))


def retrieval_view(results: dict[str, Any] | None = None) -> FigureView:
    """Retrieval heads (``headlab experiment retrieval``; the shipped run when ``results`` is
    None): the verdicts, then the score histogram, accuracy with the top-k or k random heads
    masked (every draw), and the depth × length accuracy map."""
    from headlab.experiments import retrieval

    found = _results("retrieval", results)
    return _experiment_view("retrieval", found, retrieval.png(found))


def sinks_view(results: dict[str, Any] | None = None) -> FigureView:
    """Attention sinks in a streaming cache (``headlab experiment sinks``; the shipped run when
    ``results`` is None): the verdicts, then perplexity by window for the full cache, the window
    alone and sinks + window, and each layer's sink share."""
    from headlab.experiments import sinks

    found = _results("sinks", results)
    return _experiment_view("sinks", found, sinks.png(found))


def show(obj: Any, model: str = "", grid: bool = False) -> View:
    """The view of ``obj``: a HeadReport (or its dict) → :func:`head_view`; a ShapeReport (or
    its dict) → :func:`shapes_view`; a Series of checkpoints → :func:`series_view`. The
    returned :class:`View` renders in a notebook."""
    from headlab.heads import HeadReport
    from headlab.series import Series
    from headlab.shapes import ShapeReport

    if isinstance(obj, Series):
        return series_view(obj)
    is_dict = isinstance(obj, dict)
    if isinstance(obj, HeadReport) or (is_dict and {"weights", "heads"} <= obj.keys()):
        return head_view(obj, model, grid=grid)
    if isinstance(obj, ShapeReport) or (is_dict and {"config", "problems"} <= obj.keys()):
        return shapes_view(obj)
    raise TypeError(
        f"headlab.show draws a HeadReport (headlab.heads.analyse), a ShapeReport "
        f"(headlab.shapes.trace_shapes), or their to_dict() forms, or a Series "
        f"(headlab.series.compare); got {type(obj).__name__}"
    )


@dataclass
class Html:
    """A ready HTML fragment that renders itself in a notebook (views drawn without the page's
    scripts)."""

    html: str

    def _repr_html_(self) -> str:
        return self.html


def circuit_view(circuit: Any, model: str = "") -> Html:
    """The induction circuit (:func:`headlab.heads.circuit.induction_circuit`, or its
    ``to_dict()``) as an SVG graph: a column per layer, previous-token heads and induction heads
    as nodes, each candidate edge as a line as thick as its K-composition above the random
    floor, solid when drawn (above the floor and confirmed by ablation), dashed when not."""
    d = circuit.to_dict() if hasattr(circuit, "to_dict") else dict(circuit)
    nodes = [(tuple(p["head"]), "previous-token") for p in d["previous"]]
    nodes += [(tuple(p["head"]), "induction") for p in d["induction"]]
    layers = sorted({h[0] for h, _ in nodes}) or [0]
    column = {layer: i for i, layer in enumerate(layers)}
    rows: dict[int, int] = {}
    where = {}
    for head, _ in nodes:
        rows[head[0]] = rows.get(head[0], 0) + 1
        where[head] = (60 + 180 * column[head[0]], 40 + 44 * (rows[head[0]] - 1))
    width, height = 120 + 180 * (len(layers) - 1), 60 + 44 * max(rows.values(), default=1)
    top = max((e["k_composition"] for e in d["edges"]), default=1.0)
    parts = []
    for e in d["edges"]:
        (x1, y1), (x2, y2) = where[tuple(e["from"])], where[tuple(e["to"])]
        share = max(0.0, e["k_composition"] - d["k_floor"]) / max(top - d["k_floor"], 1e-9)
        dash = "" if e["drawn"] else ' stroke-dasharray="4 3"'
        parts.append(
            f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="#555" '
            f'stroke-width="{1 + 5 * share:.1f}"{dash}><title>{e["from"]} → {e["to"]}: '
            f"K {e['k_composition']:.3f}</title></line>"
        )
    for head, label in nodes:
        x, y = where[head]
        fill = "#4c78a8" if label == "previous-token" else "#e45756"
        parts.append(
            f'<circle cx="{x}" cy="{y}" r="13" fill="{fill}"><title>{label}</title>'
            f'</circle><text x="{x}" y="{y + 4}" text-anchor="middle" fill="white" '
            f'font-size="11">{head[0]}.{head[1]}</text>'
        )
    caption = html.escape(
        f"{model + ': ' if model else ''}previous-token (blue) → induction "
        f"(red); K-composition floor {d['k_floor']:.3f}; solid: confirmed "
        f"by {d['ablation']} ablation"
    )
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'role="img" aria-label="{caption}">{"".join(parts)}</svg>'
    )
    return Html(f'<figure class="headlab-circuit">{svg}<figcaption>{caption}</figcaption></figure>')


def evidence_view(evidence: Any) -> Html:
    """Every head's label and the sentence that backs it (:func:`headlab.heads.evidence.
    evidence`, or its ``to_dict()``), as a table."""
    d = evidence.to_dict() if hasattr(evidence, "to_dict") else dict(evidence)
    rows = "".join(
        f"<tr><td>{h['layer']}.{h['head']}</td><td>{html.escape(h['label'])}</td>"
        f"<td>{html.escape(h['evidence'])}</td></tr>"
        for h in d["heads"]
    )
    return Html(
        '<table class="headlab-evidence"><thead><tr><th>head</th><th>label</th>'
        f"<th>what backs it</th></tr></thead><tbody>{rows}</tbody></table>"
    )
