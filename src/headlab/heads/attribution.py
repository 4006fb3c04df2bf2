"""Every head's ablation effect at once, from a few forwards and backwards: attribution patching.

Shape legend
    S   heads (every head of the model, layer-major); B probe sequences; n tokens
    L   layers; h heads per layer; d_k the per-head width

:func:`headlab.heads.effects.ablate_heads` runs the model again for each ablated head. Here a
forward and one backward per metric give every head's effect together: for a metric m (the mean
next-token loss over some rows, or a head's induction score) and head s,

    Δm_s ≈ Σ_{b, q} (ā_s − a_s[b, q]) · ∂m / ∂a_s[b, q]

where a_s (B, n, d_k) is the head's output before W_O and ā_s what the ablation puts there (its
mean over every position of every probe sequence for "mean", 0 for "zero"), as in
:func:`ablate_heads`: Nanda 2023's attribution patching, the gradient taken on the unablated run
(``path=(0.0,)``, the default). It ranks heads well where the model is close to linear in a
head's output and misses what a head does through later layers' softmaxes: a previous-token
head's effect through the induction heads it feeds (SmolLM2's 16.0: exact 0.28 nats, estimated
0.02), a head whose removal moves a sink.

``steps=k`` integrates the gradient along a path instead (integrated gradients, Sundararajan
et al. 2017), j = 0 being the plain term, so ``steps=1`` is plain attribution patching:

    Δm_s ≈ (1/k) Σ_{j=0}^{k−1} Σ_{b, q} (ā_s − a_s[b, q]) · ∂m / ∂a_s  at the point j/k

``per="head"``: the point moves head s alone, a_s + (j/k)(ā_s − a_s), every other head clean
(:func:`own_paths`); ``per="layer"``: it moves every head of s's layer together, the other
layers clean (:func:`layer_paths`; Marks et al. 2024 integrate a layer's nodes together). Each
point beyond the first is a copy of the probe run from the residual stream the clean run left
at that layer (copies side by side along the batch), one backward per metric: k − 1 copies per
head on a head's own path, more than exact ablation's one partial forward per head; k − 1 per
layer on the layer's. Moving every head at once (``path``, one joint path) fails on SmolLM2.

Measured by ``benchmarks/bench_estimate.py`` on the repeat probe (loss over every token), against
exact mean ablation of every head: the plain estimate ranks the default model's 16 heads with
Spearman ρ 0.62 and SmolLM2's 20 heads with the largest exact effects with 0.47 (its
previous-token head 16.0 acts through later heads' softmax: exact 0.28 nats, estimated 0.02;
on random tokens repeated, ``--probe random-repeat``: 0.71 and 0.44);
two points per layer rank SmolLM2's all and top 20 with 0.94 and 0.83 in 0.15–0.30 of exact
ablation's time, head 16.0 first; three points per layer do worse (0.83, 0.77).

So the estimate the evidence uses has two stages (:mod:`headlab.heads.estimate`): an estimate
(the layer path, or the plain one by size) ranks every head, and exact ablation of the heads it
ranks first gives their figures.

:class:`Attributions` answers as :class:`headlab.heads.effects.Ablations` does
(``index``, ``loss_effect``, ``induction``, ``clean_induction``), for the row sets and the
induction heads it was asked about.

Papers: Nanda 2023 (attribution patching); Syed, Rager and Conmy 2023; Sundararajan, Taly and
Yan 2017 (integrated gradients); Marks et al. 2024 (integrated gradients over a layer's nodes);
Kramár et al. 2024 (AtP*, where attribution patching fails); Michel et al. 2019.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from headlab.devices import input_device
from headlab.heads.effects import MODES, Mode, clean_run, this_thread
from headlab.heads.scores import mass_where_possible
from headlab.heads.targets import token_rule_targets
from headlab.measure import Probe, layer_index
from headlab.trace import Trace

# where on the path from each head's output (α = 0) to its ablated value (α = 1) the gradient is
# taken and averaged; (0.0,): plain attribution patching, one forward (module docstring)
PATH = (0.0,)
# points on each head's own path (module docstring): 1 is plain attribution patching
STEPS = 1
COPIES = 16  # (head, point) copies of the probe run side by side in one partial forward
Per = Literal["head", "layer"]
PER = ("head", "layer")  # whose path the points lie on: each head's own, or its layer's


@dataclass(frozen=True)
class Attributions:
    """First-order ablation effects of every head on one probe (module docstring)."""

    mode: str  # "mean" or "zero"
    heads: list[tuple[int, int]]  # every head, layer-major: the rows of the effects below
    row_sets: list[tuple[Tensor, Tensor]]  # (rows (B, n − 1) bool, loss rise (S,)) per metric
    clean_induction: Tensor  # (L, h) every head's induction score, nothing ablated
    induction: Tensor  # (S, L, h) estimated induction scores with head s ablated; NaN: not asked
    forwards: int  # forward passes run (one per step of the path)
    backwards: int  # backward passes run (one per metric and step)
    seconds: float  # wall time
    steps: int = 1  # points on each head's own path (1: plain attribution patching)
    model_passes: float = 1.0  # forwards in whole-model equivalents, partial ones by share
    per: str = "head"  # the path of steps > 1: each head's own, or its layer's heads together
    probe_passes: float = 1.0  # model_passes with each copy of the probe counted
    method = "attribution"

    def index(self, layer: int, head: int) -> int:
        """The row of head ``layer``.``head``; KeyError when the model has no such head."""
        try:
            return self.heads.index((layer, head))
        except ValueError:
            raise KeyError(f"the model has no head {layer}.{head}") from None

    def loss_effect(self, rows: Tensor) -> Tensor:
        """(S,): the estimated rise of the mean loss over ``rows`` (B, n − 1) bool with each
        head ablated (NaN when no row is marked); ``rows`` must be one of the row sets the
        estimate was made for (a KeyError otherwise: each needs its own backward)."""
        if not bool(rows.any()):
            return torch.full((len(self.heads),), float("nan"))
        for known, effect in self.row_sets:
            if known.shape == rows.shape and bool((known == rows.to(known.device)).all()):
                return effect
        raise KeyError("no estimate for these rows: pass them to attribute_heads(rows=…)")

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "mode": self.mode,
            "heads": len(self.heads),
            "forwards": self.forwards,
            "backwards": self.backwards,
            "steps": self.steps,
            "per": self.per,
            "model_passes": round(self.model_passes, 2),
            "probe_passes": round(self.probe_passes, 2),
            "seconds": round(self.seconds, 2),
        }


@dataclass
class _Run:
    """One forward with every head moved a share α toward its ablated value, kept with its
    graph: what each head is moved by, the moved outputs, the patterns, per-position losses."""

    deltas: list[Tensor]  # L × (B, n, h, d_k) ablated value − output, detached
    moved: list[Tensor]  # L × (B, n, h·d_k) W_O's input after the move (in the graph)
    weights: dict[int, Tensor]  # layer → (B, h, n, n) patterns, for the layers asked about
    losses: Tensor  # (B, n − 1) next-token loss (in the graph)


def _mover(run: _Run, l: int, h: int, alpha: float, mode: str) -> Any:
    """W_O's forward pre-hook on layer ``l``: moves its (B, n, h·d_k) input a share ``alpha``
    toward the ablated value (each head's mean over the probe, or 0) and keeps both."""

    def move(module: Any, args: tuple[Tensor, ...]) -> tuple[Tensor]:
        x = args[0]
        ablated = x.detach().mean(dim=(0, 1), keepdim=True) if mode == "mean" else 0 * x.detach()
        moved = x + alpha * (ablated - x)
        run.deltas[l] = (ablated - x.detach()).float().unflatten(-1, (h, -1))
        run.moved[l] = moved
        return (moved,)

    return move


def _forward(model: Any, tokens: Tensor, layers: set[int], alpha: float, mode: str) -> _Run:
    L, h = model.config.n_layers, model.config.n_heads
    run = _Run([torch.empty(0)] * L, [torch.empty(0)] * L, {}, torch.empty(0))

    def keep(name: str, value: Tensor) -> None:
        if layer_index(name) in layers:
            run.weights[layer_index(name)] = value

    # the graph starts at the embedding: no parameter needs a gradient
    start = this_thread(lambda m, i, out: out.detach().requires_grad_())
    hooks = [model.embed.register_forward_hook(start)]
    hooks += [
        b.attn.W_O.register_forward_pre_hook(this_thread(_mover(run, l, h, alpha, mode)))
        for l, b in enumerate(model.blocks)
    ]
    try:
        trace = Trace(only=("weights",), detach=False, reduce=keep)
        hidden = model.hidden_states(tokens, trace=trace)  # (B, n, d)
    finally:
        for hook in hooks:
            hook.remove()
    logits = model.unembed(hidden[:, :-1]).float()  # (B, n − 1, V)
    losses = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten(), reduction="none")
    run.losses = losses.view(tokens.shape[0], -1)
    return run


