"""What each score is worth by chance: the same score with random weights and on shuffled tokens.

Shape legend
    S   baseline seeds; L layers; h heads per layer

A score means something only beside what an untrained model earns on the same probe. For every
score of :func:`headlab.heads.analyse`:

    random weights   the same architecture (``model.config``) initialised at random with each
                     of :data:`BASELINE_SEEDS`, run on the same probe: per layer, the mean and
                     spread over its h heads and the S seeds (a random head has no identity, so
                     a layer's heads pool)
    shuffled tokens  the trained model on the probe with its movable tokens shuffled (one order
                     per seed): per head, the mean and spread over the S orders. A head that
                     keeps its score there scores positions, not the probe's token structure;
                     an induction head keeps it too, for a shuffled run still repeats tokens.
                     It is reported beside the score, never used to gate a label.

The labelling rule (:data:`K_SD`): a type passes when its score reaches its threshold *and*
the random-weights mean + K_SD · sd of its layer (:meth:`Baselines.floors`). The seeds differ
from the seeds a user would pick (0, 1, 2 …), so a random model scored against them is a fair
test of the rule. Elhage et al. 2021 and Olsson et al. 2022 compare with random baselines the
same way for composition scores.

:func:`label_heads` is the one call that labels with the floors (the CLI, the server and the
notebook views use it). The floors depend on the architecture, the probe and the seeds, never on
the trained weights, so :func:`random_spreads` keeps them per process and on disk, keyed by
:func:`floors_key`: only the first run of an architecture on a probe pays the 3 analyses.
"""

from __future__ import annotations

import functools
import hashlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from headlab.devices import input_device
from headlab.files import json_text, read_text, write_json
from headlab.heads.report import (
    HeadReport,
    Keep,
    RetrievalScores,
    SyntacticScores,
    analyse,
    unused_seed,
)
from headlab.heads.targets import shuffle_positions
from headlab.measure import Probe, earlier_occurrence
from headlab.model import Transformer
from headlab.model.transformer import SeededInit
from headlab.pypi import cache_root

BASELINE_SEEDS = (1000, 1001, 1002)  # the random initialisations and shuffle orders
K_SD = 3.0  # a label needs its score ≥ the random-weights mean + K_SD standard deviations
Progress = Callable[[int, int], None]  # progress(done, total)
# progress(stage, done, total): which stage of a long run is under way and how far it is (the
# server's progress answers and the CLI's bars read it); the stages are named where they run
Stages = Callable[[str, int, int], None]
Floors = dict[int, dict[str, float]]  # layer → score type → the least score a label needs


def score_tensor(report: HeadReport, averaged: bool = False) -> dict[str, Tensor]:
    """Every score of a report as (L, h) tensors, keyed by score type; with ``averaged`` the
    layers' averaged heads' as (L, 1)."""
    rows = report.averaged if averaged else report.heads
    L = max(s.layer for s in rows) + 1
    out: dict[str, Tensor] = {}
    for kind in rows[0].scores:
        out[kind] = torch.tensor([s.scores.get(kind, 0.0) for s in rows]).view(L, -1)
    return out


# Drawing the weights is most of a random model's cost (SmolLM2: 135 M parameters, about 4 s a
# seed on 2 cores, 3.6 s of it the random draws alone). Identical weights need the same draws in
# the same order, so building once on the meta device and filling in place per seed would save
# only the allocation; the floors' cache saves the whole cost instead.
def random_model(model: Any, seed: int) -> Transformer:
    """``model``'s architecture with random weights drawn from ``seed`` (its config's
    init_std), on the device and dtype of its embedding: the weights of ``Transformer(config)``
    after ``torch.manual_seed(seed)``, drawn from a generator of its own (:class:`SeededInit`),
    so that other threads drawing from the global one (a live run in the server) cannot change
    them; the global RNG is neither read nor moved. For a model dispatched by accelerate,
    whose embedding may wait on disk (a meta tensor), the random copy is built where its
    inputs go (:func:`headlab.devices.input_device`: the CPU), whole."""
    weight = model.embed.weight
    device = input_device(model) if weight.is_meta else weight.device
    if device.type == "cpu":
        _check_room(model, weight.dtype)
    with SeededInit(torch.Generator().manual_seed(seed)):
        fresh = Transformer(model.config)
    return fresh.to(device=device, dtype=weight.dtype).eval()


