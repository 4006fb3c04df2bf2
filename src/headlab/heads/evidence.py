"""What backs each head's label: its scores beside their baselines, what ablating it does, its
strongest compositions, and one plain sentence that says so with the measured numbers.

Shape legend
    L   layers; h heads per layer; B probe sequences; n tokens

:func:`evidence` runs, on one probe:

    1. the analysis with each label needing its margin over random weights
       (:mod:`headlab.heads.baselines`: random weights and shuffled tokens, 3 seeds each)
    2. every head ablated alone, mean by default: the loss on a later copy's tokens, the loss
       on the rows where the head's type can act, and the induction heads' scores. Estimated
       in two stages (:func:`headlab.heads.estimate.estimate_heads`: an estimate ranks every
       head, the heads it ranks first are ablated exactly) where exact ablation
       (:func:`headlab.heads.effects.ablate_heads`) of every head costs more, or when
       ``exact`` names heads, whose cards then lead with the exact figure, the estimate after
       it; a card with only the estimate says so first, and how far the estimate missed the
       heads ablated both ways on this probe; exact for every head when ``exact`` is True
    3. the composition scores of every pair (:mod:`headlab.heads.composition`)

and gives each head a :class:`HeadCard`. Beside each ablation effect stands the median effect of
the heads of the same layer, what ablating a head picked at random there does.

Papers: Olsson et al. 2022; Elhage et al. 2021; Michel et al. 2019; Voita et al. 2019.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from headlab.heads.attribution import Attributions
from headlab.heads.baselines import Baselines, Stages, baselines
from headlab.heads.composition import Composition, composition_scores
from headlab.heads.effects import Ablations, Mode, ablate_heads
from headlab.heads.estimate import (
    CHECK,
    CHECK_SIZE,
    LAYER_STEPS,
    estimate_heads,
    exact_where_measured,
)
from headlab.heads.labels import BEST_TYPES, NEEDS, THRESHOLDS
from headlab.heads.report import HeadReport, HeadScore, analyse, unused_seed
from headlab.heads.targets import build_targets
from headlab.measure import Probe, copy_targets

# what a score measures, after its value: "0.99 of its attention on the previous token"
PHRASES = {
    "previous": "of its attention on the previous token",
    "next": "of its attention on the next token",
    "self": "of its attention on its own token",
    "positional": "of its queries' strongest attention at offset {offset:+d}",
    "duplicate": "of its attention on earlier copies of its token",
    "induction": "of its attention on the token after an earlier copy of its own",
    "induction_active": "of the attention it does not rest on the first token goes to the token "
    "after an earlier copy of its own ({induction:.2f} of all its attention)",
    "content": "content score (attention its own position profile does not explain)",
    "rare_word": "of its queries' strongest attention on the sentence's rarest word",
    "syntactic": "points above the offset baseline on {relation}",
    "first_token": "of its attention on the first token",
    "delimiter": "of its attention on delimiters",
    "diffuse": "normalised entropy of its rows",
}
# the score a label rests on (positional offsets −1, 0, +1 are named for what they do)
SCORE_OF_LABEL = {
    **BEST_TYPES,
    "next-token": "next",
    "delimiter": "delimiter",
    "diffuse": "diffuse",
}
ROWS_OF_LABEL = {"induction": "induction", "duplicate-token": "duplicate", "rare-word": "rare"}
INDUCTION_DROP = 0.5  # a feeder: ablating it takes an induction score below half its value
STAGES = ("baselines", "scores", "composition", "ablation")  # what evidence() runs, in order
# the steps its progress reports, in order, and what each is in words: the baselines are the
# shuffled orders then the random models, the ablation an estimate (where it runs) then exact
STEPS = {
    "shuffled": "shuffled tokens",
    "floors": "random-weights floors",
    "scores": "scoring every head, by layer",
    "composition": "composition scores",
    "estimate": "estimating every head's ablation effect",
    "ablation": "ablating heads",
}


@dataclass(frozen=True)
class HeadCard:
    """One head's evidence (see :func:`evidence`); ``to_dict`` is its JSON."""

    score: HeadScore  # its scores and its label (with the random-weights margin)
    baselines: dict[str, dict[str, Any]]  # score type → random / shuffled mean and sd
    ablation: dict[str, Any]  # effects of ablating it (empty when not measured)
    compositions: dict[str, list[dict[str, Any]]]  # "from" (it feeds) / "into" (feeds it)
    sentence: str

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.score.to_dict(),
            "baselines": self.baselines,
            "ablation": self.ablation,
            "compositions": self.compositions,
            "evidence": self.sentence,
        }


