"""Terminal views of a :class:`headlab.heads.HeadReport` (rich renderables; nothing is printed)."""

from __future__ import annotations

from typing import Protocol

from rich.table import Table
from rich.text import Text
from torch import Tensor

from headlab.heads import LABELS, SCORE_TYPES, SINK_THRESHOLD, HeadReport, HeadScore, qualifies


class Scored(Protocol):
    """Scored heads: a :class:`headlab.heads.HeadReport` or a table averaged over prompts."""

    @property
    def heads(self) -> list[HeadScore]: ...
    @property
    def averaged(self) -> list[HeadScore]: ...


SHORT = {
    "previous": "prev",
    "next": "next",
    "self": "self",
    "positional": "pos",
    "duplicate": "dup",
    "induction": "ind",
    "induction_active": "act",
    "content": "cont",
    "rare_word": "rare",
    "syntactic": "syn",
    "first_token": "sink",
    "delimiter": "del",
    "diffuse": "diff",
    "retrieval": "retr",
}
RAMP = " .:-=+*#%@"  # light to heavy, so the heatmap reads without colour too
# what a score column measures, beside the label it gives (LABELS), where the name alone is short
MEANS = {
    "positional": "(one fixed offset, δ)",
    "induction_active": "(its share of the attention off the first token, with ind ≥ 0.25)",
    "first_token": "(weight on the first token)",
    "delimiter": "(weight on delimiters)",
    "diffuse": "(spread evenly)",
    "syntactic": "(margin over the offset baseline)",
    "retrieval": "(copies the needle, Wu et al.)",
}


def heads_table(report: Scored, title: str = "") -> Table:
    """One row per head: layer, head, label, every measured score (bold when it passes its
    threshold, and a type of :data:`headlab.heads.NEEDS` its minimum), δ (the positional
    score's relative offset) and where the head rests on the rows its label's score leaves
    out; the "avg" rows score each layer's averaged head. A head labelled syntactic shows its
    relation. Columns never measured are left out."""
    rows = [*report.heads, *report.averaged]
    kinds = [k for k in SCORE_TYPES if any(k in s.scores for s in rows)]
    columns = ["L", "H", "label", *(SHORT[k] for k in kinds), "δ", "rest"]
    table = Table(
        *columns, title=title, box=None, padding=(0, 1, 0, 0), header_style="bold underline"
    )
    table.columns[2].no_wrap = True
    for s in rows:
        cells = []
        for k in kinds:
            if k not in s.scores:  # e.g. syntactic, for the averaged heads
                cells.append(Text("–", style="dim"))
                continue
            passed = qualifies(k, s.scores)
            cells.append(Text(_short(s.scores[k]), style="bold green" if passed else "dim"))
        head = "avg" if s.head < 0 else str(s.head)
        name = f"{s.label} ({s.relation})" if s.label == "syntactic" else s.label
        name += f" ({s.below_floor} below chance floor)" if s.below_floor else ""
        label = Text(name, style="italic" if s.head < 0 else "bold")
        rest = "" if s.rest is None else _short(s.rest)
        table.add_row(str(s.layer), head, label, *cells, f"{s.offset:+d}", rest)
    return table


def heads_legend(report: Scored) -> str:
    """One line under :func:`heads_table`: every column head of that table in words."""
    rows = [*report.heads, *report.averaged]
    kinds = [k for k in SCORE_TYPES if any(k in s.scores for s in rows)]
    scores = [" ".join(filter(None, (SHORT[k], LABELS[k], MEANS.get(k)))) for k in kinds]
    return " · ".join(
        [
            "columns: L layer, H head (both from 0; avg: the layer's averaged head)",
            *scores,
            "δ the positional score's offset (−1: the token before)",
            "rest where the head rests off the rows its label scores",
            "a score in bold passes its label's threshold (docs/heads.md)",
            "labels also need their layer's random-weights floor (mean + 3 sd); (X below chance "
            "floor): the label the threshold alone gives"
            if getattr(report, "floors", None)
            else "labels by thresholds alone, unchecked against chance (no random-weights floors)",
        ]
    )


def _short(value: float) -> str:
    """A score in [0, 1] in three characters: ".97", "1.0"."""
    return "1.0" if value >= 0.995 else f"{value:.2f}"[1:]


def sink_lines(report: HeadReport) -> list[str]:
    """Per layer, Gu et al. 2024's share of sink heads (mean weight on the first token above
    the threshold), one line each."""
    out = []
    for r in report.sinks:
        heads = ", ".join(f"{r['layer']}.{h}" for h in r["heads"]) or "none"
        out.append(
            f"layer {r['layer']}: {r['share']:.0%} of heads put more than "
            f"{SINK_THRESHOLD} of their attention on the first token ({heads})"
        )
    if not report.start_token:
        out.append(f"no start token: {report.sink_position['note']}")
    return out


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
