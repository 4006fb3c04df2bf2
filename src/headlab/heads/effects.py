"""What each head does to the model's output: exact single-head ablations on a probe, batched.

Shape legend
    S   ablated heads (one set each); B probe sequences; n tokens; L layers; h heads per layer
    d   d_model; d_k the per-head width

:func:`ablate_heads` replaces one head's output at a time, before W_O, by its mean over every
position of every probe sequence ("mean", the default: the head says what it says on average,
nothing about this token) or by zeros ("zero", Michel et al. 2019's head mask), and measures

    losses      every position's next-token loss (S, B, n − 1): the loss on a later copy's
                tokens (an induction head's job, Olsson et al. 2022) and on the rows where any
                head type can act are read from it (:meth:`Ablations.loss_effect`)
    induction   every head's induction score (S, L, h) (:func:`headlab.heads.scores.
                induction_score`): what a previous-token head feeds (Olsson et al. 2022)

It is batched twice over: the heads of one layer are ablated side by side along the batch (each
copy of the probe with its own head mask), and only the blocks from the ablated layer on run
again, from the residual stream the clean run left there. SmolLM2's 270 heads cost one clean
forward plus one partial forward per layer (per ``chunk`` heads of it). This is the exact
estimator; :mod:`headlab.heads.attribution` estimates every head's effects at once beside it.

Papers: Michel et al. 2019 (head masks); Olsson et al. 2022 (induction heads and their feeders).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from headlab.devices import input_device, weights_in_place
from headlab.heads.scores import mass_where_possible
from headlab.heads.targets import token_rule_targets
from headlab.measure import Probe, layer_index
from headlab.trace import Trace

Mode = Literal["mean", "zero"]
MODES = ("mean", "zero")
CHUNK = 16  # heads ablated side by side in one partial forward


@dataclass(frozen=True)
class Ablations:
    """Single-head ablations on one probe (see the module docstring)."""

    mode: str  # "mean" or "zero"
    heads: list[tuple[int, int]]  # the ablated heads, in the order of the rows below
    clean_losses: Tensor  # (B, n − 1) next-token loss at every position, nothing ablated
    losses: Tensor  # (S, B, n − 1) the same with head s ablated
    clean_induction: Tensor  # (L, h) every head's induction score, nothing ablated
    induction: Tensor  # (S, L, h) … with head s ablated
    forwards: int  # forward passes run, the clean one included
    model_passes: float  # the same in whole-model equivalents: 1 + Σ_chunks (L − l) / L
    seconds: float  # wall time
    probe_passes: float = 0.0  # model_passes with each ablated copy of the probe counted
    method = "exact"  # beside headlab.heads.attribution's "attribution"

    def index(self, layer: int, head: int) -> int:
        """The row of head ``layer``.``head``; KeyError when it was not ablated."""
        try:
            return self.heads.index((layer, head))
        except ValueError:
            raise KeyError(f"head {layer}.{head} was not ablated") from None

    def loss_effect(self, rows: Tensor) -> Tensor:
        """(S,): the mean loss over ``rows`` (B, n − 1) bool with each head ablated, minus the
        clean mean over the same rows (NaN when no row is marked)."""
        rows = rows.to(self.losses.device)
        if not bool(rows.any()):
            return torch.full((len(self.heads),), float("nan"))
        clean = self.clean_losses[rows].mean()
        return self.losses[:, rows].mean(dim=-1) - clean

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "mode": self.mode,
            "heads": len(self.heads),
            "forwards": self.forwards,
            "model_passes": round(self.model_passes, 2),
            "probe_passes": round(self.probe_passes, 2),
            "seconds": round(self.seconds, 2),
        }


def _losses(model: Any, hidden: Tensor, targets: Tensor) -> Tensor:
    """Next-token loss (·, n − 1) from final hidden states (·, n, d), one sequence's logits at
    a time: S · B · n · V logits at once would not fit for a 49k vocabulary."""
    out = torch.empty(hidden.shape[0], hidden.shape[1] - 1)
    for b in range(hidden.shape[0]):
        logits = model.unembed(hidden[b, :-1]).float()  # (n − 1, V)
        out[b] = F.cross_entropy(logits, targets[b % targets.shape[0]], reduction="none").cpu()
    return out


def _induction(weights: Tensor, target: Tensor, S: int) -> Tensor:
    """Each set's induction scores: weights (S·B, h, n, n), target (B, n, n) → (S, h)."""
    w = weights.float().cpu()
    per_set = w.view(S, -1, *w.shape[1:])  # (S, B, h, n, n)
    return torch.stack([mass_where_possible(per_set[s], target) for s in range(S)])


@dataclass
class _Clean:
    """What the clean run leaves: each layer's input, each head's mean output, the scores."""

    resid: list[Tensor]  # L × (B, n, d)
    means: list[Tensor]  # L × (h, d_k): head_out averaged over every position
    induction: Tensor  # (L, h)
    losses: Tensor  # (B, n − 1)


def clean_run(model: Any, tokens: Tensor, target: Tensor) -> _Clean:
    """The unablated run of ``tokens`` (B, n): each layer's input, each head's mean output, every
    head's induction score on ``target`` (B, n, n), every position's next-token loss."""
    L, h = model.config.n_layers, model.config.n_heads
    resid: list[Tensor] = [torch.empty(0)] * L
    means: list[Tensor] = [torch.empty(0)] * L
    induction = torch.zeros(L, h)

    def reduce(name: str, value: Tensor) -> None:
        l = layer_index(name)
        if name.endswith("resid_pre"):
            resid[l] = value
        elif name.endswith("head_out"):
            means[l] = value.float().mean(dim=(0, 2))  # (B, h, n, d_k) → (h, d_k)
        else:
            induction[l] = _induction(value, target, 1)[0]

    trace = Trace(only=("resid_pre", "head_out", "weights"), reduce=reduce)
    hidden = model.hidden_states(tokens, trace=trace)  # (B, n, d)
    return _Clean(resid, means, induction, _losses(model, hidden, tokens[:, 1:]))