@torch.no_grad()
def _induction(model: Any, tokens: Tensor, target: Tensor) -> Tensor:
    """(L, h): every head's induction score on the unablated probe."""
    L, h = model.config.n_layers, model.config.n_heads
    scores = torch.zeros(L, h)

    def keep(name: str, value: Tensor) -> None:
        scores[layer_index(name)] = mass_where_possible(value.float().cpu(), target)

    model.hidden_states(tokens, trace=Trace(only=("weights",), reduce=keep))
    return scores


def _first_order(metric: Tensor, run: _Run, layers: int) -> Tensor:
    """(layers, h): Σ_{b,q} Δa · ∂metric/∂a for the heads of the first ``layers`` layers."""
    grads = torch.autograd.grad(metric, run.moved[:layers], retain_graph=True, allow_unused=True)
    rows = []
    for delta, g in zip(run.deltas, grads, strict=False):
        rows.append(
            torch.zeros(delta.shape[2])
            if g is None
            else torch.einsum("bnhk,bnhk->h", delta, g.float().unflatten(-1, delta.shape[2:])).cpu()
        )
    return torch.stack(rows) if rows else torch.zeros(0, run.deltas[0].shape[2])


def attribute_heads(
    model: Any,
    probe: Probe,
    rows: Sequence[Tensor],
    induction_heads: Sequence[tuple[int, int]] = (),
    mode: Mode = "mean",
    path: Sequence[float] = PATH,
    steps: int = STEPS,
    per: Per = "head",
) -> Attributions:
    """Every head's ablation effect on the mean next-token loss over each of ``rows``
    ((B, n − 1) bool each) and on the induction score of each of ``induction_heads``, to first
    order at the points of ``path`` (module docstring): a forward per point of ``path`` and a
    backward per metric at each.

    model: a causal :class:`headlab.model.Transformer`; ``mode`` as for
    :func:`headlab.heads.effects.ablate_heads`. Estimated induction scores are clipped to
    [0, 1], the range of the score. ``steps`` > 1 averages each head's gradient over the
    points α = j / steps (j = 0 … steps − 1) of its own path (``per="head"``,
    :func:`own_paths`) or of its layer's path, every head of the layer moved together
    (``per="layer"``, :func:`layer_paths`); the plain estimate is the first point, so
    ``steps=1`` is plain attribution patching."""
    _check_arguments(model, mode, path, steps, per)
    start = time.perf_counter()
    L, h = model.config.n_layers, model.config.n_heads
    tokens = probe.tokens.to(input_device(model))
    target = token_rule_targets(probe.tokens, causal=True)[0]  # (B, n, n)
    marked: list[Tensor] = []  # each distinct row set once: each costs a backward per step
    for r in rows:
        if bool(r.any()) and not any(torch.equal(r.cpu(), m) for m in marked):
            marked.append(r.cpu())
    clean = _induction(model, tokens, target) if induction_heads else torch.zeros(L, h)
    with torch.inference_mode(False), torch.enable_grad():
        effects, changes = _joint_path(model, tokens, marked, induction_heads, target, path, mode)
    metrics = len(marked) + len(induction_heads)
    forwards, backwards = len(path) + bool(induction_heads), len(path) * metrics
    passes = probe_passes = float(forwards)
    if steps > 1:
        along = own_paths if per == "head" else layer_paths
        with torch.inference_mode(False), torch.enable_grad():
            more = along(model, tokens, marked, induction_heads, target, mode, steps)
        effects = (effects + more.loss) / steps
        changes = (changes + more.induction) / steps
        forwards, backwards = forwards + more.forwards + 1, backwards + more.backwards
        passes += 1 + more.passes
        probe_passes += 1 + more.probe_passes
    induction = torch.full((L * h, L, h), float("nan"))
    for k, (l, i) in enumerate(induction_heads):
        induction[:, l, i] = (clean[l, i] + changes[k].flatten()).clamp(0.0, 1.0)
    every = [(l, i) for l in range(L) for i in range(h)]
    return Attributions(
        mode,
        every,
        list(zip(marked, effects, strict=True)),
        clean,
        induction,
        forwards,
        backwards,
        time.perf_counter() - start,
        steps,
        passes,
        per,
        probe_passes,
    )


