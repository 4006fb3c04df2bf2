"""Composition scores (Elhage et al. 2021): how much one head's output feeds a later head's query,
key or value, read off the weights alone.

Shape legend
    L   layers; h query heads per layer; h_kv key/value heads (groups) per layer
    d   d_model; d_k the per-head width

Row-vector convention (x W), as TransformerLens writes it: for head a,
W_OV^a = W_V^a W_O^a and W_QK^a = W_Q^a W_K^aᵀ, each d × d of rank ≤ d_k. For a head a in an
earlier layer than head b:

    Q-composition   ‖W_OV^a W_QK^b‖_F  / (‖W_OV^a‖_F ‖W_QK^b‖_F)   a's output read by b's queries
    K-composition   ‖W_OV^a W_QK^bᵀ‖_F / (‖W_OV^a‖_F ‖W_QK^b‖_F)   … by b's keys
    V-composition   ‖W_OV^a W_OV^b‖_F  / (‖W_OV^a‖_F ‖W_OV^b‖_F)   … by b's values

as TransformerLens's ``all_composition_scores`` computes them (0 unless a's layer < b's). The
weights are those the residual stream meets, as TransformerLens folds them by default: a pre-norm
block's gain scales the rows of W_Q, W_K, W_V, and for LayerNorm (which removes the mean) those
are centred over d and W_O's output centred too; post-norm and norm-free models keep their
weights. Rotary positions and biases are left out, as TransformerLens leaves them.

Grouped-query models share W_K and W_V among the query heads of a group, which therefore read one
subspace: the K- and V-group scores ‖W_OV^a W_K^g‖_F / (‖W_OV^a‖_F ‖W_K^g‖_F) (and W_V^g) say
how much of head a's output lands in what group g of a later layer reads.

Random matrices of the same shapes also score above 0 (about 1/√d for rank-d_k products in d
dimensions): :func:`random_baseline` draws them, and a pair counts as composing when it
stands K_SD standard deviations above their mean.

Papers: Elhage et al. 2021, "A Mathematical Framework for Transformer Circuits"; TransformerLens
(Nanda and Bloom 2022).
"""

from __future__ import annotations

import functools
import hashlib
import shutil
import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from headlab.devices import weights_in_place
from headlab.files import manifest_problem, new_folder, write_manifest
from headlab.heads.baselines import K_SD

MODES = ("q", "k", "v", "k_group", "v_group")
BASELINE_DRAWS = 200  # random matrix pairs per mode


@dataclass(frozen=True)
class HeadWeights:
    """One layer's per-head weights as the residual stream meets them (see the module
    docstring): W_Q (h, d, d_k), W_K and W_V (h_kv, d, d_k), W_O (h, d_k, d)."""

    W_Q: Tensor
    W_K: Tensor
    W_V: Tensor
    W_O: Tensor


def _read(block: Any, config: Any) -> list[Tensor]:
    """What the scores read of one block, as it stores them: W_Q, W_K, W_V and W_O's weights
    and, for a pre-norm block, its attention norm's gain. The block's weights must be in place
    (:func:`headlab.devices.weights_in_place`)."""
    attn = block.attn
    read = [attn.W_Q.weight, attn.W_K.weight, attn.W_V.weight, attn.W_O.weight]
    if config.norm == "pre":
        read.append(block.norm_attn.weight)
    return [w.detach() for w in read]


def _split(w: Tensor, heads: int) -> Tensor:
    """A projection's weight (heads · d_k, d) as (heads, d, d_k): x @ W[i] is head i's part."""
    return w.view(heads, -1, w.shape[-1]).transpose(1, 2)  # (heads, d, d_k)


