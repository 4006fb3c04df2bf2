"""The documentation's tables, each drawn from one results file's JSON (scripts/docs/figures.py
finds the file and the table a marker names):

    EXPERIMENT_TABLES   "NAME#TABLE" → a table of src/headlab/experiments/results/NAME.json
    DATA_TABLES         TABLE → a table of any docs/data/*.json command answer (heads, syntax)
    BENCH_TABLES        "table" → a benchmark's own table (benchmarks/results/NAME.json)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# --- formatting ------------------------------------------------------------------------------


def table(columns: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def pm(spread: dict[str, float], fmt: str = ".3f") -> str:
    """``mean ± sd`` of a ``{"mean", "std", ...}`` spread."""
    return f"{spread['mean']:{fmt}} ± {spread['std']:{fmt}}"


def pct(x: float) -> str:
    return f"{100 * x:.0f}%"


# --- the experiments' tables -----------------------------------------------------------------


def induction_seeds(d: dict[str, Any]) -> str:
    seeds = d["seeds"]

    def row(name: str, cell: Callable[[dict[str, Any]], str]) -> list[str]:
        return [name] + [cell(s) for s in seeds]

    def feeders(s: dict[str, Any]) -> str:
        named = zip(s["feeder_heads"], s["feeder_prev_token_scores"], strict=True)
        return ", ".join(f"{h} ({p:.2f})" for h, p in named)

    rows = [
        row(
            "phase change: steepest fall of the in-context gain, step (window)",
            lambda s: f"{s['phase_change_step']} ({s['window'][0]}–{s['window'][1]})",
        ),
        row("training seconds to the window's end", lambda s: f"{s['phase_change_seconds']:.1f}"),
        row("induction heads (score ≥ 0.5)", lambda s: ", ".join(s["induction_heads"])),
        row("best induction score at the end", lambda s: f"{s['final_induction_score']:.2f}"),
        row("layer-0 previous-token heads", lambda s: ", ".join(s["prev_token_heads"]) or "—"),
        row("feeders (their previous-token score)", feeders),
        row("gain removed by ablating the feeders", lambda s: pct(s["ablate_feeders_effect"])),
        row(
            "gain removed by ablating the other layer-0 heads",
            lambda s: pct(s["ablate_others_effect"]),
        ),
        row(
            "1-layer control: best induction score",
            lambda s: f"{s['control_max_induction_score']:.2f}",
        ),
    ]
    return table([""] + [f"seed {s['seed']}" for s in seeds], rows)


def one_vs_many_accuracy(d: dict[str, Any]) -> str:
    kinds = ("heads", "one", "wide")
    c = d["config"]
    by = {(s["model"], s["depth"]): s for s in d["summary"]}
    names = {
        "heads": f"{c['n_heads']} heads (d_k {c['d_model'] // c['n_heads']})",
        "one": f"1 head (d_k {c['d_model']})",
        "wide": f"1 head (d_k {c['d_model'] * c['wide_factor']})",
    }
    conditions = ("plain", "attractor", "phrase", "clause", "preposed")
    rows = [
        [f"{depth}, {cond}"] + [pm(by[(k, depth)][cond]) for k in kinds]
        for depth in c["depths"]
        for cond in conditions
    ]
    params = ["parameters (1 / 2 layers)"] + [
        " / ".join(f"{by[(k, depth)]['params']:,}" for depth in c["depths"]) for k in kinds
    ]
    return table(["layers, sentences"] + [names[k] for k in kinds], [*rows, params])


def head_count_loss(d: dict[str, Any]) -> str:
    s = d["summary"]
    rows = [
        ["held-out loss"] + [pm(r["val_loss"]) for r in s],
        ["verb accuracy"] + [f"{r['verb_accuracy']['mean']:.2f}" for r in s],
        ["accuracy with an attractor"] + [f"{r['attractor_accuracy']['mean']:.2f}" for r in s],
        ["parameters"] + [f"{r['params']:,}" for r in s],
    ]
    return table(["h (d_k)"] + [f"{r['h']} ({r['d_k']})" for r in s], rows)


def head_count_reference(d: dict[str, Any]) -> str:
    ref = d["reference"]
    return table(ref["columns"], ref["rows"]) + f"\n\n*{ref['paper']}.*"


def prune_summary(d: dict[str, Any]) -> str:
    def two(s: dict[str, Any], key: str, f: Callable[[float], str] = pct) -> str:
        return f"{f(s[key + '_importance']['mean'])} / {f(s[key + '_random_mean']['mean'])}"

    def times(x: float) -> str:
        return f"×{x:.2f}"

    rows = [
        [
            s["model"],
            s["heads"],
            two(s, "prunable_1%"),
            two(s, "prunable_5%"),
            two(s, "half_pruned_rel", times),
        ]
        for s in d["summary"]
    ]
    columns = ["model", "heads", "prunable within 1% loss", "within 5%", "loss with half gone"]
    return table(columns, rows) + "\n\nEach cell: in importance order / in random order."


def prune_survivors(d: dict[str, Any]) -> str:
    rows = []
    for m in d["models"]:
        if m["model"] == "trained-here":
            continue
        named = [f"{s['head']} ({s['label']})" for s in m["survivors"]]
        more = f", … ({len(named) - 12} more)" if len(named) > 12 else ""
        rows.append([m["model"], len(named), ", ".join(named[:12]) + more])
    return table(["model", "last heads standing", "heads (label), the last first"], rows)


def gqa_decode(d: dict[str, Any]) -> str:
    contexts = d["config"]["contexts"]
    kvs = sorted({r["n_kv_heads"] for r in d["decode"]}, reverse=True)[1:]
    at = {(r["context"], r["n_kv_heads"]): r["ratio_vs_mha"] for r in d["decode"]}
    rows = [
        [f"h_kv {k}" + (" (MQA)" if k == 1 else "")] + [f"×{at[(c, k)]:.2f}" for c in contexts]
        for k in kvs
    ]
    return table(["context"] + [str(c) for c in contexts], rows)


def gqa_kv_cache(d: dict[str, Any]) -> str:
    rows = [
        [
            r["n_kv_heads"],
            r["s"],
            f"{r['measured']:,}",
            f"{r['calculator']:,}",
            f"{r['formula']:,}",
            f"÷{r['shrink_vs_mha']:.0f}",
        ]
        for r in d["kv_cache"]
    ]
    return table(["h_kv", "s", "held by the caches", "shape calculator", "formula", "vs MHA"], rows)


def gqa_quality(d: dict[str, Any]) -> str:
    q = d["quality"]
    rows = [
        [r["n_kv_heads"], pm(r["converted"]), pm(r["uptrained"]), pm(r["scratch"])]
        for r in q["by_kv"]
    ]
    rows.append([f"{d['config']['n_heads']} (MHA)", "", "", pm(q["mha"])])
    return table(["h_kv", "right after pooling", "after 5% uptraining", "from scratch"], rows)


def gqa_smollm2(d: dict[str, Any]) -> str:
    lm = d.get("smollm2")
    if not lm:
        return "*SmolLM2 was not fetched when this run was made.*"
    speed = {r["context"]: r for r in lm["decode"] if "ratio_vs_9" in r}
    cache_ = {(r["context"], r["n_kv_heads"]): r["measured"] for r in lm["kv_cache"]}
    rows = [
        [
            c,
            f"×{speed[c]['ratio_vs_9']:.2f}",
            f"{speed[c]['tokens_per_s']:.2f}",
            f"{cache_[(c, 3)] / 2**20:,.0f} MiB",
            f"{cache_[(c, 9)] / 2**20:,.0f} MiB",
        ]
        for c in lm["config"]["contexts"]
    ]
    columns = ["context", "tokens/s, 3 K/V heads ÷ 9", "tokens/s (3)", "cache (3)", "cache (9)"]
    return table(columns, rows)


def gqa_reference(d: dict[str, Any]) -> str:
    ref = d["reference"]
    rows = [[name, *values] for name, values in ref["t5_xxl"].items()]
    return table(["T5-XXL", *ref["t5_xxl_columns"]], rows) + f"\n\n*{ref['paper']}.*"


def verdicts(d: dict[str, Any]) -> str:
    """The experiment's own verdict lines, as its run wrote them."""
    v = d["verdict"]
    lines = [v["text"]] if isinstance(v, dict) else v
    return "\n".join(f"- {line}" for line in lines)