def _check_arguments(model: Any, mode: str, path: Sequence[float], steps: int, per: str) -> None:
    """One line saying what is wrong with :func:`attribute_heads`'s arguments, and what is valid."""
    if mode not in MODES:
        raise ValueError(f"ablation mode {mode!r}: valid modes are {', '.join(MODES)}")
    if steps < 1 or (steps > 1 and tuple(path) != PATH):
        raise ValueError(
            f"steps must be a whole number ≥ 1 (got {steps}), and more than one "
            "only with the plain path (0.0,)"
        )
    if per not in PER:
        raise ValueError(f"per {per!r}: a path per 'head' or per 'layer'")
    if not model.config.causal:
        raise ValueError("ablation evidence measures next-token loss: it needs a causal model")


def _joint_path(
    model: Any,
    tokens: Tensor,
    marked: Sequence[Tensor],
    induction_heads: Sequence[tuple[int, int]],
    target: Tensor,
    path: Sequence[float],
    mode: str,
) -> tuple[Tensor, Tensor]:
    """The first-order terms averaged over the points of ``path`` (every head moved a share α
    together): ``(loss effects (M, L·h), induction changes (I, L, h))``."""
    L, h = model.config.n_layers, model.config.n_heads
    effects = torch.zeros(len(marked), L * h)
    changes = torch.zeros(len(induction_heads), L, h)
    for alpha in path:
        run = _forward(model, tokens, {l for l, _ in induction_heads}, alpha, mode)
        for k, r in enumerate(marked):
            metric = run.losses[r.to(run.losses.device)].mean()
            effects[k] += _first_order(metric, run, L).flatten() / len(path)
        for k, (l, i) in enumerate(induction_heads):
            score = mass_where_possible(
                run.weights[l][:, i : i + 1].float(), target.to(tokens.device)
            )[0]
            changes[k, :l] += _first_order(score, run, l) / len(path)
    return effects, changes