def head_weights(model: Any) -> list[HeadWeights]:
    """Each layer's :class:`HeadWeights`, the norm folded in as TransformerLens folds it; a
    model dispatched by accelerate is read one block at a time, each loaded where it was
    offloaded and copied."""
    c = model.config
    h, h_kv = c.n_heads, c.n_kv_heads or c.n_heads
    out = []
    for block in model.blocks:
        with weights_in_place(block):
            read = [w.float().clone() for w in _read(block, c)]
        q, k, v = _split(read[0], h), _split(read[1], h_kv), _split(read[2], h_kv)
        o = read[3].T.reshape(h, -1, c.d_model)  # (h, d_k, d)
        if c.norm == "pre":
            gain = read[4][None, :, None]  # (1, d, 1)
            q, k, v = q * gain, k * gain, v * gain
            if c.norm_kind == "layernorm":  # the norm removes the mean: only centred parts count
                q, k, v = (w - w.mean(dim=1, keepdim=True) for w in (q, k, v))
                o = o - o.mean(dim=-1, keepdim=True)
        out.append(HeadWeights(q, k, v, o))
    return out


def _r(w: Tensor) -> Tensor:
    """A square root of w's Gram matrix: R (N, d_k, d_k) with RᵀR = wᵀw for w (N, d, d_k), so
    ‖w X‖_F = ‖R X‖_F for every X. The R of a QR would do, but a batched QR of d × d_k
    matrices ran 100× slower here than this Cholesky in float64 (an eigendecomposition where
    w is rank-deficient, as a centred d_k = d head is)."""
    gram = w.double().transpose(-1, -2) @ w.double()  # (N, d_k, d_k)
    lower, info = torch.linalg.cholesky_ex(gram)
    r = lower.transpose(-1, -2)
    bad = info != 0
    if bool(bad.any()):
        values, vectors = torch.linalg.eigh(gram[bad])
        r[bad] = values.clamp_min(0).sqrt()[..., :, None] * vectors.transpose(-1, -2)
    return r.float()


def left_factor(W_V: Tensor, W_O: Tensor) -> Tensor:
    """(N, d_k, d) with ‖left · X‖_F = ‖W_V W_O X‖_F for every X; W_V (N, d, d_k), W_O
    (N, d_k, d)."""
    return _r(W_V) @ W_O


def right_factor(A: Tensor, B: Tensor | None = None) -> Tensor:
    """(N, d, d_k) with ‖X · right‖_F = ‖X A Bᵀ‖_F for every X (A alone when B is None)."""
    return A if B is None else A @ _r(B).transpose(-1, -2)


def pair_scores(left: Tensor, right: Tensor) -> Tensor:
    """‖left_a right_b‖_F / (‖left_a‖_F ‖right_b‖_F) for every a, b: (Na, d_k, d) and
    (Nb, d, m) → (Na, Nb)."""
    Na, k, d = left.shape
    Nb, _, m = right.shape
    product = left.reshape(Na * k, d) @ right.permute(1, 0, 2).reshape(d, Nb * m)
    norms = product.view(Na, k, Nb, m).pow(2).sum(dim=(1, 3)).sqrt()  # (Na, Nb)
    left_norm = left.flatten(1).norm(dim=1)  # (Na,)
    right_norm = right.flatten(1).norm(dim=1)  # (Nb,)
    return norms / (left_norm[:, None] * right_norm[None, :]).clamp_min(1e-30)


def _right_factors(w: HeadWeights, group: Tensor) -> dict[str, Tensor]:
    """Each mode's reading side of one layer: q, k, v (h, d, d_k); k_group, v_group (h_kv, ·)."""
    K, V = w.W_K[group], w.W_V[group]  # (h, d, d_k): each query head's K/V head
    return {
        "q": right_factor(w.W_Q, K),  # W_QK = W_Q W_Kᵀ
        "k": right_factor(K, w.W_Q),  # W_QKᵀ = W_K W_Qᵀ
        "v": right_factor(V, w.W_O.transpose(1, 2)),  # W_OV = W_V W_O
        "k_group": right_factor(w.W_K),
        "v_group": right_factor(w.W_V),
    }