@dataclass(frozen=True)
class Evidence:
    """Every head's card on one probe, and what it cost."""

    report: HeadReport
    baselines: Baselines
    composition: Composition
    ablations: Ablations | Attributions | None  # every head's effects, estimated or exact
    cards: list[HeadCard]
    seconds: dict[str, float] = field(default_factory=dict)
    exact: Ablations | None = None  # the heads ablated exactly beside the estimate

    def loss_effect(self, rows: Tensor) -> Tensor:
        """(L·h,): each head's ablation effect on the mean loss over ``rows`` (B, n − 1), exact
        where measured (:func:`headlab.heads.estimate.exact_where_measured`)."""
        if self.ablations is None:
            raise ValueError("no ablation was run: it needs a causal model")
        return exact_where_measured(self.ablations, self.exact, rows)

    def card(self, layer: int, head: int) -> HeadCard:
        return next(c for c in self.cards if (c.score.layer, c.score.head) == (layer, head))

    def to_dict(self) -> dict[str, Any]:
        return {
            "probe": self.report.probe,
            "k": self.baselines.k,
            "baseline_seeds": list(self.baselines.seeds),
            "ablation": None if self.ablations is None else self.ablations.to_dict(),
            "exact_ablation": None if self.exact is None else self.exact.to_dict(),
            "composition": self.composition.to_dict(5),
            "seconds": {k: round(v, 2) for k, v in self.seconds.items()},
            "heads": [c.to_dict() for c in self.cards],
        }


def loss_rows(probe: Probe, causal: bool) -> dict[str, Tensor]:
    """The loss positions (B, n − 1) each kind of head can act on: a query with a choice of
    keys ("any"), one with an earlier copy ("induction"), one that sees another copy
    ("duplicate"), one that sees the rarest word ("rare"), and a later copy's tokens ("copy")."""
    t = build_targets(probe, causal)
    n = probe.n
    choice = torch.ones(probe.tokens.shape[0], n - 1, dtype=torch.bool)
    choice[:, 0] = not causal
    rows = {
        "any": choice,
        "induction": t.induction_rows[:, :-1],
        "duplicate": t.duplicate_rows[:, :-1],
        "copy": copy_targets(probe.source)[1],
    }
    if t.rare is not None:
        rows["rare"] = t.rare[1][:, :-1]
    return rows


def _ablation(
    a: Ablations | Attributions,
    rows: dict[str, Tensor],
    label: str,
    layer: int,
    head: int,
    induction_heads: list[tuple[int, int]],
) -> dict[str, Any]:
    """One head's ablation effects, each beside the median of its layer's heads; ``method``
    says whether they are exact or a first-order estimate (:mod:`headlab.heads.attribution`)."""
    s = a.index(layer, head)
    kind = ROWS_OF_LABEL.get(label, "any")
    out: dict[str, Any] = {"mode": a.mode, "method": a.method, "rows": kind}
    for name, where in (("later_copy", rows["copy"]), ("where_it_acts", rows[kind])):
        effect = a.loss_effect(where)
        layer_effects = [float(effect[i]) for i, (l, _) in enumerate(a.heads) if l == layer]
        value = float(effect[s])
        out[name] = (
            None
            if value != value
            else {
                "loss_rise": round(value, 4),
                "layer_median": round(statistics.median(layer_effects), 4),
            }
        )
    drops = []
    for l, i in induction_heads:
        before, after = float(a.clean_induction[l, i]), float(a.induction[s, l, i])
        if (l, i) != (layer, head) and l > layer:
            drops.append({"head": [l, i], "from": round(before, 4), "to": round(after, 4)})
    out["induction_scores"] = sorted(drops, key=lambda d: d["to"] - d["from"])
    return out