@dataclass
class _Paths:
    """What :func:`own_paths` and :func:`layer_paths` add: the gradient terms of the points
    α > 0, and their cost."""

    loss: Tensor  # (M, L·h) per row set
    induction: Tensor  # (I, L, h) per induction head asked about
    forwards: int
    backwards: int
    passes: float  # whole-model equivalents: Σ over partial forwards of (L − l) / L
    probe_passes: float = 0.0  # the same with each copy of the probe counted


def own_paths(
    model: Any,
    tokens: Tensor,
    marked: Sequence[Tensor],
    induction_heads: Sequence[tuple[int, int]],
    target: Tensor,
    mode: str,
    steps: int,
) -> _Paths:
    """Σ_{j=1}^{steps−1} Δa_s · ∂m/∂a_s at a_s + (j / steps) Δa_s, every other head clean:
    integrated gradients along each head's own path to its ablated value (Sundararajan et al.
    2017; Marks et al. 2024 use them for circuit nodes), the left Riemann sum's points beyond
    the first (the plain term). Each (head, point) is a copy of the probe: the copies of a
    layer's heads run side by side, :data:`COPIES` at a time, from the residual stream the
    clean run left at that layer (a head moves nothing before its layer), and one backward per
    metric gives every copy's gradient. ``marked``: row sets (B, n − 1); ``target``: the
    induction target (B, n, n)."""
    h = model.config.n_heads
    points = [(i, j / steps) for i in range(h) for j in range(1, steps)]
    shares = []
    for part in range(0, len(points), COPIES):
        share = torch.zeros(len(points[part : part + COPIES]), h)  # copy → how far each head
        for c, (i, a) in enumerate(points[part : part + COPIES]):
            share[c, i] = a
        shares.append(share)
    return _paths(model, tokens, marked, induction_heads, target, mode, shares)


def layer_paths(
    model: Any,
    tokens: Tensor,
    marked: Sequence[Tensor],
    induction_heads: Sequence[tuple[int, int]],
    target: Tensor,
    mode: str,
    steps: int,
) -> _Paths:
    """Σ_{j=1}^{steps−1} Δa_s · ∂m/∂a_s with every head of s's layer moved the share j / steps
    toward its ablated value together and every other layer clean: integrated gradients along
    one path per layer (Marks et al. 2024 integrate a layer's nodes together), the points
    beyond the first. A layer's steps − 1 points are its copies of the probe, run side by side
    from the residual stream the clean run left there: one copy per layer and point, against
    one per head and point on each head's own path (:func:`own_paths`). Arguments as there."""
    h = model.config.n_heads
    share = torch.tensor([[j / steps] * h for j in range(1, steps)])  # (steps − 1, h)
    shares = [share[part : part + COPIES] for part in range(0, steps - 1, COPIES)]
    return _paths(model, tokens, marked, induction_heads, target, mode, shares)