@dataclass(frozen=True)
class Composition:
    """Every pair's composition scores and the random-matrix baseline (see the module).

    ``scores[mode]`` is (L, h, L, h) for q, k, v and (L, h, L, h_kv) for the groups, indexed
    [earlier layer, head, later layer, head or group], 0 where the first layer is not earlier.
    ``baseline[mode]`` is (mean, sd) of the same score on random matrices of the same shapes."""

    scores: dict[str, Tensor]
    baseline: dict[str, tuple[float, float]]
    k: float = K_SD
    draws: int = BASELINE_DRAWS
    pairs: int = field(default=0)  # head pairs in different layers

    def floor(self, mode: str) -> float:
        """The least score that counts as composing: the random mean + k · sd."""
        mean, sd = self.baseline[mode]
        return mean + self.k * sd

    def top(self, mode: str, n: int = 10) -> list[dict[str, Any]]:
        """The ``n`` highest-scoring pairs of ``mode``, each with whether it clears the floor."""
        s = self.scores[mode]
        values, flat = s.flatten().topk(min(n, s.numel()))
        out = []
        for value, index in zip(values.tolist(), flat.tolist(), strict=True):
            a, i, b, j = (int(x) for x in torch.unravel_index(torch.tensor(index), s.shape))
            if value <= 0:
                break
            out.append(
                {
                    "from": [a, i],
                    "to": [b, j],
                    "score": round(value, 4),
                    "above_baseline": value >= self.floor(mode),
                }
            )
        return out

    def to_dict(self, n: int = 10) -> dict[str, Any]:
        return {
            "pairs": self.pairs,
            "k": self.k,
            "baseline": {
                m: {
                    "mean": round(a, 4),
                    "sd": round(b, 4),
                    "draws": self.draws,
                    "floor": round(self.floor(m), 4),
                }
                for m, (a, b) in self.baseline.items()
            },
            "top": {m: self.top(m, n) for m in self.scores},
        }


def random_baseline(
    d: int, d_k: int, draws: int = BASELINE_DRAWS, seed: int = 0
) -> dict[str, tuple[float, float]]:
    """Each mode's score on Gaussian matrices of the shapes a head has (W_Q, W_K, W_V d × d_k,
    W_O d_k × d): (mean, sample sd) over ``draws`` pairs. Scores are scale-free, so the entries'
    scale does not matter. Computed once per (d, d_k, draws, seed): the live run asks for it at
    every evaluation."""
    return dict(_random_baseline(d, d_k, draws, seed))


@functools.cache
def _random_baseline(
    d: int, d_k: int, draws: int, seed: int
) -> tuple[tuple[str, tuple[float, float]], ...]:
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> Tensor:
        return torch.randn(draws, *shape, generator=g)

    left = left_factor(rand(d, d_k), rand(d_k, d))
    rights = {
        "q": right_factor(rand(d, d_k), rand(d, d_k)),
        "k": right_factor(rand(d, d_k), rand(d, d_k)),
        "v": right_factor(rand(d, d_k), rand(d, d_k)),
        "k_group": rand(d, d_k),
        "v_group": rand(d, d_k),
    }
    out = {}
    for mode, right in rights.items():
        product = torch.bmm(left, right).flatten(1).norm(dim=1)  # draw i with draw i
        scores = (product / (left.flatten(1).norm(dim=1) * right.flatten(1).norm(dim=1))).double()
        out[mode] = (float(scores.mean()), float(scores.std()))
    return tuple(out.items())


_KEPT: OrderedDict[str, Composition] = OrderedDict()  # by weights_key, the last few models'
_KEPT_MAX = 4
_KEPT_BYTES = 64 * 2**20  # scores larger than this are not kept (80 layers × 64 heads: 0.5 GB)
_KEPT_LOCK = threading.Lock()