def _exact(
    a: Ablations,
    rows: dict[str, Tensor],
    label: str,
    layer: int,
    head: int,
    induction_heads: list[tuple[int, int]],
) -> dict[str, Any]:
    """The exact figures of one head ablated exactly beside the estimate: loss rises and the
    induction scores it leaves (no layer median: only the heads asked for were ablated)."""
    full = _ablation(a, rows, label, layer, head, induction_heads)
    rises = {
        k: None if full[k] is None else full[k]["loss_rise"]
        for k in ("later_copy", "where_it_acts")
    }
    return {**rises, "induction_scores": full["induction_scores"]}


def _compositions(c: Composition, layer: int, head: int, n: int = 3) -> dict[str, list]:
    """The ``n`` strongest Q/K/V compositions out of and into one head."""
    out: dict[str, list] = {"from": [], "into": []}
    for mode in ("q", "k", "v"):
        s = c.scores[mode]
        for side, values in (("from", s[layer, head]), ("into", s[:, :, layer, head])):
            for v, idx in zip(*values.flatten().topk(min(n, values.numel())), strict=True):
                if float(v) > 0:
                    other = list(divmod(int(idx), values.shape[1]))
                    out[side].append(
                        {
                            "mode": mode,
                            "head": other,
                            "score": round(float(v), 4),
                            "above_baseline": float(v) >= c.floor(mode),
                        }
                    )
    for side in out:
        out[side] = sorted(out[side], key=lambda d: -d["score"])[:n]
    return out


def _rise(
    effect: dict[str, Any] | None,
    where: str,
    estimated: bool = False,
    exact: float | None = None,
    quality: dict[str, Any] | None = None,
) -> str:
    """ "raises the loss on … by 0.59 nats (median head of its layer: 0.05)". A head also
    ablated exactly leads with the measured figure, the estimate after it; a head with only the
    estimate says so first, and how far the estimate missed on this probe's exactly ablated
    heads (``quality``, from :func:`_estimate_quality`)."""
    if effect is None:
        return ""
    value, median = effect["loss_rise"], effect["layer_median"]
    if not estimated:
        return (
            f"ablating it {_verb(value)} the loss on {where} by {abs(value):.2f} nats (the "
            f"median head of its layer: {median:+.2f})"
        )
    if exact is not None:
        return (
            f"ablating it {_verb(exact)} the loss on {where} by {abs(exact):.2f} nats, measured "
            f"by ablating it (the first-order estimate: {value:+.2f}; the median head of its "
            f"layer, estimated: {median:+.2f})"
        )
    return (
        f"not ablated exactly; a first-order estimate says ablating it {_verb(value)} the loss "
        f"on {where} by {abs(value):.2f} nats (the median head of its layer: {median:+.2f})"
        + _how_good(quality)
    )


def _verb(value: float) -> str:
    return "raises" if value >= 0 else "lowers"


def _how_good(quality: dict[str, Any] | None) -> str:
    """How far the estimate missed the exact figures of the heads measured both ways."""
    if not quality:
        return "; no head was ablated exactly on these rows to say how good the estimate is"
    n, wrong = quality["heads"], quality["wrong_sign"]
    return (
        f"; on this probe the estimate missed the {n} heads also ablated exactly by "
        f"{quality['mean_error']:.2f} nats on average, with the wrong sign for {wrong} of them"
    )


