"""The recipe run, ``headlab train default [--quick]``: the two copying phases and the text
phase, each a :func:`headlab.training.train.train` run, then the export (:mod:`.card`).
Shape legend: B batch, n tokens.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from headlab.default_model.card import export
from headlab.default_model.data import Prepared, measure, prepare
from headlab.default_model.recipe import QUICK, RECIPE
from headlab.model import Transformer
from headlab.training.train import Reporter, TrainConfig, TrainResult, train


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