# --- head tables: the ``--json`` answers of headlab heads and headlab syntax (docs/data) ----------

SHORT = {
    "previous-token": "**prev**",
    "next-token": "**next**",
    "duplicate-token": "**dup**",
    "current-token": "self",
    "delimiter": "**delim**",
    "induction": "**ind**",
    "positional": "**pos**",
    "rare-word": "**rare**",
    "syntactic": "**syn**",
    "mixed": "·",
}


def heads_grid(out: dict[str, Any]) -> str:
    """Every head's label, a row per layer, and the layer's averaged head."""
    layers = 1 + max(h["layer"] for h in out["heads"])
    per_layer = len(out["heads"]) // layers
    label = {(h["layer"], h["head"]): SHORT.get(h["label"], h["label"]) for h in out["heads"]}
    avg = {a["layer"]: SHORT.get(a["label"], a["label"]) for a in out["averaged"]}
    rows = [[f"{l}"] + [label[(l, h)] for h in range(per_layer)] + [avg[l]] for l in range(layers)]
    note = "`·` mixed (no score passes its threshold); bold: a head type with a named rule."
    return table(["layer"] + [str(h) for h in range(per_layer)] + ["avg"], rows) + f"\n\n{note}"


SCORE_COLUMNS = {
    "previous": "prev",
    "self": "self",
    "positional": "pos",
    "duplicate": "dup",
    "induction": "ind",
    "induction_active": "act",  # the induction share of the attention off the first token
    "content": "cont",
    "first_token": "sink",
    "delimiter": "delim",
    "diffuse": "diff",
}


