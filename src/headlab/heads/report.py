"""Every head of a model on one probe, scored and labelled: :func:`analyse` and its report.

Shape legend
    B   probe sequences; L layers; h heads per layer; n tokens

Data flows one way: the probe's targets are built once (:mod:`headlab.heads.targets`), each
layer's weights are scored as that layer runs (:mod:`headlab.heads.scores`), each head is
labelled (:mod:`headlab.heads.labels`), and the result is one :class:`HeadReport` that the CLI,
the server, the notebook views and the experiments all read.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from headlab.heads.labels import (
    BEST_TYPES,
    NEEDS,
    REST_OF_LABEL,
    SINK_THRESHOLD,
    THRESHOLDS,
    decide,
    qualifies,
)
from headlab.heads.scores import pattern_scores
from headlab.heads.targets import Targets, probe_targets
from headlab.measure import Probe, reduce_patterns
from headlab.model import Transformer


@dataclass(frozen=True)
class HeadScore:
    """One head's scores on a probe, and its label."""

    layer: int
    head: int
    label: str  # a LABELS value, or "mixed" when no score passes its threshold
    scores: dict[str, float]  # SCORE_TYPES (those measured) and MUL_TYPES → value in [0, 1]
    offset: int  # the relative offset of the positional score (e.g. −1 = previous token)
    # where the head rests on the rows its label's score leaves out: the mean weight on the
    # first token there (induction, duplicate-token, rare-word), or on the keys the content
    # score leaves out (BOS, [CLS], [SEP]); None for the other labels
    rest: float | None = None
    relation: str = ""  # the dependency relation of the syntactic score, when measured
    # with floors (headlab.heads.baselines.label_heads): the random-weights floor of the score
    # the label rests on, the score's margin over it, and the label that thresholds alone
    # give when the floor took it away ("" when it did not)
    floor: float | None = None
    margin: float | None = None
    below_floor: str = ""

    def to_dict(self) -> dict:
        out = {
            "layer": self.layer,
            "head": self.head,
            "label": self.label,
            "offset": self.offset,
            "scores": {k: round(v, 4) for k, v in self.scores.items()},
            "rest": None if self.rest is None else round(self.rest, 4),
            "floor": None if self.floor is None else round(self.floor, 4),
            "margin": None if self.margin is None else round(self.margin, 4),
            "below_floor": self.below_floor or None,
        }
        if self.relation:
            out["relation"] = self.relation
        return out