def this_thread(hook: Callable[..., Any]) -> Callable[..., Any]:
    """``hook`` acting only in the thread that made it: a module's hooks are seen by every
    thread's forward, and the server answers requests on one shared model from several
    threads, so another request's forward must pass through unchanged (a hook returning None
    leaves a module's input or output as it is)."""
    owner = threading.get_ident()

    def guarded(*args: Any) -> Any:
        return hook(*args) if threading.get_ident() == owner else None

    return guarded


@contextmanager
def mean_fill(block: Any, ablated: Tensor, means: Tensor, B: int) -> Iterator[None]:
    """While inside, the layer's output gains W_O,h · mean_h for each head h that ``ablated``
    (S, h) zeroes in set s: with the head mask's zeros, the head's output becomes its mean."""
    attn, (h, d_k) = block.attn, means.shape
    with weights_in_place(block):  # W_O where accelerate offloaded it, for this product alone
        w_o = attn.W_O.weight  # (d, h · d_k)
        per_head = torch.einsum("dhk,hk->hd", w_o.view(-1, h, d_k), means.to(w_o))  # (h, d)
        delta = (ablated.to(w_o) @ per_head).repeat_interleave(B, dim=0)  # (S·B, d)

    def add(module: Any, inputs: Any, output: Tensor) -> Tensor:
        return output + delta[:, None, :]

    handle = attn.register_forward_hook(this_thread(add))
    try:
        yield
    finally:
        handle.remove()


def _from_layer(
    model: Any,
    clean: _Clean,
    layer: int,
    heads: list[int],
    mode: str,
    tokens: Tensor,
    target: Tensor,
) -> tuple[Tensor, Tensor]:
    """Ablate each of ``heads`` of ``layer`` in its own copy of the probe and run the blocks
    from ``layer`` on: ``(losses (S, B, n − 1), induction (S, L, h))``."""
    L, h = model.config.n_layers, model.config.n_heads
    S, B = len(heads), tokens.shape[0]
    ablated = torch.zeros(S, h)
    ablated[torch.arange(S), torch.tensor(heads)] = 1.0
    device = clean.resid[layer].device
    keep = (1 - ablated).repeat_interleave(B, dim=0).to(device, clean.resid[layer].dtype)
    induction = clean.induction.repeat(S, 1, 1)  # earlier layers: untouched

    def reduce(name: str, weights: Tensor) -> None:
        induction[:, layer_index(name)] = _induction(weights, target, S)

    trace = Trace(only=("weights",), reduce=reduce)
    x = clean.resid[layer].repeat(S, 1, 1)  # (S·B, n, d)
    fill = (
        mean_fill(model.blocks[layer], ablated, clean.means[layer], B) if mode == "mean" else None
    )
    with fill or _nothing():
        for l in range(layer, L):
            mask = keep if l == layer else None
            x = model.blocks[l](x, trace.scope(f"blocks.{l}"), mask, None, model.rotary)
    hidden = model.final_norm(x)
    losses = _losses(model, hidden, tokens[:, 1:]).view(S, B, -1)
    return losses, induction


@contextmanager
def _nothing() -> Iterator[None]:
    yield


@torch.inference_mode()
def ablate_heads(
    model: Any,
    probe: Probe,
    heads: list[tuple[int, int]] | None = None,
    mode: Mode = "mean",
    chunk: int = CHUNK,
    progress: Callable[[int, int], None] | None = None,
) -> Ablations:
    """Ablate each of ``heads`` (default: every head) alone on ``probe`` and measure every
    position's next-token loss and every head's induction score (module docstring).

    model: a causal :class:`headlab.model.Transformer` (next-token loss needs one); the heads
    of a layer go ``chunk`` at a time, side by side along the batch. ``progress(done, total)``
    counts the heads ablated: before the first and after each chunk."""
    if mode not in MODES:
        raise ValueError(f"ablation mode {mode!r}: valid modes are {', '.join(MODES)}")
    if not model.config.causal:
        raise ValueError("ablation evidence measures next-token loss: it needs a causal model")
    L, h = model.config.n_layers, model.config.n_heads
    every = [(l, i) for l in range(L) for i in range(h)]
    heads = every if heads is None else sorted(set(heads))
    start = time.perf_counter()
    tokens = probe.tokens.to(input_device(model))
    target = token_rule_targets(probe.tokens, causal=True)[0]  # (B, n, n)
    clean = clean_run(model, tokens, target)
    losses, induction, forwards, passes, copies = [], [], 1, 1.0, 1.0
    done = 0
    if progress is not None:
        progress(0, len(heads))
    for layer in sorted({l for l, _ in heads}):
        mine = [i for l, i in heads if l == layer]
        for part in range(0, len(mine), chunk):
            out = _from_layer(model, clean, layer, mine[part : part + chunk], mode, tokens, target)
            losses.append(out[0])
            induction.append(out[1])
            forwards, passes = forwards + 1, passes + (L - layer) / L
            copies += len(mine[part : part + chunk]) * (L - layer) / L
            done += len(mine[part : part + chunk])
            if progress is not None:
                progress(done, len(heads))
    empty = torch.zeros(0, *clean.losses.shape), torch.zeros(0, L, h)
    return Ablations(
        mode,
        heads,
        clean.losses,
        torch.cat(losses) if losses else empty[0],
        clean.induction,
        torch.cat(induction) if induction else empty[1],
        forwards,
        passes,
        time.perf_counter() - start,
        copies,
    )