def weights_key(model: Any) -> str:
    """A digest of what the composition scores read: the attention projections, the norm
    folded into them and the config fields that shape them. Equal keys, equal scores; any
    change to those weights (an optimiser step, a loaded checkpoint) changes the key."""
    c = model.config
    digest = hashlib.blake2b(digest_size=16)
    fields = (c.n_layers, c.n_heads, c.n_kv_heads, c.d_model, c.d_k, c.norm, c.norm_kind)
    digest.update(repr(fields).encode())
    for block in model.blocks:
        with weights_in_place(block):
            for w in _read(block, c):
                w = w.cpu().contiguous()
                digest.update(repr((w.dtype, tuple(w.shape))).encode())
                digest.update(w.view(torch.uint8).numpy().data)
    return digest.hexdigest()


def composition_scores(model: Any, on_disk: bool = False) -> Composition:
    """Q-, K- and V-composition of every pair of heads in different layers of ``model``, and
    the K- and V-group scores, beside the random-matrix baseline (Elhage et al. 2021).

    The last few models' scores are kept by :func:`weights_key`: a page or notebook asking
    again about the same weights (another text, another probe) gets them at the cost of
    reading the weights once (SmolLM2: 0.15 s against about 12 s on one core); scores of
    more than 64 MB (over ~1,800 heads) are not kept, nor are a model's that accelerate
    dispatched: its weights come from disk, and the key would read them a second time. With
    ``on_disk`` they are also kept between processes (:func:`disk_key`, checked when read):
    the evidence and the circuit of a fetched model ask so, a training run (new weights at
    every evaluation) does not. Each call returns its own tensors."""
    if getattr(model, "hf_device_map", None):
        return _composition_scores(model)
    key = weights_key(model)
    with _KEPT_LOCK:
        kept = _KEPT.get(key)
        if kept is not None:
            _KEPT.move_to_end(key)
    if kept is None:
        kept = _read_disk(model, key) if on_disk else None
        if kept is None:
            kept = _composition_scores(model)
            if on_disk:
                _write_disk(key, kept)
        if sum(s.nbytes for s in kept.scores.values()) > _KEPT_BYTES:
            return kept  # a model this large (L · h heads squared) is not kept, nor copied
        with _KEPT_LOCK:
            _KEPT[key] = kept
            while len(_KEPT) > _KEPT_MAX:
                _KEPT.popitem(last=False)
    return replace(kept, scores={m: s.clone() for m, s in kept.scores.items()})


def composition_cached(model: Any) -> bool:
    """Whether :func:`composition_scores` of ``model`` with ``on_disk`` would be read, not
    computed: kept in this process, or on disk and checked (costs the weights' key and, on
    disk, reading the entry's record)."""
    if getattr(model, "hf_device_map", None):
        return False
    key = weights_key(model)
    with _KEPT_LOCK:
        if key in _KEPT:
            return True
    return _disk_problem(key) is None


# --- kept on disk: a folder per weights, its record naming the code and the key ----------------
DISK_FORMAT = 1
DISK_ENTRIES = 16  # folders kept; the oldest go when a new one is written
SCORES_FILE = "scores.safetensors"


def composition_cache_dir() -> Path:
    """Where composition scores are kept between runs: ``$HEADLAB_CACHE/composition``
    (``~/.cache/headlab``)."""
    from headlab.pypi import cache_root

    return cache_root() / "composition"


@functools.cache
def code_digest() -> str:
    """The SHA-256 of what makes the scores besides the weights: torch's version, this
    module's source and the scores of a tiny seeded model (2 layers of 2 heads, pre-norm
    LayerNorm and grouped K/V among them), rounded to 1e-6: a change to the code or to torch's
    arithmetic changes it, and with it every entry's key."""
    from headlab.model import ModelConfig, Transformer
    from headlab.model.transformer import SeededInit

    h = hashlib.sha256(torch.__version__.encode() + Path(__file__).read_bytes())
    config = ModelConfig(vocab_size=8, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, max_len=8)
    with SeededInit(torch.Generator().manual_seed(0)):
        tiny = Transformer(config).eval()
    found = _composition_scores(tiny)
    for mode in MODES:
        h.update(mode.encode() + torch.round(found.scores[mode].double() * 1e6).numpy().tobytes())
    return h.hexdigest()