def available_memory() -> int | None:
    """Bytes of memory this machine can give a new allocation now (Linux's MemAvailable), or
    None where it cannot tell."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class FloorsDoNotFit(ValueError):
    """The random-weights floors' copy of a model would not fit in the memory available:
    ``need`` and ``free`` in bytes. The message names the command line's and the library's way
    out; the server words its own (``"floors": false``) from the two sizes."""

    def __init__(self, need: int, free: int) -> None:
        self.need, self.free = need, free
        super().__init__(
            f"{self.sizes()}: score it without them (--no-floors, or floors=False; the labels "
            "then say they are unchecked against chance)"
        )

    def sizes(self) -> str:
        """What does not fit, in words, both sizes in MiB or GiB."""
        return (
            "the random-weights floors build this model's architecture with random weights in "
            f"memory ({_size(self.need)}), more than this machine has available "
            f"({_size(self.free)})"
        )


def _check_room(model: Any, dtype: torch.dtype) -> None:
    """:class:`FloorsDoNotFit` (a ValueError saying so, and what to do) when a random copy of
    ``model``'s architecture would not fit in the memory left (a model dispatched by
    accelerate because it is larger than memory): building it would end the process, not
    fail it. The copy is built in float32 and then cast, so a half-precision model's needs
    both at once."""
    numel = sum(p.numel() for p in model.parameters())
    need = numel * 4 + (0 if dtype == torch.float32 else numel * torch.finfo(dtype).bits // 8)
    free = available_memory()
    if free is not None and need > free:
        raise FloorsDoNotFit(need, free)


def _size(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"


def random_weight_runs(
    model: Any,
    probe: Probe,
    seeds: tuple[int, ...] = BASELINE_SEEDS,
    content: bool = True,
    progress: Progress | None = None,
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Every score on ``probe`` of ``model``'s architecture with random weights, one model per
    seed (type → (S, L, h)), and from the same analyses each layer's averaged head (type →
    (S, L, 1)). ``progress(done, S · L)`` is called after each layer of each."""
    L, runs = model.config.n_layers, []
    for i, s in enumerate(seeds):
        step = (
            None
            if progress is None
            else (lambda done, _, i=i: progress(i * L + done, len(seeds) * L))
        )
        runs.append(analyse(random_model(model, s), probe, content=content, keep=(), progress=step))
    heads, averaged = ([score_tensor(r, avg) for r in runs] for avg in (False, True))
    return (
        {k: torch.stack([r[k] for r in heads]) for k in heads[0]},
        {k: torch.stack([r[k] for r in averaged]) for k in averaged[0]},
    )


def shuffled_probe(probe: Probe, seed: int) -> Probe:
    """``probe`` with each sequence's movable tokens shuffled (special tokens stay): the same
    tokens with the order, and so every repeat and phrase, broken up."""
    order = shuffle_positions(probe.tokens, probe.movable, seed + 1)
    tokens = probe.tokens.gather(1, order)  # (B, n)
    words = None if probe.word_index is None else probe.word_index.gather(1, order)
    labels = [probe.labels[j] for j in order[0].tolist()]
    return replace(
        probe,
        tokens=tokens,
        labels=labels,
        word_index=words,
        delimiters=probe.delimiters.gather(1, order),
        source=earlier_occurrence(tokens),
    )


