"""``headlab circuit`` and what ``headlab heads --evidence`` prints: the induction circuit, and
each head's label with the evidence behind it (headlab.heads.evidence, headlab.heads.circuit).
torch and the library load inside the commands."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from headlab.cli.common import (
    ModelName,
    console,
    ensure_fetched,
    err_console,
    fail,
    progress_bar,
    seed_option,
)

ABLATIONS = ("mean", "zero")
AblationOption = Annotated[
    str,
    typer.Option(
        "--ablation",
        help="How a head is ablated: mean (its output replaced by its mean over the probe; the "
        "default) or zero.",
    ),
]


def check_ablation(mode: str) -> Any:
    """--ablation's value (a :data:`headlab.heads.effects.Mode`), or exit 2 naming the valid
    ones."""
    if mode not in ABLATIONS:
        raise fail(f"--ablation {mode!r}: valid modes are {', '.join(ABLATIONS)}")
    return mode


def circuit(
    model: ModelName = "default",
    seed: int = seed_option("Seed of the repeated random tokens:"),
    ablation: AblationOption = "mean",
    as_json: bool = typer.Option(False, "--json", help="Print the circuit as JSON."),
) -> None:
    """The induction circuit (Olsson et al. 2022): previous-token heads feeding induction heads,
    each edge the K-composition above its random baseline and confirmed by ablating the feeder,
    on repeated random tokens."""
    import json

    from headlab import zoo
    from headlab.heads.baselines import FloorsDoNotFit
    from headlab.heads.circuit import NEEDS_FLOORS, induction_circuit
    from headlab.measure import build_probe

    mode = check_ablation(ablation)
    ensure_fetched(model)
    try:
        m, tokenizer = zoo.load(model)
        c = m.config
        probe = build_probe("random-repeat", tokenizer, c.max_len, c.vocab_size, seed=seed)
        with err_console.status("baselines, labels, compositions, ablations…"):
            result = induction_circuit(m, probe, mode)
    except FloorsDoNotFit as exc:
        raise fail(f"{exc.sizes()}: {NEEDS_FLOORS}") from None
    except ValueError as exc:
        raise fail(str(exc)) from None
    if as_json:
        typer.echo(json.dumps({"model": model, **result.to_dict()}, ensure_ascii=False))
        return
    print_circuit(model, result.to_dict())


def _head(pair: list[int]) -> str:
    return f"{pair[0]}.{pair[1]}"


def print_circuit(model: str, d: dict[str, Any]) -> None:
    """The circuit as lines: its nodes, then every candidate edge with its numbers."""
    prev = ", ".join(f"{_head(p['head'])} ({p['score']:.2f})" for p in d["previous"]) or "none"
    ind = ", ".join(f"{_head(p['head'])} ({p['score']:.2f})" for p in d["induction"]) or "none"
    console.print(f"{model}: previous-token heads {prev}; induction heads {ind}", highlight=False)
    console.print(
        f"K-composition floor (random matrices): {d['k_floor']:.3f}; feeders "
        f"ablated by their {d['ablation']}",
        highlight=False,
    )
    for e in d["edges"]:
        s = e.get("induction_score")
        ablated = f"{s['clean']:.2f} → {s['ablated']:.2f}" if s else "not measured"
        mark = "drawn" if e["drawn"] else "not drawn"
        console.print(
            f"  {_head(e['from'])} → {_head(e['to'])}: K-composition "
            f"{e['k_composition']:.3f}, induction score with the feeder ablated "
            f"{ablated} ({mark})",
            highlight=False,
        )
    if not d["edges"]:
        console.print("  no previous-token head precedes an induction head: no edge")
    console.print(f"{d['forwards']} forward passes; {_timings(d['seconds'])}", highlight=False)


def print_evidence(d: dict[str, Any]) -> None:
    """Each head's label and the sentence backing it (:meth:`headlab.heads.evidence.Evidence.
    to_dict`), then what the evidence cost."""
    for h in d["heads"]:
        console.print(f"{h['layer']}.{h['head']} {h['label']}: {h['evidence']}", highlight=False)
    console.print(
        f"baselines: random weights and shuffled tokens, seeds {d['baseline_seeds']}, "
        f"labels ≥ mean + {d['k']:g} sd; {ablation_cost(d)}; {_timings(d['seconds'])}",
        highlight=False,
    )


def _timings(seconds: dict[str, float]) -> str:
    """Each stage's wall time: "seconds: labels 0.12, composition 0.03"."""
    return "seconds: " + ", ".join(f"{stage} {s:.2f}" for stage, s in seconds.items())


def ablation_cost(d: dict[str, Any]) -> str:
    """How the evidence's ablation effects were measured, and in how many passes: every head
    ablated exactly, or estimated by attribution patching with some heads then ablated
    exactly (``d``: :meth:`headlab.heads.evidence.Evidence.to_dict`)."""
    a, exact = d["ablation"], d.get("exact_ablation")
    if a is None:
        return "no ablation (not a causal model)"

    def passes(p: dict[str, Any]) -> str:
        back = f" and {p['backwards']} backward" if p.get("backwards") else ""
        return (
            f"{p['forwards']} forward{back} passes ({p['model_passes']} whole-model "
            "forward equivalents)"
        )

    if a["method"] == "exact":
        return f"{a['heads']} heads ablated exactly ({a['mode']}) in {passes(a)}"
    path = "" if a["steps"] == 1 else f", {a['steps']} points along each {a['per']}'s path"
    said = (
        f"{a['heads']} heads' ablation effects ({a['mode']}) estimated by attribution "
        f"patching{path} from {passes(a)}"
    )
    if not exact:
        return said
    return f"{said}, then {exact['heads']} of them ablated exactly in {passes(exact)}"


def parse_exact(spec: str | None) -> Any:
    """--exact's value: None (not given), True ('all') or a list of (layer, head)."""
    if spec is None or spec == "all":
        return None if spec is None else True
    try:
        return [tuple(int(x) for x in part.split(".", 1)) for part in spec.split(",")]
    except ValueError:
        raise fail(f"--exact takes all or LAYER.HEAD,... e.g. 0.2,1.5; got {spec!r}") from None


def check_exact(exact: Any, L: int, h: int) -> None:
    """Exit 2 when --exact names a head the model does not have."""
    for pair in exact if isinstance(exact, list) else []:
        if len(pair) != 2 or not (0 <= pair[0] < L and 0 <= pair[1] < h):
            raise fail(
                f"--exact {'.'.join(map(str, pair))}: this model has layers "
                f"0..{L - 1} and heads 0..{h - 1}"
            )


def run_evidence(
    m: Any,
    p: Any,
    mode: Any,
    content: bool,
    keep: Any,
    margins: Any,
    ruled: bool,
    exact: Any = None,
) -> Any:
    """:func:`headlab.heads.evidence.evidence` with a progress bar, a step per stage."""
    from headlab.heads.evidence import STEPS, evidence

    steps = list(STEPS)

    with progress_bar() as bar:
        return evidence(
            m,
            p,
            mode,
            content=content,
            keep=keep,
            syntactic=margins,
            label_syntactic=ruled,
            exact=exact,
            progress=lambda step, done, total: bar(steps.index(step), len(steps), "evidence"),
        )
