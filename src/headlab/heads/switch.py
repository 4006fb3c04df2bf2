"""Switch a set of heads off together and watch: the probe run intact and run again without them,
side by side.

Shape legend
    B   probe sequences; n tokens; L layers; h heads per layer; k predictions kept per position
    d_k the per-head width

:func:`switch_off` runs a causal model on a probe twice. The second run switches every head of
the set off at once, as :mod:`headlab.heads.effects` ablates one: before W_O, the head's output
is replaced by

    mean    its average over every position of every sequence of the probe in the intact run
            (the head still says what it says on average, nothing about this token)
    zero    zeros (Michel et al. 2019's head mask)

Each run keeps

    predictions   the k likeliest next tokens at every position and their probabilities
    losses        every position's next-token loss (B, n − 1), read over the rows of the repeat
                  (a query whose token occurred before: where an induction head can act,
                  :func:`headlab.heads.evidence.loss_rows`) and over every row
    weights       every head's attention pattern (L, B, h, n, n)
    induction     every head's induction score (L, h) (what a previous-token head feeds)

:class:`SwitchGraph` is the same two runs as a module of tensors in and out, with no Python
branch on their values (which heads, which mode): :func:`switch_off` runs it, and the static
site exports it to ONNX (:mod:`headlab.site`), so the browser's numbers are these.

For one head the losses and induction scores are those of
:func:`headlab.heads.effects.ablate_heads`, which ablates heads one at a time. Here a set goes at
once, each head's mean taken from the intact run, so a head downstream of another switched off
is replaced by what it said when the model was whole.

Papers: Michel et al. 2019 (head masks; "many heads can go"); Olsson et al. 2022 (an induction
head needs its previous-token head).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from headlab.ablation import full_mask
from headlab.devices import input_device
from headlab.heads.effects import MODES, Mode, mean_fill
from headlab.heads.scores import mass_where_possible
from headlab.heads.targets import token_rule_targets
from headlab.measure import Probe, layer_index
from headlab.trace import Trace

TOP_K = 5  # next-token predictions kept per position


@dataclass(frozen=True)
class Run:
    """One run of the probe (intact, or with the heads switched off)."""

    top_ids: Tensor  # (B, n, k) the k likeliest next tokens after each position, likeliest first
    top_probs: Tensor  # (B, n, k) their probabilities
    losses: Tensor  # (B, n − 1) next-token loss at every position
    weights: Tensor  # (L, B, h, n, n) every head's attention pattern, float32
    induction: Tensor  # (L, h) every head's induction score

    def loss(self, rows: Tensor) -> float:
        """The mean loss over ``rows`` (B, n − 1) bool (NaN when none is marked)."""
        return float(mean_over(self.losses, rows.to(self.losses.device)))


def mean_over(losses: Tensor, rows: Tensor) -> Tensor:
    """The mean of ``losses`` (…, B, n − 1) over the positions ``rows`` (B, n − 1) bool marks
    → (…,), NaN where none is marked (0 / 0; no branch on the values, so it traces)."""
    kept = torch.where(rows, losses, 0.0).sum(dim=(-2, -1))  # (…,)
    return kept / rows.sum()


@dataclass(frozen=True)
class SwitchedOff:
    """The probe run intact and with ``heads`` switched off (module docstring)."""

    mode: str  # "mean" or "zero"
    heads: list[tuple[int, int]]  # the heads switched off, sorted
    intact: Run
    off: Run
    repeat_rows: Tensor  # (B, n − 1) bool: the rows of the repeat (a query seen before)

    def losses(self) -> dict[str, dict[str, float] | None]:
        """Mean loss on the repeat's rows and on every row of every sequence, intact and
        switched off, and how many rows it is over (the repeat is None for a probe that repeats
        nothing)."""
        every = torch.ones_like(self.repeat_rows)
        out: dict[str, dict[str, float] | None] = {}
        for name, rows in (("repeat", self.repeat_rows), ("all", every)):
            if not bool(rows.any()):
                out[name] = None
                continue
            intact, off, count = self.intact.loss(rows), self.off.loss(rows), int(rows.sum())
            out[name] = {"intact": intact, "off": off, "rise": off - intact, "rows": count}
        return out

    def to_dict(self, token_strings: Callable[[list[int]], list[str]]) -> dict[str, Any]:
        """JSON: the losses (over every sequence), and of the first sequence each position's
        predictions in both runs (``token_strings`` turns ids into display labels), losses and
        patterns; the induction scores."""

        def run(r: Run) -> dict[str, Any]:
            ids = r.top_ids[0].tolist()  # (n, k)
            return {
                "predictions": [
                    [
                        {"id": i, "token": t, "p": round(float(p), 4)}
                        for i, t, p in zip(row, token_strings(row), probs, strict=True)
                    ]
                    for row, probs in zip(ids, r.top_probs[0].tolist(), strict=True)
                ],
                "losses": [round(float(x), 4) for x in r.losses[0]],
                "induction": r.induction.numpy().round(4).tolist(),
                "weights": r.weights[:, 0].numpy().round(4).tolist(),  # (L, h, n, n)
            }

        losses = {
            k: None if v is None else {name: round(x, 4) for name, x in v.items()}
            for k, v in self.losses().items()
        }
        return {
            "sequences": int(self.repeat_rows.shape[0]),  # the losses count them all
            "mode": self.mode,
            "off": [list(pair) for pair in self.heads],
            "loss": losses,
            "repeat_rows": self.repeat_rows[0].tolist(),
            "intact": run(self.intact),
            "switched_off": run(self.off),
        }


@torch.inference_mode()
def switch_off(
    model: Any, probe: Probe, heads: Iterable[tuple[int, int]], mode: Mode = "mean", k: int = TOP_K
) -> SwitchedOff:
    """Run ``probe`` on ``model`` intact and with every head of ``heads`` switched off together
    (``mode`` "mean" or "zero", as :func:`headlab.heads.effects.ablate_heads` ablates one), and
    keep each run's top-``k`` next-token predictions, losses, patterns and induction scores.

    model: a causal :class:`headlab.model.Transformer`; heads: (layer, head) pairs."""
    if mode not in MODES:
        raise ValueError(f"switch-off mode {mode!r}: valid modes are {', '.join(MODES)}")
    if not model.config.causal:
        raise ValueError(
            "switching heads off shows next-token predictions: it needs a causal model"
        )
    L, h = model.config.n_layers, model.config.n_heads
    heads = sorted({(int(l), int(i)) for l, i in heads})
    mask = full_mask(L, h, heads)  # ValueError naming a head the model does not have
    if not 1 <= k <= model.config.vocab_size:
        raise ValueError(f"k = {k}: keep 1 to {model.config.vocab_size} predictions a position")
    tokens = probe.tokens.to(input_device(model))
    mean = torch.tensor(1.0 if mode == "mean" else 0.0)
    top_ids, top_probs, losses, weights, induction, repeat_rows, _ = SwitchGraph(model, k)(
        tokens, 1 - mask, mean
    )
    intact, off = (
        Run(top_ids[r], top_probs[r], losses[r], weights[r], induction[r]) for r in range(2)
    )
    return SwitchedOff(mode, heads, intact, off, repeat_rows.cpu())


class SwitchGraph(nn.Module):
    """:func:`switch_off`'s two runs as a module of tensors in and out, with no Python branch on
    their values: the static site exports it (``torch.onnx.export``, :mod:`headlab.site`) for
    any number of tokens, so the browser shows these numbers.

    forward(tokens (B, n) int64, off (L, h) float (1 at each head switched off, else 0), mean
    () float (1: each replaced by its mean over the probe, 0: by zeros)) → for the intact run
    and the switched-off one, stacked on a first axis of 2:

        top_ids (2, B, n, k) int64, top_probs (2, B, n, k)   the likeliest next tokens
        losses (2, B, n − 1)                                 every position's next-token loss
        weights (2, L, B, h, n, n) float32                   every head's pattern
        induction (2, L, h)                                  every head's induction score

    and repeat_rows (B, n − 1) bool (the rows of the repeat: a query seen before, as
    :func:`headlab.heads.evidence.loss_rows` marks them), loss (2, 2): each run's mean loss
    on the repeat's rows and on every row (:func:`mean_over`; NaN for no row).

    Each switched-off head's mean is its intact output averaged over every position of every
    sequence, from the intact run of the same forward."""

    def __init__(self, model: nn.Module, k: int = TOP_K) -> None:
        super().__init__()
        self.model, self.k = model, k

    def forward(
        self, tokens: Tensor, off: Tensor, mean: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        target = token_rule_targets(tokens.cpu(), causal=True)[0]  # (B, n, n)
        intact, means = _run(self.model, tokens, target, self.k)
        off = off.to(means[0])
        with _fills(self.model, off * mean.to(off), means, tokens.shape[0]):
            switched, _ = _run(self.model, tokens, target, self.k, 1 - off)
        repeat_rows = (target.sum(-1) > 0)[:, :-1]  # (B, n − 1): Targets.induction_rows
        every = torch.ones_like(repeat_rows)
        runs = [intact, switched]
        loss = torch.stack(
            [
                torch.stack([mean_over(r.losses, repeat_rows), mean_over(r.losses, every)])
                for r in runs
            ]
        )  # (2, 2)
        return (
            torch.stack([r.top_ids for r in runs]),
            torch.stack([r.top_probs for r in runs]),
            torch.stack([r.losses for r in runs]),
            torch.stack([r.weights for r in runs]),
            torch.stack([r.induction for r in runs]),
            repeat_rows,
            loss,
        )


def _run(
    model: Any, tokens: Tensor, target: Tensor, k: int, mask: Tensor | None = None
) -> tuple[Run, list[Tensor]]:
    """One forward of ``tokens`` (B, n) with the head mask (L, h): the :class:`Run` and each
    layer's head outputs averaged over every position, L × (h, d_k)."""
    L = model.config.n_layers
    weights: list[Tensor] = [torch.empty(0)] * L
    means: list[Tensor] = [torch.empty(0)] * L

    def keep(name: str, value: Tensor) -> None:
        l = layer_index(name)
        if name.endswith("head_out"):
            means[l] = value.float().mean(dim=(0, 2))  # (B, h, n, d_k) → (h, d_k)
        else:
            weights[l] = value.float().cpu()  # (B, h, n, n)

    trace = Trace(only=("head_out", "weights"), reduce=keep)
    hidden = model.hidden_states(tokens, trace=trace, head_mask=mask)  # (B, n, d)
    top_ids, top_probs, losses = [], [], []
    for b in range(tokens.shape[0]):  # one sequence's logits at a time: V can be 262k
        logits = model.logits(hidden[b]).float()  # (n, V)
        top = logits.softmax(dim=-1).topk(k, dim=-1)
        top_ids.append(top.indices.cpu())
        top_probs.append(top.values.cpu())
        # cross_entropy's own steps (log_softmax, then the target's entry negated), written
        # out: the same numbers, and shapes the ONNX exporter declares right ((n − 1), where
        # it declares F.cross_entropy's unreduced loss a scalar)
        logp = logits[:-1].log_softmax(dim=-1)  # (n − 1, V)
        losses.append(-logp.gather(-1, tokens[b, 1:, None])[:, 0].cpu())
    induction = torch.stack([mass_where_possible(w, target) for w in weights])  # (L, h)
    run = Run(
        torch.stack(top_ids),
        torch.stack(top_probs),
        torch.stack(losses),
        torch.stack(weights),
        induction,
    )
    return run, means


@contextmanager
def _fills(model: Any, ablated: Tensor, means: list[Tensor], B: int) -> Iterator[None]:
    """While inside, each head's output gains ``ablated`` (L, h) times its intact mean
    (``means``: L × (h, d_k)), added after W_O as ablate_heads adds it (the head mask zeroes
    the head): 1 at a head switched off by its mean, 0 elsewhere (every head when zeroed),
    where the layer's output gains exactly 0."""
    with ExitStack() as stack:
        for layer in range(model.config.n_layers):
            here = ablated[layer : layer + 1]  # (S = 1, h)
            stack.enter_context(mean_fill(model.blocks[layer], here, means[layer], B))
        yield
