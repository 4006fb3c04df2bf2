"""Head scores: how much each attention head looks like a known head type.

Shape legend
    B   batch (probes); scores are averaged over it
    h   heads of one layer
    n   query positions; s key positions (s == n: analysis runs without a cache)

Pattern scores (TransformerLens's head detector, "mul" measure)
    For a 0/1 target pattern P (n, s) built from the token ids, a head with attention A scores

        score = Σ_ij A_ij · P_ij / Σ_ij A_ij

    i.e. the share of the head's attention mass that falls where P says it should. Rows of A sum
    to 1, so Σ A = n and a perfect previous-token head scores (n − 1)/n: query 0 has no previous
    token. Scores are computed per sequence and averaged over the batch.

    previous-token   P[i, i−1] = 1                                   (Voita et al. 2019)
    duplicate-token  P[i, j] = 1 when tokens[j] == tokens[i], j < i  (Wang et al. 2022)
    induction        P[i, j] = 1 when tokens[j−1] == tokens[i], j−1 < i: the token right
                     after an earlier copy of the current token (Olsson et al. 2022)
"""

from __future__ import annotations

import torch
from torch import Tensor


def _as_batched(weights: Tensor, tokens: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """Normalise (h, n, s) → (1, h, n, s) and (n,) → (1, n); check that they agree."""
    if weights.dim() == 3:
        weights = weights.unsqueeze(0)
    if weights.dim() != 4:
        raise ValueError(
            f"weights must be (B, h, n, s) or (h, n, s), got shape {tuple(weights.shape)}"
        )
    if tokens is not None:
        if tokens.dim() == 1:
            tokens = tokens.unsqueeze(0)
        B, n = weights.shape[0], weights.shape[2]
        if tokens.dim() != 2 or tokens.shape != (B, n):
            raise ValueError(
                f"tokens of shape {tuple(tokens.shape)} do not match weights "
                f"{tuple(weights.shape)}; expected (B, n) = ({B}, {n}) or ({n},) when B = 1"
            )
    return weights, tokens


def pattern_score(weights: Tensor, target: Tensor) -> Tensor:
    """TransformerLens "mul" score Σ(A ⊙ P)/ΣA per head, averaged over the batch.

    weights (B, h, n, s) or (h, n, s); target (n, s) or (B, n, s) of 0/1. Returns (h,).
    A sequence whose head has no attention mass at all (ΣA = 0) scores 0.
    """
    A, _ = _as_batched(weights)
    A = A.double()
    P = target.to(A.dtype)
    if P.dim() == 2:
        P = P.unsqueeze(0)  # (1, n, s)
    hit = (A * P[:, None]).sum(dim=(-2, -1))  # (B, h)
    total = A.sum(dim=(-2, -1))  # (B, h)
    per_seq = torch.where(total > 0, hit / total.clamp_min(1e-30), torch.zeros_like(hit))
    return per_seq.mean(dim=0).float()  # (h,)


def previous_token_pattern(n: int, s: int | None = None) -> Tensor:
    """(n, s) 0/1 target: query i → key i − 1."""
    s = n if s is None else s
    i = torch.arange(n)[:, None]
    j = torch.arange(s)[None, :]
    return (j == i - 1).float()  # (n, s)


def duplicate_token_pattern(tokens: Tensor) -> Tensor:
    """(B, n, n) 0/1 target from tokens (B, n): query i → every earlier j with the same token."""
    same = tokens[:, :, None] == tokens[:, None, :]  # (B, n, n)
    return torch.tril(same.float(), diagonal=-1)


def induction_pattern(tokens: Tensor) -> Tensor:
    """(B, n, n) 0/1 target: query i → key j when tokens[j − 1] == tokens[i] and j − 1 < i.

    The duplicate-token pattern shifted one key to the right (Olsson et al. 2022).
    """
    dup = duplicate_token_pattern(tokens)  # (B, n, n)
    shifted = torch.zeros_like(dup)
    shifted[:, :, 1:] = dup[:, :, :-1]
    return shifted


def previous_token_score(weights: Tensor) -> Tensor:
    """Share of attention on the previous token, per head: (B, h, n, s) or (h, n, s) → (h,)."""
    A, _ = _as_batched(weights)
    return pattern_score(A, previous_token_pattern(A.shape[-2], A.shape[-1]).to(A.device))


def duplicate_token_score(weights: Tensor, tokens: Tensor) -> Tensor:
    """Share of attention on earlier copies of the current token, per head → (h,)."""
    A, toks = _as_batched(weights, tokens)
    assert toks is not None
    return pattern_score(A, duplicate_token_pattern(toks))


def induction_score(weights: Tensor, tokens: Tensor) -> Tensor:
    """Share of attention on the token after an earlier copy of the current token → (h,).

    On repeated random tokens this is the prefix-matching score of Olsson et al. 2022.
    """
    A, toks = _as_batched(weights, tokens)
    assert toks is not None
    return pattern_score(A, induction_pattern(toks))