def _estimate_quality(
    estimate: Ablations | Attributions, exact: Ablations | None, rows: Tensor
) -> dict[str, Any] | None:
    """How the estimate compares with exact ablation over ``rows`` (B, n − 1) on the heads
    measured both ways: their count, the mean absolute difference in nats and how many signs
    differ; None when no head was measured both ways."""
    if exact is None or not bool(rows.any()):
        return None
    guessed, measured = estimate.loss_effect(rows), exact.loss_effect(rows)
    pairs = [
        (float(guessed[estimate.index(*head)]), float(measured[s]))
        for s, head in enumerate(exact.heads)
    ]
    pairs = [(g, m) for g, m in pairs if g == g and m == m]
    if not pairs:
        return None
    return {
        "heads": len(pairs),
        "mean_error": round(sum(abs(g - m) for g, m in pairs) / len(pairs), 4),
        "wrong_sign": sum((g >= 0) != (m >= 0) for g, m in pairs),
    }


def _closest(score: HeadScore, floors: dict[str, float]) -> str:
    """For a head no type passes: the type closest to passing, against what it must reach (a
    type of :data:`NEEDS` no closer than its plain score is to that score's minimum)."""
    gaps = {
        k: v - max(THRESHOLDS[k], floors.get(k, 0.0))
        for k, v in score.scores.items()
        if k in THRESHOLDS
    }
    for k, (plain, least) in NEEDS.items():
        if k in gaps:
            gaps[k] = min(gaps[k], score.scores.get(plain, 0.0) - least)
    if not gaps:
        return "no score was measured"
    k = max(gaps, key=lambda t: gaps[t])
    need = max(THRESHOLDS[k], floors.get(k, 0.0))
    why = "its threshold" if need == THRESHOLDS[k] else "the random-weights floor"
    return (
        f"no type passes both its threshold and its margin over random weights; closest: "
        f"{k} {score.scores[k]:.2f} against {why} {need:.2f}"
    )


def sentence(
    score: HeadScore, base: dict[str, Any], ablation: dict[str, Any], floors: dict[str, float]
) -> str:
    """The plain sentence of what backs a head's label, with the measured numbers: "0.99 of
    its attention on the previous token, 0.06 with random weights; ablating it drops head 1.3's
    induction score from 0.58 to 0.00"."""
    kind = SCORE_OF_LABEL.get(score.label)
    if kind is None or kind not in score.scores:
        first = _closest(score, floors)
    else:
        phrase = PHRASES[kind].format(
            offset=score.offset,
            relation=score.relation or "a relation",
            induction=score.scores.get("induction", 0.0),
        )
        random = base.get(kind, {}).get("random", {}).get("mean")
        chance = "" if random is None else f", {random:.2f} with random weights"
        first = f"{score.scores[kind]:.2f} {phrase}{chance}"
    if not ablation:
        return first
    return f"{first}; {second}" if (second := _effect(score, ablation)) else first


def _effect(score: HeadScore, ablation: dict[str, Any]) -> str:
    """The sentence's second half: the induction score it drops, or the loss it raises."""
    estimated, exact = ablation.get("method") == "attribution", ablation.get("exact", {})
    quality = ablation.get("estimate_quality", {})
    drops = ablation.get("induction_scores", [])
    fed = [d for d in drops if d["from"] > 0 and d["to"] <= INDUCTION_DROP * d["from"]]
    if fed:
        d = fed[0]
        who = f"head {d['head'][0]}.{d['head'][1]}'s induction score from {d['from']:.2f}"
        sure = [e["to"] for e in exact.get("induction_scores", []) if e["head"] == d["head"]]
        if not estimated:
            return f"ablating it drops {who} to {d['to']:.2f}"
        if sure:
            return (
                f"ablating it takes {who} to {sure[0]:.2f}, measured by ablating it (the "
                f"first-order estimate: {d['to']:.2f})"
            )
        return (
            f"not ablated exactly; a first-order estimate says ablating it drops {who} to "
            f"{d['to']:.2f}"
        )
    if score.label == "induction":
        return _rise(
            ablation.get("later_copy"),
            "a later copy's tokens",
            estimated,
            exact.get("later_copy"),
            quality.get("later_copy"),
        )
    where = {
        "any": "every token",
        "induction": "tokens seen before",
        "duplicate": "tokens with another copy",
        "rare": "tokens that see the rarest word",
    }[ablation["rows"]]
    return _rise(
        ablation.get("where_it_acts"),
        where,
        estimated,
        exact.get("where_it_acts"),
        quality.get("where_it_acts"),
    )