def heads_scores(out: dict[str, Any]) -> str:
    """Every head and averaged head with its label, main scores, offset δ and rest."""

    def row(h: dict[str, Any], name: str) -> list[str]:
        scores = [f"{h['scores'][k]:.2f}" for k in SCORE_COLUMNS]
        rest = "" if h.get("rest") is None else f"{h['rest']:.2f}"
        return [name, h["label"], *scores, f"{h['offset']:+d}", rest]

    rows = [row(h, f"{h['layer']}.{h['head']}") for h in out["heads"]]
    rows += [row(a, f"{a['layer']} avg") for a in out["averaged"]]
    return table(["head", "label", *SCORE_COLUMNS.values(), "δ", "rest"], rows)


def heads_best(out: dict[str, Any]) -> str:
    """The best head of each type the page offers, and whether it carries that label."""
    rows = [
        [
            kind,
            f"{b['layer']}.{b['head']}",
            f"{b['score']:.2f}",
            b["label"],
            "yes" if b["labelled"] else "no",
        ]
        for kind, b in out["best"].items()
    ]
    return table(["type", "best head", "score", "its label", "labelled that type"], rows)


def heads_counts(out: dict[str, Any]) -> str:
    """How many heads carry each label, and which (up to 12 named)."""
    by: dict[str, list[str]] = {}
    for h in out["heads"]:
        by.setdefault(h["label"], []).append(f"{h['layer']}.{h['head']}")
    rows = [
        [label, len(names), ", ".join(names) if len(names) <= 12 else "…"]
        for label, names in sorted(by.items(), key=lambda kv: -len(kv[1]))
    ]
    return table(["label", "heads", "which"], rows)


def heads_sinks(out: dict[str, Any]) -> str:
    """Each layer's share of sink heads, ten layers to a row."""
    s = out["sinks"]
    shares = [f"{x['share']:.0%}" for x in s["layers"]]
    rows = [
        [f"{i}–{min(i + 9, len(shares) - 1)}", *shares[i : i + 10]]
        for i in range(0, len(shares), 10)
    ]
    width = min(10, len(shares))
    note = (
        f"Share of each layer's heads with more than {s['threshold']} of their attention on the"
        " first token (Gu et al. 2024's sink measure)."
    )
    rows = [r + [""] * (width + 1 - len(r)) for r in rows]
    return table(["layers", *(f"+{i}" for i in range(width))], rows) + f"\n\n{note}"


# Clark et al. 2019, Table 1 (BERT-base, layer-head 1-based, and its fixed-offset baseline).
CLARK_2019 = {
    "dobj": ("8-10", 86.8, 40.0),
    "det": ("8-11", 94.3, 51.7),
    "pobj": ("9-6", 76.3, 34.6),
    "poss": ("7-6", 80.5, 47.7),
    "auxpass": ("4-10", 94.1, 82.5),
}