@dataclass(frozen=True, kw_only=True)
class HeadReport:
    """Every head of a model on one probe (see :func:`analyse`).

    ``patterns`` and ``averaged_patterns`` hold the first probe sequence's weights when every
    head's pattern was kept (the default); an analysis that keeps only some heads' patterns
    (``analyse(keep=…)``, for long inputs) leaves them None and puts those in ``selected``.
    :meth:`pattern` reads either. The scores are averaged over every sequence of the probe.
    """

    probe: str
    tokens: list[str]  # display labels of the first sequence
    ids: list[int]  # its token ids
    heads: list[HeadScore]  # layer-major order
    patterns: Tensor | None  # (L, h, n, n): each head's weights on the first sequence
    averaged_patterns: Tensor | None  # (L, n, n): each layer's averaged head on it
    averaged: list[HeadScore]  # per layer, the averaged head scored the same way (head = −1)
    text: str = ""  # the text of a text probe
    # (layer, head) → (n, n) pattern of the heads asked for by analyse(keep=…); head −1 = averaged
    selected: dict[tuple[int, int], Tensor] = field(default_factory=dict)
    # key/value heads of the model (grouped-query attention: query head i reads K/V head
    # i // (h / n_kv_heads)); None: one per query head
    n_kv_heads: int | None = None
    # whether the probe opens with a special start token; without one a sink rests on the
    # first word, which the rare-word score therefore leaves out (targets.rare_word_targets)
    start_token: bool = True
    # layer → score type → the random-weights floor each label had to reach too; None: the
    # labels went by thresholds alone, unchecked against chance
    floors: dict[int, dict[str, float]] | None = None

    @property
    def sink_position(self) -> dict[str, Any]:
        """Where an attention sink rests on this probe: position 0, the start token or, in a
        probe without one, the first word."""
        token = self.tokens[0] if self.tokens else ""
        what = "the start token" if self.start_token else f"the first word, {token.strip()!r}"
        return {
            "position": 0,
            "token": token,
            "start_token": self.start_token,
            "note": f"a sink rests on {what}"
            + ("" if self.start_token else "; the rare-word score leaves position 0 out"),
        }

    def pattern(self, layer: int, head: int) -> Tensor:
        """The (n, n) pattern of head ``head`` of layer ``layer`` (−1: the averaged head) on
        the first sequence; a KeyError says which heads were kept."""
        if (layer, head) in self.selected:
            return self.selected[(layer, head)]
        if self.patterns is not None and self.averaged_patterns is not None:
            return self.averaged_patterns[layer] if head < 0 else self.patterns[layer, head]
        kept = ", ".join(f"{l}.{h}" for l, h in self.selected) or "none"
        raise KeyError(f"the pattern of head {layer}.{head} was not kept; kept: {kept}")

    def head(self, layer: int, head: int) -> HeadScore:
        return next(s for s in self.heads if s.layer == layer and s.head == head)

    @property
    def best(self) -> dict[str, dict[str, Any]]:
        """For each type in :data:`BEST_TYPES`, the head with the highest score of that type
        among the heads labelled that type, or among all heads when none is (``labelled``
        false): the best example of the label, not a head that another label describes
        better. ``passes_threshold``: the score passes its threshold (and, for a type of
        :data:`headlab.heads.labels.NEEDS`, the plain score its minimum), floors aside."""
        best = {}
        for kind, score in BEST_TYPES.items():
            scored = [s for s in self.heads if score in s.scores]
            labelled = [s for s in scored if s.label == kind]
            if scored:
                top = max(labelled or scored, key=lambda s: s.scores[score])
                value = top.scores[score]
                best[kind] = {
                    "layer": top.layer,
                    "head": top.head,
                    "score": round(value, 4),
                    "passes_threshold": qualifies(score, top.scores),
                    "label": top.label,
                    "labelled": bool(labelled),
                }
        return best

    @property
    def sinks(self) -> list[dict[str, Any]]:
        """Per layer, Gu et al. 2024's sink share: the fraction of its heads whose mean weight
        on the first token exceeds :data:`SINK_THRESHOLD`, and which heads those are."""
        layers = sorted({s.layer for s in self.heads})
        out = []
        for layer in layers:
            heads = [s for s in self.heads if s.layer == layer]
            sinks = [s.head for s in heads if s.scores["first_token"] > SINK_THRESHOLD]
            out.append({"layer": layer, "share": round(len(sinks) / len(heads), 4), "heads": sinks})
        return out

    def to_dict(self, patterns: bool = False) -> dict[str, Any]:
        """JSON-ready scores and labels; with ``patterns`` also every head's weights (rounded
        to 4 decimals) and each layer's averaged head."""
        out: dict[str, Any] = {
            "probe": self.probe,
            "tokens": self.tokens,
            "ids": self.ids,
            "heads": [s.to_dict() for s in self.heads],
            "n_kv_heads": self.n_kv_heads or sum(1 for s in self.heads if s.layer == 0),
            "averaged": [s.to_dict() for s in self.averaged],
            "best": self.best,
            "thresholds": dict(THRESHOLDS),
            "needs": {k: {"score": s, "min": m} for k, (s, m) in NEEDS.items()},
            "labels_gated": self.floors is not None,
            "floors": None
            if self.floors is None
            else {str(l): {k: round(v, 4) for k, v in f.items()} for l, f in self.floors.items()},
            "sinks": {
                "threshold": SINK_THRESHOLD,
                "layers": self.sinks,
                "rests_on": self.sink_position,
            },
        }
        if patterns:
            if self.patterns is None or self.averaged_patterns is None:
                raise ValueError(
                    "this report kept only some heads' patterns; analyse with keep=None"
                )
            out["weights"] = self.patterns.numpy().round(4)
            out["averaged_weights"] = self.averaged_patterns.numpy().round(4)
        return out