# True: every head exactly; None: exactly when that costs no more than the estimate; else the
# heads to ablate exactly beside the estimate
Exact = bool | Collection[tuple[int, int]] | None


def _plan(rows: dict[str, Tensor], check: int | None) -> dict[str, Any]:
    """How the two-stage estimate ranks (:mod:`headlab.heads.estimate`): on a probe with a later
    copy, plain attribution patching by the size of each head's estimated effect on every token
    and on the later copy, :data:`CHECK_SIZE` heads of each ablated exactly; elsewhere, the
    layer path by the rise on every token, :data:`CHECK` heads ablated exactly."""
    if bool(rows["copy"].any()):
        return {
            "rank": [rows["any"], rows["copy"]],
            "steps": 1,
            "by": "size",
            "check": CHECK_SIZE if check is None else check,
        }
    return {
        "rank": [rows["any"]],
        "steps": LAYER_STEPS,
        "by": "rise",
        "check": CHECK if check is None else check,
    }


def _exact_is_cheap(
    model: Any, rows: dict[str, Tensor], induction: list[Any], plan: dict[str, Any]
) -> bool:
    """Whether ablating every head exactly costs no more probe passes (forwards of the probe,
    each copy counted, a backward as two) than the two-stage estimate of ``plan``: true of
    small models. The estimate: the plain terms (a forward, a backward per quantity), the layer
    path's steps − 1 copies per layer with a backward per ranking, and exact ablation of the
    heads each ranking puts first and of the induction heads."""
    L, h = model.config.n_layers, model.config.n_heads
    depth = sum((L - l) / L for l in range(L))  # a partial forward from every layer
    exact = 1 + h * depth
    metrics = len({tuple(r.flatten().tolist()) for r in rows.values()}) + len(induction)
    path = (plan["steps"] - 1) * depth * (1 + 2 * len(plan["rank"]))
    checked = min(plan["check"] * len(plan["rank"]) + len(induction), L * h)
    return exact <= 1 + 2 * metrics + path + checked * depth / L


def measure_ablations(
    model: Any,
    probe: Probe,
    rows: dict[str, Tensor],
    induction: list[tuple[int, int]],
    mode: Mode = "mean",
    exact: Exact = (),
    check: int | None = None,
    progress: Stages | None = None,
) -> tuple[Any, Ablations | None]:
    """Every head's ablation effects on the loss over each of ``rows`` (:func:`loss_rows`) and
    on the scores of ``induction``'s heads: estimated in two stages (:func:`headlab.heads.
    estimate.estimate_heads`, ranked as :func:`_plan` says, ``check`` heads per ranking, and
    ``induction``'s and the heads ``exact`` names ablated exactly), or exact for every head when
    ``exact`` is True. :func:`headlab.heads.estimate.exact_where_measured` reads the two
    together. ``progress(stage, done, total)``: "estimate" around the estimate, "ablation"
    counting the heads ablated exactly."""
    plan = _plan(rows, check)
    if exact is True or (exact is None and _exact_is_cheap(model, rows, induction, plan)):

        def step(done: int, total: int) -> None:
            if progress is not None:
                progress("ablation", done, total)

        return ablate_heads(model, probe, mode=mode, progress=step), None
    picked = set() if exact is False or exact is None else set(exact)
    two = estimate_heads(
        model, probe, list(rows.values()), induction, mode, exact=picked, progress=progress, **plan
    )
    return two.estimate, two.exact