def shuffled_scores(
    model: Any,
    probe: Probe,
    seeds: tuple[int, ...] = BASELINE_SEEDS,
    content: bool = True,
    progress: Stages | None = None,
) -> dict[str, Tensor]:
    """Every score of the trained ``model`` on ``probe`` shuffled once per seed: type →
    (S, L, h). ``progress("shuffled", done, S)`` before each order and after the last."""
    runs = []
    for i, s in enumerate(seeds):
        if progress is not None:
            progress("shuffled", i, len(seeds))
        shuffled = shuffled_probe(probe, s)
        runs.append(score_tensor(analyse(model, shuffled, content=content, keep=())))
    if progress is not None:
        progress("shuffled", len(seeds), len(seeds))
    return {k: torch.stack([r[k] for r in runs]) for k in runs[0]}


@dataclass(frozen=True)
class Baselines:
    """Each score's chance level on one probe (see the module docstring).

    ``random[type]`` is (2, L): per layer the mean and standard deviation over its heads and
    the seeds; ``shuffled[type]`` (2, L, h): per head the mean and standard deviation over the
    shuffle orders. Standard deviations are the sample ones (n − 1)."""

    seeds: tuple[int, ...]
    k: float
    random: dict[str, Tensor]
    shuffled: dict[str, Tensor]
    averaged: dict[str, Tensor] = field(default_factory=dict)  # (2, L): averaged heads, seeds

    def floors(self) -> dict[int, dict[str, float]]:
        """layer → score type → the random-weights mean + k · sd a label must reach: the
        ``floors`` argument of :func:`headlab.heads.analyse`."""
        return floors_of(self.random, self.k)

    def averaged_floors(self) -> dict[int, dict[str, float]]:
        """The same for each layer's averaged head (mean + k · sd over the seeds): the
        ``averaged_floors`` argument of :func:`headlab.heads.analyse`."""
        return floors_of(self.averaged, self.k) if self.averaged else {}

    def of_head(self, layer: int, head: int) -> dict[str, dict[str, Any]]:
        """score type → {"random": {mean, sd, floor}, "shuffled": {mean, sd}} for one head."""
        out = {}
        for t, v in self.random.items():
            mean, sd = float(v[0, layer]), float(v[1, layer])
            entry: dict[str, Any] = {
                "random": {
                    "mean": round(mean, 4),
                    "sd": round(sd, 4),
                    "floor": round(mean + self.k * sd, 4),
                }
            }
            if t in self.shuffled:
                s = self.shuffled[t][:, layer, head]
                entry["shuffled"] = {"mean": round(float(s[0]), 4), "sd": round(float(s[1]), 4)}
            out[t] = entry
        return out


def floors_of(random: dict[str, Tensor], k: float = K_SD) -> Floors:
    """layer → score type → mean + k · sd, from the random-weights spread (type → (2, L))."""
    L = next(iter(random.values())).shape[1]
    return {l: {t: float(v[0, l] + k * v[1, l]) for t, v in random.items()} for l in range(L)}


def spread(values: Tensor, dims: tuple[int, ...]) -> Tensor:
    """Mean and sample standard deviation over ``dims`` → (2, ·); sd 0 for one sample."""
    count = 1
    for d in dims:
        count *= values.shape[d]
    mean = values.double().mean(dim=dims)
    sd = values.double().std(dim=dims) if count > 1 else torch.zeros_like(mean)
    return torch.stack([mean, sd]).float()