SyntacticScores = dict[tuple[int, int], tuple[float, str]]  # (layer, head) → (margin, relation)
RetrievalScores = dict[tuple[int, int], float]  # (layer, head) → Wu et al.'s score (needle probe)
Floors = dict[int, dict[str, float]]  # layer → score type → the least score a label needs


def _scored(
    layer: int,
    head: int,
    by_type: dict[str, list[float]],
    offsets: list[int],
    rests: dict[str, list[float]],
    i: int,
    syntactic: SyntacticScores | None,
    floors: Floors | None = None,
    label_syntactic: bool = False,
    retrieval: RetrievalScores | None = None,
) -> HeadScore:
    """Head ``head`` of ``layer`` (−1: the averaged head), row ``i`` of the stacked scores.
    The syntactic score is reported beside the others; it takes part in the label only with
    ``label_syntactic`` (a label must not change because another score was asked for). A
    ``retrieval`` score is reported and labels (it is measured only on the needle probe)."""
    values = {k: v[i] for k, v in by_type.items()}  # floats: the lists come from tolist()
    if retrieval is not None and head >= 0:
        values["retrieval"] = retrieval.get((layer, head), 0.0)
    relation = ""
    ruled = values  # what the label is decided on: the syntactic score only when asked
    if syntactic is not None and head >= 0:
        margin, relation = syntactic.get((layer, head), (0.0, ""))
        if not label_syntactic:
            ruled = dict(values)
        values["syntactic"] = max(0.0, float(margin))
    gates = None if floors is None else floors.get(layer, {})
    d = decide(ruled, int(offsets[i]), gates)
    kind = REST_OF_LABEL.get(d.label)
    rest = float(rests[kind][i]) if kind in rests else None
    return HeadScore(
        layer,
        head,
        d.label,
        values,
        int(offsets[i]),
        rest,
        relation,
        floor=d.floor,
        margin=d.margin,
        below_floor=d.below_floor,
    )


# --- streaming: layers scored as they run ------------------------------------------------------

# keep=None: every head's pattern; else the (layer, head) pairs whose patterns to keep (head −1 =
# the layer's averaged head), e.g. set() for scores only
Keep = Collection[tuple[int, int]] | None


@dataclass(frozen=True)
class LayerScores:
    """One layer reduced to numbers: what :func:`layer_scorer` keeps of its (B, h, n, n) weights."""

    scores: dict[str, Tensor]  # score type → (h + 1,): the layer's h heads, then its averaged head
    offsets: Tensor  # (h + 1,) the positional score's offsets
    kept: dict[int, Tensor]  # head (−1 = averaged) → (n, n) pattern on the first sequence
    rests: dict[str, Tensor] = field(default_factory=dict)  # type → (h + 1,) resting weight


@dataclass(frozen=True)
class Scored:
    """Consecutive layers reduced to numbers, one after another: layer l's h heads, then its
    averaged head (what :class:`LayerGroups` keeps of a group, or of every layer)."""

    scores: dict[str, Tensor]  # score type → (layers · (h + 1),)
    offsets: Tensor  # (layers · (h + 1),) the positional score's offsets
    rests: dict[str, Tensor]  # type → (layers · (h + 1),) resting weight
    kept: list[dict[int, Tensor]]  # per layer: head (−1 = averaged) → (n, n) first-sequence pattern


