"""The table of every head's scores averaged over many prompts (:mod:`headlab.scaling`), and
its files: JSON or CSV, the output path checked before any work.

    HeadTable       the means, labelled as one probe's scores are (gated by the floors)
    check_out_path  a --out path that can be written, checked first
    table_text      the table as the text of its file's format
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headlab.files import check_writable
from headlab.heads import THRESHOLDS, HeadScore
from headlab.heads.baselines import BASELINE_SEEDS, K_SD, Floors


@dataclass(frozen=True)
class HeadTable:
    """Every head's scores averaged over prompts, labelled from the means (gated by
    ``floors``, layer → type → floor, unless None: thresholds alone)."""

    prompts: int
    tokens: int
    heads: list[HeadScore]  # layer-major
    averaged: list[HeadScore]  # each layer's averaged head (head = −1)
    floors: Floors | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, scores at full precision."""
        rows = [
            {
                "layer": s.layer,
                "head": s.head,
                "label": s.label,
                "offset": s.offset,
                "scores": dict(s.scores),
                "floor": s.floor,
                "margin": s.margin,
                "below_floor": s.below_floor or None,
            }
            for s in [*self.heads, *self.averaged]
        ]
        L = len(self.averaged)
        return {
            "prompts": self.prompts,
            "tokens": self.tokens,
            "heads": rows[: len(rows) - L],
            "averaged": rows[len(rows) - L :],
            "thresholds": dict(THRESHOLDS),
            "floors": None if self.floors is None else {"seeds": list(BASELINE_SEEDS), "k": K_SD},
        }

    def to_csv(self) -> str:
        """One row per head (averaged heads last, head −1): layer, head, label, offset, scores,
        and the floor, margin and below-floor label (empty without floors)."""
        kinds = list(self.heads[0].scores) if self.heads else []
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(
            ["layer", "head", "label", "offset", *kinds, "floor", "margin", "below_floor"]
        )
        for s in [*self.heads, *self.averaged]:
            scores = [repr(s.scores[k]) for k in kinds]
            gated = ["" if v is None else repr(v) for v in (s.floor, s.margin)]
            writer.writerow([s.layer, s.head, s.label, s.offset, *scores, *gated, s.below_floor])
        return out.getvalue()


OUT_FORMATS = (".json", ".csv")


def check_out_path(path: str | Path) -> Path:
    """``path`` if a result can be written there (.json or .csv, in an existing directory that
    takes new files, not a device, FIFO or folder, a name the file system allows: tried, by
    :func:`headlab.files.check_writable`), checked before any work."""
    p = Path(path)
    if p.suffix.lower() not in OUT_FORMATS:
        raise ValueError(f"--out {p}: the file name must end in .json or .csv")
    if not p.parent.is_dir():
        raise ValueError(f"--out {p}: directory {p.parent} does not exist; create it first")
    problem = check_writable(p, try_it=True)
    if problem is not None:
        raise ValueError(f"--out {problem}")
    return p


def table_text(table: HeadTable, path: str | Path, extra: dict[str, Any] | None = None) -> str:
    """The table as the text of ``path``'s format: CSV, or JSON with ``extra`` keys first."""
    if Path(path).suffix.lower() == ".csv":
        return table.to_csv()
    return json.dumps({**(extra or {}), **table.to_dict()}, ensure_ascii=False) + "\n"
