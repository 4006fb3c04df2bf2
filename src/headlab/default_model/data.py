"""Steps 1) to 3) of the recipe's data: the corpus split, the byte-level BPE tokenizer, the
training task, and the fixed held-out set every figure of the training log and the model card is
measured on. Shape legend: B batch, n tokens, V vocabulary, h heads per layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from headlab.default_model.recipe import BOS, VALIDATION_WORK, DefaultRecipe
from headlab.model import Transformer

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


# --- the recipe's data, prepared once (the training phases are in build.py) ---------------


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