def layer_scorer(
    targets: Targets, keep: Keep = None, content: bool = True
) -> Callable[[int, Tensor], LayerScores]:
    """The per-layer reduction of :func:`analyse`: ``score(layer, weights) → LayerScores``.

    weights (B, h, n, n) are one layer's patterns on the probe's tokens (B, n) whose
    ``targets`` were built once. Each head and the layer's averaged head are scored with
    :func:`headlab.heads.scores.pattern_scores` (``content``: the content score too, from
    the same weights), in float32 on the device the layer ran on.
    :class:`LayerGroups` is the same reduction with layers scored together.
    """
    groups = LayerGroups(targets, keep, content, budget=0)  # a group of one layer

    def score(layer: int, weights: Tensor) -> LayerScores:
        groups(layer, weights)
        (scored,) = groups.results()
        groups.done.clear()
        return scored

    return score


# the weights a LayerGroups holds before it scores them together: every layer of a short probe
# (MiniLM's six at 126 tokens hold 5 MiB, SmolLM2's thirty at 128 hold 19 MiB), one layer at a
# time once a layer's weights alone are larger
GROUP_BYTES = 32 << 20


class LayerGroups:
    """:func:`layer_scorer`'s reduction for a whole forward: ``groups(layer, weights)`` as each
    layer runs (layers in order, from 0), then :meth:`results` (or :meth:`stacked`).
    Consecutive layers' weights go into one buffer of at most ``budget`` bytes (never less
    than one layer; the attention writes them there where :meth:`place` is passed on, else
    they are copied in), and of at most ``layers`` layers where the model's count is given:
    a buffer the forward never fills still costs its allocation each call (MiniLM at 126
    tokens: 33 MB made for the 5 MB it fills, about 1 ms of a 29 ms analysis at one thread).
    The layers are scored together as one set of heads: every score is per head, so the
    numbers are those of one layer at a time, and a group costs one pass of each scoring
    operation, not one a layer (on MiniLM's six layers the scoring took a quarter less time
    at one thread, nearly half less at two)."""

    def __init__(
        self,
        targets: Targets,
        keep: Keep,
        content: bool,
        budget: int = GROUP_BYTES,
        layers: int | None = None,
    ) -> None:
        self.targets, self.keep, self.content, self.budget = targets, keep, content, budget
        self.layers = layers  # the model's layer count, where known: no group holds more
        self.pending: list[tuple[int, dict[int, Tensor]]] = []  # (layer, its kept patterns)
        self.done: list[Scored] = []  # each group scored, in order
        self.size = 1  # layers a group holds: set at the first layer, from its shape
        self.flat = torch.empty(0)  # (B, size · (h + 1), n, n): the group's heads

    def _buffer(self, shape: tuple[int, ...], device: torch.device) -> Tensor:
        """The group's buffer for layers of weights (B, h, n, s): made at the first layer (the
        layers a group holds set from its shape), then reused by every group."""
        B, h, n, s = shape
        if not self.pending and not self.done:
            fits = self.budget // (B * (h + 1) * n * s * 4)
            self.size = max(1, fits if self.layers is None else min(fits, self.layers))
        want = (B, self.size * (h + 1), n, s)
        if self.flat.shape != want:
            self.flat = torch.empty(want, device=device)
        return self.flat

    def place(
        self, layer: int, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> Tensor | None:
        """Where the next layer's weights (B, h, n, s) go in the group's buffer, for the
        attention to write its softmax there (:meth:`headlab.trace.Trace.place`) instead of
        :meth:`__call__` copying them in: float32 on the buffer's device, else None."""
        flat = self._buffer(shape, device)
        if dtype != torch.float32 or flat.device != torch.device(device):
            return None
        at = len(self.pending) * (shape[1] + 1)
        return flat[:, at : at + shape[1]]

    def __call__(self, layer: int, weights: Tensor) -> None:
        w = weights.float()  # (B, h, n, n), scored where the layer ran
        h = w.shape[1]
        flat = self._buffer(w.shape, w.device)
        at = len(self.pending) * (h + 1)  # the heads, then the averaged head
        slot = flat[:, at : at + h]
        if not _same_memory(slot, w):  # unless the attention wrote them there (place)
            slot.copy_(w)
        # the averaged head (scores.averaged_pattern), written in place from the copy just made
        torch.mean(flat[:, at : at + h], dim=1, out=flat[:, at + h])
        heads = range(-1, h) if self.keep is None else [i for l, i in self.keep if l == layer]
        kept = {i: flat[0, at + (h if i < 0 else i)].to("cpu", copy=True) for i in heads}
        self.pending.append((layer, kept))
        if len(self.pending) == self.size:
            self.flush()

    def flush(self) -> None:
        """Score the layers held (none: nothing to do)."""
        if not self.pending:
            return
        h1 = self.flat.shape[1] // self.size  # h + 1
        by_type, offsets, rests = pattern_scores(
            self.flat[:, : len(self.pending) * h1], self.targets, self.content
        )
        # a few numbers a head: kept on the CPU, wherever the weights were scored
        self.done.append(
            Scored(
                {t: v.cpu() for t, v in by_type.items()},
                offsets.cpu(),
                {t: v.cpu() for t, v in rests.items()},
                [kept for _, kept in self.pending],
            )
        )
        self.pending.clear()

    def results(self) -> list[LayerScores]:
        """Every layer's scores, in order (the last group scored first if it is not yet)."""
        self.flush()
        out = []
        for group in self.done:
            h1 = group.offsets.shape[0] // len(group.kept)  # h + 1
            for k, kept in enumerate(group.kept):
                part = slice(k * h1, (k + 1) * h1)
                out.append(
                    LayerScores(
                        {t: v[part] for t, v in group.scores.items()},
                        group.offsets[part],
                        kept,
                        {t: v[part] for t, v in group.rests.items()},
                    )
                )
        return out

    def stacked(self) -> Scored:
        """Every layer's scores as one :class:`Scored` (the groups' joined; one group as it
        is), the last group scored first if it is not yet."""
        self.flush()
        if len(self.done) == 1:
            return self.done[0]
        first = self.done[0]
        return Scored(
            {t: torch.cat([g.scores[t] for g in self.done]) for t in first.scores},
            torch.cat([g.offsets for g in self.done]),
            {t: torch.cat([g.rests[t] for g in self.done]) for t in first.rests},
            [kept for g in self.done for kept in g.kept],
        )


def _same_memory(a: Tensor, b: Tensor) -> bool:
    """Whether a and b are the same view of the same memory."""
    return (
        a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.device == b.device
    )


def unused_seed(seed: int | None, where: str) -> None:
    """A DeprecationWarning where a caller passed ``seed`` to ``where``, which no longer reads
    it: every score is a function of the model's weights on the probe, and a probe's random
    tokens are seeded where it is built (:func:`headlab.measure.build_probe`'s ``seed``)."""
    if seed is not None:
        warnings.warn(
            f"{where}(seed=…) changes nothing and will be removed: every score is a function "
            "of the model's weights on the probe; seed a random probe where it is built "
            "(build_probe(…, seed=…))",
            DeprecationWarning,
            stacklevel=3,
        )


def analyse(
    model: Transformer,
    probe: Probe,
    seed: int | None = None,
    content: bool = True,
    keep: Keep = None,
    progress: Callable[[int, int], None] | None = None,
    syntactic: SyntacticScores | None = None,
    floors: Floors | None = None,
    label_syntactic: bool = False,
    averaged_floors: Floors | None = None,
    retrieval: RetrievalScores | None = None,
) -> HeadReport:
    """Run ``model`` on ``probe`` and score and label every (layer, head) and each layer's
    averaged head: the one head analysis the CLI, the server and the experiments call.

    The probe's targets are built once, with ``causal`` from ``model.config`` (never guessed
    from the weights), and kept for another call on the same probe
    (:func:`headlab.heads.targets.probe_targets`). Every score comes from the one forward on
    the probe, the content score included; ``content=False`` leaves "content" out. ``seed``
    changes nothing and is deprecated (a DeprecationWarning when given; :func:`unused_seed`).
    The rare-word score needs the ``wordfreq`` package (``headlab[syntax]``) and a text probe;
    ``syntactic`` gives each head's margin over the offset baseline on its best relation
    (:meth:`headlab.heads.syntax.SyntaxReport.margins`), measured on a parsed text, reported
    among each head's scores; it takes part in the labels only with ``label_syntactic`` (by
    default a head's label is the same whether or not the syntactic score was asked for).
    Each layer's weights are written into a group's buffer as that layer runs
    (:func:`headlab.measure.reduce_patterns`), and scored in groups of consecutive layers
    (:class:`LayerGroups`), so the extra memory is one group's copy, at most
    :data:`GROUP_BYTES` or one layer's (B, h + 1, n, n) if larger, plus the patterns kept:
    every head's by default, only ``keep``'s otherwise (``keep=()`` for scores alone).
    ``progress(done, L)`` is called after each layer.
    ``floors`` (:meth:`headlab.heads.baselines.Baselines.floors`) make each label need its
    margin over random weights too, and ``averaged_floors`` each averaged head's label.
    ``retrieval`` (Wu et al.'s scores on the same needle
    probe, :func:`headlab.heads.retrieval.needle_analysis`) joins each head's scores and
    names the heads that exceed 0.1 "retrieval".
    model: a :class:`headlab.model.Transformer` (load it with :mod:`headlab.zoo`); probe: a
    :class:`headlab.measure.Probe` (build it with :func:`headlab.measure.build_probe`).
    """
    unused_seed(seed, "analyse")
    targets = probe_targets(probe, causal=bool(model.config.causal))
    groups = LayerGroups(targets, keep, content, layers=int(model.config.n_layers))
    reduce_patterns(model, probe.tokens, groups, progress, place=groups.place)
    n_kv = getattr(model.config, "n_kv_heads", None)
    return _report(
        probe,
        groups.stacked(),
        keep,
        syntactic,
        n_kv,
        floors,
        label_syntactic,
        averaged_floors,
        retrieval,
    )


def _report(
    probe: Probe,
    layers: Scored,
    keep: Keep,
    syntactic: SyntacticScores | None = None,
    n_kv_heads: int | None = None,
    floors: Floors | None = None,
    label_syntactic: bool = False,
    averaged_floors: Floors | None = None,
    retrieval: RetrievalScores | None = None,
) -> HeadReport:
    """The HeadReport of a probe from its layers' scores (layer-major; averaged heads apart)."""
    L = len(layers.kept)
    h = layers.offsets.shape[0] // L - 1
    scores = {k: v.tolist() for k, v in layers.scores.items()}
    rests = {k: v.tolist() for k, v in layers.rests.items()}
    offsets = layers.offsets.tolist()
    heads = [
        _scored(
            l,
            i,
            scores,
            offsets,
            rests,
            l * (h + 1) + i,
            syntactic,
            floors,
            label_syntactic,
            retrieval,
        )
        for l in range(L)
        for i in range(h)
    ]
    averaged = [
        _scored(l, -1, scores, offsets, rests, l * (h + 1) + h, None, averaged_floors)
        for l in range(L)
    ]
    common: dict[str, Any] = dict(
        probe=probe.name,
        tokens=list(probe.labels),
        ids=probe.tokens[0].tolist(),
        heads=heads,
        averaged=averaged,
        text=probe.text,
        n_kv_heads=n_kv_heads,
        start_token=not bool(probe.movable[:, 0].any()),
        floors=floors,
    )
    if keep is None:
        patterns = torch.stack([torch.stack([k[i] for i in range(h)]) for k in layers.kept])
        avg = torch.stack([k[-1] for k in layers.kept])
        return HeadReport(**common, patterns=patterns, averaged_patterns=avg)
    selected = {(l, i): p for l, k in enumerate(layers.kept) for i, p in k.items()}
    return HeadReport(**common, patterns=None, averaged_patterns=None, selected=selected)
