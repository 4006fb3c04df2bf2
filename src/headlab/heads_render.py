"""Terminal views of a :class:`headlab.heads.HeadReport` (rich renderables; nothing is printed)."""

from __future__ import annotations

from typing import Protocol

from rich.table import Table
from rich.text import Text
from torch import Tensor

from headlab.heads import SCORE_TYPES, THRESHOLDS, HeadScore


class Scored(Protocol):
    """Scored heads: a :class:`headlab.heads.HeadReport` or a table averaged over prompts."""

    @property
    def heads(self) -> list[HeadScore]: ...
    @property
    def averaged(self) -> list[HeadScore]: ...


SHORT = {
    "previous": "prev",
    "next": "next",
    "positional": "pos",
    "first_token": "first",
    "delimiter": "delim",
    "duplicate": "dup",
    "induction": "induc",
    "content": "cont",
    "diffuse": "diff",
}
RAMP = " .:-=+*#%@"  # light to heavy, so the heatmap reads without colour too


def heads_table(report: Scored, title: str = "") -> Table:
    """One row per head: layer, head, label, every score (bold when it passes its threshold).

    δ is the positional score's relative offset; the "avg" rows score each layer's averaged head.
    """
    columns = ["L", "H", "label", *(SHORT[k] for k in SCORE_TYPES), "δ"]
    table = Table(
        *columns, title=title, box=None, padding=(0, 1, 0, 0), header_style="bold underline"
    )
    for s in [*report.heads, *report.averaged]:
        cells = []
        for k in SCORE_TYPES:
            if k not in s.scores:  # e.g. content, when it was not measured
                cells.append(Text("–", style="dim"))
                continue
            passed = s.scores[k] >= THRESHOLDS[k]
            cells.append(Text(f"{s.scores[k]:.2f}", style="bold green" if passed else "dim"))
        head = "avg" if s.head < 0 else str(s.head)
        label = Text(s.label, style="italic" if s.head < 0 else "bold")
        table.add_row(str(s.layer), head, label, *cells, f"{s.offset:+d}")
    return table


def heatmap(pattern: Tensor, labels: list[str], title: str = "") -> Text:
    """A head's weights (n, s) as one shaded character per cell: rows are queries (with their
    token), columns are keys, numbered by two header lines (tens, units).
    """
    n, s = pattern.shape
    width = min(max((len(t) for t in labels), default=1), 12)
    pad = " " * (width + 5)
    out = Text(f"{title}\n" if title else "")
    out.append(pad + "".join(str(j // 10 % 10) if j >= 10 else " " for j in range(s)) + "\n")
    out.append(pad + "".join(str(j % 10) for j in range(s)) + "\n")
    peak = float(pattern.max()) or 1.0
    for i in range(n):
        out.append(f"{i:>3} {labels[i][:width]:<{width}} ")
        for j in range(s):
            share = float(pattern[i, j]) / peak
            level = int(255 * share)
            char = RAMP[min(int(share * len(RAMP)), len(RAMP) - 1)]
            out.append(char, style=f"black on rgb({level},{level // 2},{255 - level})")
        out.append("\n")
    return out


def key_legend(labels: list[str]) -> str:
    """'0 [CLS] · 1 the · …': which token each numbered heatmap column is."""
    return " · ".join(f"{j} {t}" for j, t in enumerate(labels))