def disk_key(weights: str) -> str:
    """The folder name of a model's entry: :func:`weights_key` and :func:`code_digest`,
    hashed."""
    return hashlib.sha256(f"{weights}:{code_digest()}:{DISK_FORMAT}".encode()).hexdigest()[:40]


def _produced_by(key: str) -> dict[str, Any]:
    """The entry's record of what made it (:func:`headlab.files.write_manifest`)."""
    return {"format": DISK_FORMAT, "weights": key, "code": code_digest()}


def _disk_problem(key: str) -> str | None:
    """Why the entry of weights ``key`` cannot be read, in words; None when it can."""
    folder = composition_cache_dir() / disk_key(key)
    if not folder.is_dir():
        return "no entry"
    return manifest_problem(folder, [SCORES_FILE], _produced_by(key))


def _read_disk(model: Any, key: str) -> Composition | None:
    """The scores kept on disk for weights ``key``, or None: absent, not the files their
    record names (:func:`headlab.files.manifest_problem`), or not ``model``'s shapes and
    finite; the scores are then computed and written over it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if _disk_problem(key) is not None:
        return None
    c = model.config
    L, h, h_kv = c.n_layers, c.n_heads, c.n_kv_heads or c.n_heads
    try:
        scores = load_file(str(composition_cache_dir() / disk_key(key) / SCORES_FILE))
    except (SafetensorError, OSError):
        return None
    want = {m: (L, h, L, h if m in ("q", "k", "v") else h_kv) for m in MODES}
    if set(scores) != set(want) or any(
        tuple(scores[m].shape) != want[m] or not bool(scores[m].isfinite().all()) for m in MODES
    ):
        return None
    pairs = h * h * L * (L - 1) // 2
    return Composition(dict(scores), random_baseline(c.d_model, c.d_k), pairs=pairs)


def _write_disk(key: str, found: Composition) -> None:
    """Keep ``found`` on disk for weights ``key``: the scores and their record, in a folder
    put in place whole (:func:`headlab.files.new_folder`); then the oldest entries past
    :data:`DISK_ENTRIES` go. A cache that cannot be written is only skipped."""
    from safetensors.torch import save_file

    root = composition_cache_dir()
    try:
        with new_folder(root / disk_key(key)) as tmp:
            scores = {m: s.contiguous() for m, s in found.scores.items()}
            save_file(scores, str(tmp / SCORES_FILE))
            write_manifest(tmp, [SCORES_FILE], _produced_by(key))
        entries = [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")]
        for old in sorted(entries, key=lambda p: p.stat().st_mtime)[:-DISK_ENTRIES]:
            shutil.rmtree(old, ignore_errors=True)
    except (OSError, ValueError):
        pass


@torch.no_grad()
def _composition_scores(model: Any) -> Composition:
    """:func:`composition_scores`, computed."""
    c = model.config
    L, h = c.n_layers, c.n_heads
    h_kv = c.n_kv_heads or h
    group = torch.arange(h) // (h // h_kv)  # query head → its K/V head
    weights = head_weights(model)
    lefts = [left_factor(w.W_V[group], w.W_O) for w in weights]  # (h, d_k, d) per layer
    rights = [_right_factors(w, group) for w in weights]
    scores = {m: torch.zeros(L, h, L, h if m in ("q", "k", "v") else h_kv) for m in MODES}
    for a in range(L - 1):
        for mode in MODES:
            later = torch.cat([r[mode] for r in rights[a + 1 :]])  # ((L − a − 1) · ·, d, ·)
            s = pair_scores(lefts[a], later)  # (h, (L − a − 1) · ·)
            scores[mode][a, :, a + 1 :] = s.view(h, L - a - 1, -1)
    pairs = h * h * L * (L - 1) // 2
    return Composition(scores, random_baseline(c.d_model, c.d_k), pairs=pairs)