def evidence(
    model: Any,
    probe: Probe,
    mode: Mode = "mean",
    seed: int | None = None,
    content: bool = True,
    keep: Any = (),
    progress: Stages | None = None,
    syntactic: Any = None,
    label_syntactic: bool = False,
    exact: Exact = None,
    check: int | None = None,
) -> Evidence:
    """Every head's :class:`HeadCard` on ``probe`` (module docstring). ``keep`` as for
    :func:`headlab.heads.analyse` (default: no patterns), ``syntactic`` its syntactic margins
    (labelling with them only with ``label_syntactic``);
    ``progress(step, done, total)`` reports each of :data:`STEPS` as it starts and advances
    (the random-weights floors and the composition scores at once where they are cached:
    :func:`headlab.heads.baselines.floors_cached`, :func:`headlab.heads.composition.
    composition_cached`); :data:`STAGES` name the times of ``seconds``. Ablation effects are
    estimated for every head (:mod:`headlab.heads.estimate`) unless ``exact`` is True (every
    head ablated exactly) or None (the default) on a model small enough that exact ablation of
    every head costs no more probe passes than the estimate (the default model); the
    (layer, head) pairs ``exact`` lists, the induction heads and the heads the estimate ranks
    first (``check`` per ranking; by default as :func:`_plan` says) are ablated exactly, and
    their cards show both figures. Ablations need a causal model; for another they are left out.
    ``seed`` changes nothing and is deprecated (:func:`headlab.heads.report.unused_seed`)."""
    unused_seed(seed, "evidence")
    times: dict[str, float] = {}
    say = progress or (lambda step, done, total: None)
    L = model.config.n_layers

    def stage(name: str, run: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        out = run()
        times[name] = time.perf_counter() - start
        return out

    def composition() -> Composition:
        say("composition", 0, 1)
        found = composition_scores(model, on_disk=True)
        say("composition", 1, 1)
        return found

    base = stage("baselines", lambda: baselines(model, probe, content=content, progress=say))
    floors = base.floors()
    averaged = base.averaged_floors()
    say("scores", 0, L)
    report = stage(
        "scores",
        lambda: analyse(
            model,
            probe,
            content=content,
            keep=keep,
            syntactic=syntactic,
            floors=floors,
            label_syntactic=label_syntactic,
            averaged_floors=averaged,
            progress=lambda done, total: say("scores", done, total),
        ),
    )
    comp = stage("composition", composition)
    causal = bool(model.config.causal)
    rows = loss_rows(probe, causal)
    induction = [(s.layer, s.head) for s in report.heads if s.label == "induction"]
    ablations, checked = (
        stage(
            "ablation",
            lambda: measure_ablations(model, probe, rows, induction, mode, exact, check, say),
        )
        if causal
        else (None, None)
    )
    kept: dict[str, dict[str, Any] | None] = {}

    def quality(kind: str) -> dict[str, Any] | None:
        if kind not in kept:
            assert ablations is not None
            kept[kind] = _estimate_quality(ablations, checked, rows[kind])
        return kept[kind]

    cards = []
    for s in report.heads:
        b = base.of_head(s.layer, s.head)
        a = (
            {}
            if ablations is None
            else _ablation(ablations, rows, s.label, s.layer, s.head, induction)
        )
        if checked is not None and (s.layer, s.head) in checked.heads:
            a["exact"] = _exact(checked, rows, s.label, s.layer, s.head, induction)
        elif a.get("method") == "attribution":
            a["estimate_quality"] = {
                name: quality(kind)
                for name, kind in (("later_copy", "copy"), ("where_it_acts", a["rows"]))
            }
        cards.append(
            HeadCard(
                s, b, a, _compositions(comp, s.layer, s.head), sentence(s, b, a, floors[s.layer])
            )
        )
    return Evidence(report, base, comp, ablations, cards, times, checked)
