"""What each attention head does: targets, scores, labels and the report, one package.

    targets   where each head type can act on a probe, built once per probe (causal from the
              model's config)
    content   the content score, from the one forward's weights (its PyTorch definition)
    scores    every score in PyTorch operations (:func:`~headlab.heads.scores.pattern_scores`
              is what analyse runs; :func:`~headlab.heads.scores.induction_score` is the one
              induction score; TransformerLens's "mul" scores keep their own names)
    fast      where the compiled loops stand in for the definition (CPU float32, Numba)
    kernels   those loops: the content score, each row's argmax and entropy (Numba)
    labels    thresholds and the labelling rule: :func:`decide`, the one place a label is made
    report    :func:`analyse`, the one analysis call, and its :class:`HeadReport`
    syntax    word-level attention against dependency parses (spaCy, ``headlab[syntax]``)
    render    terminal views of a report
    baselines every score with random weights and on shuffled tokens; the floors a label needs
    effects   exact single-head ablations (mean or zero), batched: losses and induction scores
    switch    a set of heads switched off together, side by side with the intact run: each
              position's next-token predictions, the loss on the repeat, every head's pattern
    attribution  every head's ablation effect at once, to first order (attribution patching)
    composition  Q-, K-, V-composition of every pair of heads (Elhage et al. 2021), and groups
    evidence  each head's card: scores beside baselines, ablation effects, compositions, a
              sentence with the numbers (``headlab heads --evidence``)
    circuit   previous-token → induction heads, each edge confirmed (``headlab circuit``)
    estimate  the two-stage ranking: attribution first, exact ablation of the top heads
    retrieval Wu et al. 2024's retrieval score on the needle probe

Each type is judged on the rows where it can act (a query with a choice of keys and a target);
its threshold (:data:`THRESHOLDS`) and the paper it comes from:

    previous     attention on i − 1                                0.5   Voita 2019
    next         attention on i + 1 (left out under a causal mask)  0.5   Clark 2019
    self         attention on i itself                             0.5
    duplicate    attention on other copies of t[i]                 0.5   Wang 2022
    induction    attention on the token after an earlier copy of t[i]: prefix matching,
                 over the queries whose token occurred before      0.5   Olsson 2022
                 (a key both rules predict, as in a run "x x x", counts for neither)
    induction_active  the same rows' attention on that token as a share of the attention
                 they do not rest on the first position; passes only where induction
                 reaches 0.25 too (:data:`NEEDS`)                   0.5
    positional   share of queries (that can reach i + δ) whose argmax is i + δ, for the
                 most common δ; pairs a token rule predicts left out     0.9   Voita 2019
    content      the share of attention the head's own position profile (by offset or by
                 key position, from the other rows) does not explain (headlab's
                 definition, :func:`content_score`)                 0.4
    rare_word    share of queries whose argmax is the sentence's least frequent word  0.5
    syntactic    margin over the best fixed-offset baseline on a dependency relation
                 (from :mod:`headlab.heads.syntax`)                0.1   Voita 2019
    first_token  mean weight on the first token: an attention sink  0.5   Xiao 2023, Gu 2024
    delimiter    mean weight on special tokens after 0 and punctuation   0.5   Clark 2019
    diffuse      mean_i H(A_i) / log k_i, k_i the keys query i may see  0.9

TransformerLens's "mul" scores, Σ_ij A_ij P_ij / Σ_ij A_ij over every query, are kept as
previous_mul, duplicate_mul and induction_mul (never used for a label).

Papers: Voita et al. 2019; Clark et al. 2019; Olsson et al. 2022; Wang et al. 2022; Xiao et al.
2023; Gu et al. 2024; TransformerLens (Nanda and Bloom 2022).
"""

from headlab.heads.content import content_score
from headlab.heads.labels import (
    BEST_TYPES,
    LABELS,
    MUL_TYPES,
    NEEDS,
    OFFSET_LABELS,
    SCORE_TYPES,
    SINK_THRESHOLD,
    THRESHOLDS,
    TIERS,
    Decision,
    decide,
    label_head,
    passes,
    qualifies,
)
from headlab.heads.report import (
    HeadReport,
    HeadScore,
    Keep,
    LayerGroups,
    LayerScores,
    analyse,
    layer_scorer,
)
from headlab.heads.scores import (
    averaged_pattern,
    diffuse_score,
    duplicate_mul_score,
    duplicate_score,
    first_token_score,
    induction_active_score,
    induction_mul_score,
    induction_score,
    key_mass_score,
    mass_where_possible,
    offset_mass,
    pattern_score,
    pattern_scores,
    positional_score,
    previous_mul_score,
    rare_word_score,
)
from headlab.heads.targets import (
    Targets,
    build_targets,
    copies_pattern,
    duplicate_token_pattern,
    induction_pattern,
    previous_token_pattern,
    rare_word_targets,
    shuffle_positions,
    targets_of,
    token_rule_targets,
)

__all__ = [
    "BEST_TYPES",
    "LABELS",
    "MUL_TYPES",
    "NEEDS",
    "OFFSET_LABELS",
    "SCORE_TYPES",
    "SINK_THRESHOLD",
    "THRESHOLDS",
    "TIERS",
    "Decision",
    "HeadReport",
    "HeadScore",
    "Keep",
    "LayerGroups",
    "LayerScores",
    "Targets",
    "analyse",
    "averaged_pattern",
    "build_targets",
    "content_score",
    "copies_pattern",
    "decide",
    "diffuse_score",
    "duplicate_mul_score",
    "duplicate_score",
    "duplicate_token_pattern",
    "first_token_score",
    "induction_active_score",
    "induction_mul_score",
    "induction_pattern",
    "induction_score",
    "key_mass_score",
    "label_head",
    "layer_scorer",
    "mass_where_possible",
    "offset_mass",
    "passes",
    "pattern_score",
    "pattern_scores",
    "positional_score",
    "previous_mul_score",
    "previous_token_pattern",
    "qualifies",
    "rare_word_score",
    "rare_word_targets",
    "shuffle_positions",
    "targets_of",
    "token_rule_targets",
]