def syntax_relations(out: dict[str, Any]) -> str:
    """The best head per dependency relation against the best fixed offset, beside Clark et al.'s
    BERT-base figures where the paper has the relation."""
    rows = []
    for r in sorted(out["relations"], key=lambda r: -r["count"]):
        bert = CLARK_2019.get(r["relation"], ("", "", ""))
        rows.append(
            [
                f"`{r['relation']}`",
                r["count"],
                f"{r['layer']}.{r['head']}",
                f"{100 * r['accuracy']:.1f}%",
                f"{100 * r['baseline_accuracy']:.1f}%",
                r["direction"],
                bert[0],
                bert[1] and f"{bert[1]}%",
                bert[2] and f"{bert[2]}%",
            ]
        )
    columns = [
        "relation",
        "arcs",
        "head",
        "accuracy",
        "offset baseline",
        "direction",
        "BERT-base head",
        "BERT-base",
        "its baseline",
    ]
    note = (
        "headlab's heads are named layer.head from 0; the BERT-base columns are Clark et al. "
        "2019's Table 1, numbered layer-head from 1 as in the paper, measured by the same rule."
    )
    return table(columns, rows) + f"\n\n{note}"


# --- benchmarks: benchmarks/results/NAME.json ----------------------------------------------------


def machine_line(d: dict[str, Any]) -> str:
    """Where a benchmark ran, in one line (``machine`` is a dict or a sentence)."""
    m = d.get("machine", "not recorded")
    if isinstance(m, str):
        return m
    return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in m.items())


def bench_table(d: dict[str, Any]) -> str | None:
    """A benchmark's ``table``: ``{"columns": [...], "rows": [[...], ...]}`` (None: it has none)."""
    return table(d["table"]["columns"], d["table"]["rows"]) if "table" in d else None


def sinks_perplexity(d: dict[str, Any]) -> str:
    """Perplexity over the long text: full cache, then per window alone and with s sinks."""
    rows = []
    for m in d["models"]:
        by = {(r["window"], r["sinks"]): r["ppl"] for r in m["runs"]}
        sinks = sorted({s for _, s in by if s > 0})
        for i, w in enumerate(sorted({w for w, _ in by})):
            first = [f"{m['model']} ({m['context']})", m["tokens"], f"{m['full_cache']['ppl']:.1f}"]
            rows.append(
                [
                    *(first if i == 0 else ["", "", ""]),
                    w,
                    f"{by[(w, 0)]:.1f}",
                    *(f"{by[(w, s)]:.1f}" for s in sinks),
                ]
            )
    columns = [
        "model (context)",
        "tokens",
        "full cache",
        "window",
        "alone (s = 0)",
        *(f"s = {s}" for s in sinks),
    ]
    return table(columns, rows)


def retrieval_masking(d: dict[str, Any]) -> str:
    """Retrieval accuracy with the top-k retrieval heads masked against k random heads."""
    m = d["masking"]
    rows = [
        [k["k"], f"{k['top']:.2f}", ", ".join(f"{r:.2f}" for r in k["random"])] for k in m["by_k"]
    ]
    note = (
        f"Unmasked: {m['none']:.2f}, on {m['probes']} probes of "
        f"{', '.join(map(str, m['lengths']))} tokens."
    )
    return table(["k", "top-k masked", "k random heads masked (each draw)"], rows) + f"\n\n{note}"


def retrieval_top_heads(d: dict[str, Any]) -> str:
    """The heads with the highest retrieval scores (Wu et al. 2024's rule)."""
    rows = [[f"{h['layer']}.{h['head']}", f"{h['score']:.2f}"] for h in d["top_heads"][:8]]
    return table(["head", "retrieval score"], rows)


Table = Callable[[dict[str, Any]], "str | None"]
EXPERIMENT_TABLES: dict[str, Table] = {
    "induction#seeds": induction_seeds,
    "one-vs-many#accuracy": one_vs_many_accuracy,
    "head-count#loss": head_count_loss,
    "head-count#reference": head_count_reference,
    "prune#summary": prune_summary,
    "prune#survivors": prune_survivors,
    "gqa#decode": gqa_decode,
    "gqa#kv_cache": gqa_kv_cache,
    "gqa#quality": gqa_quality,
    "gqa#smollm2": gqa_smollm2,
    "gqa#reference": gqa_reference,
    "sinks#perplexity": sinks_perplexity,
    "retrieval#masking": retrieval_masking,
    "retrieval#top_heads": retrieval_top_heads,
}
DATA_TABLES = {
    "grid": heads_grid,
    "scores": heads_scores,
    "best": heads_best,
    "counts": heads_counts,
    "sinks": heads_sinks,
    "relations": syntax_relations,
}
BENCH_TABLES = {"table": bench_table}
