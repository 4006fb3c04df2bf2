"""What fixes the shipped model, data to weights: :class:`DefaultRecipe`, the shipped
:data:`RECIPE` and the minute-long :data:`QUICK` run, the start token and the held-out play."""

from __future__ import annotations

from dataclasses import dataclass, replace

from headlab.model import ModelConfig
from headlab.training.train import TrainConfig

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