def _paths(
    model: Any,
    tokens: Tensor,
    marked: Sequence[Tensor],
    induction_heads: Sequence[tuple[int, int]],
    target: Tensor,
    mode: str,
    shares: list[Tensor],
) -> _Paths:
    """For every layer, each (C, h) matrix of ``shares`` run as C copies of the probe moved
    that far (:func:`_copies`), each head's terms summed over the copies that move it."""
    L, h = model.config.n_layers, model.config.n_heads
    with torch.no_grad():
        clean = clean_run(model, tokens, target.to(tokens.device))
    out = _Paths(torch.zeros(len(marked), L, h), torch.zeros(len(induction_heads), L, h), 0, 0, 0)
    for layer in range(L):
        for share in shares:
            terms = _copies(
                model, clean, layer, share, marked, induction_heads, (tokens, target), mode
            )
            moves = (share > 0).float()  # only a moved head's term is on its path
            for k, t in enumerate(terms[: len(marked)]):
                out.loss[k, layer] += (t * moves).sum(0)
            for k, t in enumerate(terms[len(marked) :]):
                out.induction[k, layer] += (t * moves).sum(0)
            out.forwards += 1
            out.backwards += len(terms)
            out.passes += (L - layer) / L
            out.probe_passes += share.shape[0] * (L - layer) / L
    out.loss = out.loss.flatten(1)
    return out


def _copies(
    model: Any,
    clean: Any,
    layer: int,
    share: Tensor,
    marked: Sequence[Tensor],
    induction_heads: Sequence[tuple[int, int]],
    probe: tuple[Tensor, Tensor],
    mode: str,
) -> list[Tensor]:
    """One partial forward of C copies of the probe from ``layer`` on, copy c with each head i
    of ``layer`` moved the share ``share[c, i]`` ((C, h)) toward its ablated value, and per
    metric the term Δa · ∂m/∂a of every head of ``layer`` in every copy → one (C, h) tensor
    per metric (the row sets', then the later induction heads'; 0 for an induction head at or
    before ``layer``). ``probe``: its tokens (B, n) and induction target (B, n, n)."""
    L, h = model.config.n_layers, model.config.n_heads
    tokens, target = probe
    C, (B, n, _) = share.shape[0], clean.resid[layer].shape
    weights: dict[int, Tensor] = {}
    moved: dict[str, Tensor] = {}
    mean = clean.means[layer] if mode == "mean" else torch.zeros_like(clean.means[layer])

    def move(module: Any, args: tuple[Tensor, ...]) -> tuple[Tensor]:
        x = args[0].detach().unflatten(-1, (h, -1))  # (C·B, n, h, d_k): the clean outputs
        moved["delta"] = mean.to(x)[None, None] - x
        a = share.to(x).repeat_interleave(B, dim=0)[:, None, :, None]  # (C·B, 1, h, 1)
        moved["at"] = (x + a * moved["delta"]).requires_grad_()
        return (moved["at"].flatten(-2),)

    def keep(name: str, value: Tensor) -> None:
        weights[layer_index(name)] = value

    handle = model.blocks[layer].attn.W_O.register_forward_pre_hook(this_thread(move))
    trace = Trace(only=("weights",), detach=False, reduce=keep)
    try:
        x = clean.resid[layer].detach().repeat(C, 1, 1)  # (C·B, n, d)
        for l in range(layer, L):
            x = model.blocks[l](x, trace.scope(f"blocks.{l}"), None, None, model.rotary)
    finally:
        handle.remove()
    hidden = model.final_norm(x)
    metrics: list[Tensor | None] = []
    for rows in marked:
        r = rows.to(hidden.device).repeat(C, 1)  # (C·B, n − 1)
        logits = model.unembed(hidden[:, :-1][r]).float()  # (rows, V)
        loss = F.cross_entropy(logits, tokens[:, 1:].repeat(C, 1)[r], reduction="sum")
        metrics.append(loss / rows.sum())
    for l, i in induction_heads:
        if l <= layer:
            metrics.append(None)
            continue
        w = weights[l][:, i].float().view(C, B, n, n).transpose(0, 1)  # (B, C, n, n)
        metrics.append(mass_where_possible(w, target.to(w.device)).sum())
    out = []
    for m in metrics:
        if m is None:
            out.append(torch.zeros(C, h))
            continue
        g = torch.autograd.grad(m, moved["at"], retain_graph=True)[0]  # (C·B, n, h, d_k)
        term = torch.einsum("bnhk,bnhk->bh", g.float(), moved["delta"].float()).view(C, B, h)
        out.append(term.sum(1).cpu())
    return out