def baselines(
    model: Any,
    probe: Probe,
    seeds: tuple[int, ...] = BASELINE_SEEDS,
    content: bool = True,
    shuffled: bool = True,
    progress: Stages | None = None,
) -> Baselines:
    """The random-weights and shuffled-tokens baselines of every score of ``model`` on
    ``probe``: 2 · S analyses (each one forward); S without ``shuffled`` (the labels need
    the random weights only). ``progress(stage, done, total)``: "shuffled" before each
    shuffled order, "floors" before each random model (S of S at once when the floors are
    cached, :func:`floors_cached`)."""
    report = progress or (lambda stage, done, total: None)
    shuf = shuffled_scores(model, probe, seeds, content, report) if shuffled else {}
    L, S = model.config.n_layers, len(seeds)
    report("floors", 0, S)
    rand, averaged = random_spreads(
        model, probe, seeds, content, lambda done, _: report("floors", done // L, S)
    )
    report("floors", S, S)
    return Baselines(
        seeds=tuple(seeds),
        k=K_SD,
        random=rand,
        shuffled={k: spread(v, (0,)) for k, v in shuf.items()},  # (S, L, h) → (2, L, h)
        averaged=averaged,
    )


# --- the random-weights floors, cached: they depend on the architecture, never the weights -----
MEMORY_ENTRIES = 64  # floors kept per process (each a few floats per layer and type)
Spreads = tuple[dict[str, Tensor], dict[str, Tensor]]  # the heads', the averaged heads'
_MEMORY: dict[str, Spreads] = {}
_LOCK = threading.Lock()
# the code that makes a score (and so a floor), hashed into every floor's key: a cached floor
# from other code is not used. Whole rooms, so that no module that computes a score (the
# compiled loops of heads/kernels.py, the switch that picks them) can be left out
SCORING_CODE = (
    "heads/*.py",
    "model/*.py",
    "attention.py",
    "measure.py",
    "trace.py",
    "devices.py",
    "numbers.py",
)
FLOORS_FORMAT = 2  # 2: each entry holds its key and the SHA-256 of its content


@functools.cache
def _code_digest() -> bytes:
    """The hash of the code that computes the random-weights scores (every file of
    :data:`SCORING_CODE`), of torch's version and of the scores of a fixed small input
    (:func:`scores_fingerprint`), which changes with anything else that changes a score."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256(torch.__version__.encode())
    for path in scoring_files():
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    h.update(scores_fingerprint())
    return h.digest()


def scoring_files() -> list[Path]:
    """The source files of :data:`SCORING_CODE`, in a fixed order."""
    root = Path(__file__).resolve().parents[1]
    return sorted({path for pattern in SCORING_CODE for path in root.glob(pattern)})


def scores_fingerprint() -> bytes:
    """The SHA-256 of every score :func:`analyse` gives a tiny random model (2 layers of 2
    heads, seeded) on a fixed repeated-random-tokens probe, on one CPU thread, rounded to 1e-5:
    a change anywhere in how scores are computed (the code, torch, Numba) changes it."""
    from headlab.files import one_thread
    from headlab.measure import random_repeat_probe
    from headlab.model import ModelConfig

    config = ModelConfig(vocab_size=32, d_model=16, n_layers=2, n_heads=2, max_len=32)
    with SeededInit(torch.Generator().manual_seed(0)):
        model = Transformer(config).eval()
    probe = random_repeat_probe(None, 32, 24, length=5, batch=2, seed=0)
    with one_thread():
        scores = score_tensor(analyse(model, probe, keep=()))
    h = hashlib.sha256()
    for kind, values in sorted(scores.items()):
        h.update(kind.encode() + torch.round(values.double() * 1e5).numpy().tobytes())
    return h.digest()


def floors_key(model: Any, probe: Probe, seeds: tuple[int, ...], content: bool) -> str:
    """What the random-weights scores depend on, hashed: ``model``'s config (not its weights),
    dtype and device type, every field of ``probe`` its targets read, the seeds, whether the
    content score runs, and the scoring code (:func:`_code_digest`)."""
    weight = model.embed.weight
    h = hashlib.sha256(_code_digest())
    h.update(
        repr(
            (
                model.config,
                tuple(seeds),
                content,
                str(weight.dtype),
                weight.device.type,
                probe.name,
                probe.text,
                list(probe.labels),
                probe.words,
            )
        ).encode()
    )
    for t in (probe.tokens, probe.delimiters, probe.movable, probe.source, probe.word_index):
        if t is not None:
            h.update(repr(tuple(t.shape)).encode() + t.cpu().numpy().tobytes())
    return h.hexdigest()


def floors_cache_dir() -> Path:
    """Where floors are kept between runs: ``$HEADLAB_CACHE/floors`` (``~/.cache/headlab``)."""
    return cache_root() / "floors"


def _entry_digest(key: str, body: dict[str, Any]) -> str:
    """The SHA-256 of an entry's key and spreads, as canonical JSON."""
    text = json.dumps({"key": key, **body}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _read_cached(key: str, layers: int) -> Spreads | None:
    """The random-weights spreads stored under ``key``, or None: absent, unreadable, or not an
    entry this key wrote (:func:`_checked`), so computed again and written over."""
    path = floors_cache_dir() / f"{key}.json"
    if not path.is_file():
        return None
    try:
        stored = json.loads(read_text(path, 1_000_000, "floors cache"))
    except (ValueError, OSError, RecursionError):
        return None
    return _checked(stored, key, layers)


def _checked(stored: Any, key: str, layers: int) -> Spreads | None:
    """An entry's spreads when it is the one written under ``key`` and unchanged since: its
    own key (not another entry's, swapped in), the SHA-256 of its content, and each type's
    values a (2, ``layers``) table of finite means and sds ≥ 0; else None. The SHA-256 is a
    check, not a signature: whoever can write the file can recompute it."""
    if not isinstance(stored, dict) or stored.get("format") != FLOORS_FORMAT:
        return None
    body = {part: stored.get(part) for part in ("random", "averaged")}
    if stored.get("key") != key or stored.get("sha256") != _entry_digest(key, body):
        return None
    spreads = []
    for part in body.values():
        if not isinstance(part, dict) or not part:
            return None
        tables = {}
        for kind, values in part.items():
            try:
                table = torch.tensor(values, dtype=torch.float32)
            except (TypeError, ValueError, RuntimeError, OverflowError):
                return None
            if table.shape != (2, layers) or not table.isfinite().all() or (table[1] < 0).any():
                return None
            tables[kind] = table
        spreads.append(tables)
    return spreads[0], spreads[1]


def _write_cached(key: str, spreads: Spreads) -> None:
    """Store the spreads under ``key`` with the key and the SHA-256 of the content; a cache
    that cannot be written is only skipped (the floors are recomputed next time)."""
    body = json.loads(
        json_text(
            {
                part: {k: v.tolist() for k, v in d.items()}
                for part, d in zip(("random", "averaged"), spreads, strict=True)
            }
        )
    )
    stored = {"format": FLOORS_FORMAT, "key": key, "sha256": _entry_digest(key, body), **body}
    try:
        floors_cache_dir().mkdir(parents=True, exist_ok=True)
        write_json(floors_cache_dir() / f"{key}.json", stored)
    except (OSError, ValueError):
        pass


def floors_cached(
    model: Any, probe: Probe, seeds: tuple[int, ...] = BASELINE_SEEDS, content: bool = True
) -> bool:
    """Whether :func:`random_spreads` would read the floors of ``model``'s architecture on
    ``probe``, not compute them: kept in this process, or on disk and checked."""
    key = floors_key(model, probe, seeds, content)
    return key in _MEMORY or _read_cached(key, model.config.n_layers) is not None


def random_spreads(
    model: Any,
    probe: Probe,
    seeds: tuple[int, ...] = BASELINE_SEEDS,
    content: bool = True,
    progress: Progress | None = None,
    cache: bool = True,
) -> Spreads:
    """type → (2, L): per layer the mean and sample sd over its heads and the seeds of
    :func:`random_weight_runs` (the ``random`` field of :class:`Baselines`), and the same over
    the seeds for each layer's averaged head (``averaged``). Kept in memory per process and on
    disk (:func:`floors_cache_dir`) under :func:`floors_key` unless ``cache`` is False: a
    second probe of the same architecture with the same tokens costs nothing. float32 values
    go through JSON unchanged, so cached equals computed."""
    key = floors_key(model, probe, seeds, content) if cache else ""
    found = (_MEMORY.get(key) or _read_cached(key, model.config.n_layers)) if cache else None
    if found is None:
        runs = random_weight_runs(model, probe, seeds, content, progress)
        heads, averaged = ({k: spread(v, (0, 2)) for k, v in r.items()} for r in runs)
        found = (heads, averaged)  # (S, L, h or 1) → (2, L)
        if cache:
            _write_cached(key, found)
    if cache:
        with _LOCK:  # the server's requests run in threads
            while len(_MEMORY) >= MEMORY_ENTRIES:
                _MEMORY.pop(next(iter(_MEMORY)))
            _MEMORY[key] = found
    return tuple({k: v.clone() for k, v in d.items()} for d in found)  # type: ignore[return-value]


# --- labels gated by their floors: the one labelling entry of the CLI, the server, notebooks ----


def label_heads(
    model: Any,
    probe: Probe,
    seed: int | None = None,
    content: bool = True,
    keep: Keep = None,
    progress: Progress | None = None,
    syntactic: SyntacticScores | None = None,
    label_syntactic: bool = False,
    floors: bool = True,
    retrieval: RetrievalScores | None = None,
) -> HeadReport:
    """Every head of ``model`` on ``probe`` scored and labelled, each label needing its score
    at or above its threshold *and* its layer's random-weights floor (mean + K_SD · sd over
    :data:`BASELINE_SEEDS`, :func:`random_spreads`, cached; each layer's averaged head against
    the random models' averaged heads): the labels the CLI, the server and the notebook views
    show. Each head carries its floor and margin, and the label the floor
    took away. ``floors=False``: thresholds alone (:func:`analyse` as it is), labels unchecked
    against chance (the report's ``floors`` is None). The other arguments are
    :func:`analyse`'s (``seed``, deprecated, changes nothing); ``progress(done, total)``
    counts the layers of every analysis run.
    ``retrieval`` scores (the needle probe's) label by Wu et al.'s 0.1 alone, with no floor:
    the score counts only the steps where the model copies a needle token it attends to, which
    a model with random weights does not do.
    Cost: :func:`analyse` plus, the first time an architecture meets a probe, 3 analyses of
    random models."""
    unused_seed(seed, "label_heads")
    L = model.config.n_layers
    if not floors:
        return analyse(
            model,
            probe,
            content=content,
            keep=keep,
            progress=progress,
            syntactic=syntactic,
            label_syntactic=label_syntactic,
            retrieval=retrieval,
        )
    counted: list[int] = [0]

    def base_step(done: int, total: int) -> None:
        counted[0] = total
        if progress is not None:
            progress(done, total + L)

    spreads = random_spreads(model, probe, BASELINE_SEEDS, content, base_step)
    gates, averaged = (floors_of(d) for d in spreads)
    step = (
        None if progress is None else (lambda done, _: progress(counted[0] + done, counted[0] + L))
    )
    return analyse(
        model,
        probe,
        content=content,
        keep=keep,
        progress=step,
        syntactic=syntactic,
        floors=gates,
        label_syntactic=label_syntactic,
        averaged_floors=averaged,
        retrieval=retrieval,
    )


# --- floors of any scoring of a model: e.g. the means over many prompts (headlab.scaling) -------
ScoreRows = tuple[dict[str, Tensor], dict[str, Tensor]]  # type → (L, h), type → (L, 1)


def floors_from(
    model: Any, score: Callable[[Transformer], ScoreRows], seeds: tuple[int, ...] = BASELINE_SEEDS
) -> tuple[Floors, Floors]:
    """The floors of the heads and of each layer's averaged head for scores that ``score``
    gives (type → (L, h) and type → (L, 1)), by the rule of :func:`random_spreads` and
    :meth:`Baselines.floors`: ``score`` of ``model``'s architecture with random weights, one
    model per seed (:func:`random_model`), per layer mean + K_SD · sd over its heads and the
    seeds (:func:`spread`, :func:`floors_of`). Not cached: ``score`` may read anything."""
    runs = [score(random_model(model, s)) for s in seeds]
    heads, averaged = (
        {t: spread(torch.stack([r[part][t] for r in runs]), (0, 2)) for t in runs[0][part]}
        for part in (0, 1)
    )  # (S, L, h or 1) → (2, L)
    return floors_of(heads), floors_of(averaged)
