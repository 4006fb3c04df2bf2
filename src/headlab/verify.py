"""Is a rebuild the shipped result? Bit for bit where the machine allows, within tolerance anywhere.

A seeded run repeats bit for bit only on the same CPU, the same torch build and the same thread
count: floating-point kernels (vector width, BLAS paths) sum in a different order elsewhere, the
last bits differ, and after thousands of optimizer steps so do the weights and which head index
ends up doing which job. What must hold anywhere is what the card and the README claim: every
figure within a stated tolerance, and every head *type* present (at whatever index).

    verify_card           a rebuilt default model's card.json against the shipped one
    verify_induction      a rerun of the induction experiment against its shipped results
    verify_default_run, verify_induction_results   the same, reading the shipped files
    Verification.verdict  one line: bit-identical / reproduced within tolerance / NOT reproduced
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Figures of the default model's card and how far a rebuild on another machine may move them.
# Measured: a rebuild on an AMD EPYC CPU (same torch wheel, one thread) moved val_loss by 0.012,
# copy losses by ≤ 0.06; the tolerances leave about twice that room.
CARD_TOLERANCES: dict[str, float] = {
    "val_loss": 0.05,
    "icl_score": 0.1,
    "random_first_copy_loss": 0.15,
    "random_second_copy_loss": 0.15,
    "passage_first_copy_loss": 0.15,
    "passage_second_copy_loss": 0.15,
    "max_previous_token": 0.05,
    "max_induction": 0.05,
    "max_prefix_matching": 0.05,
}
# The head types the README and the card claim for the default model; each must be present in
# a rebuild wherever the shipped card has it (on the same probe), at any index.
CLAIMED_TYPES = ("previous-token", "positional", "induction", "content")
# The induction experiment, per seed: relative room for the phase-change step, absolute room for
# scores; "found" and the presence of induction and previous-token heads must agree.
STEP_TOLERANCE = 0.25
SCORE_TOLERANCE = 0.05


@dataclass(frozen=True)
class Check:
    """One figure or property: shipped value, rebuilt value, the rule, and whether it holds."""

    name: str
    shipped: Any
    rebuilt: Any
    rule: str
    ok: bool


@dataclass(frozen=True)
class Verification:
    """The checks of one comparison, and whether the compared files are identical."""

    what: str
    identical: bool
    checks: list[Check] = field(default_factory=list)
    differing: list[str] = field(default_factory=list)  # files or records that are not equal

    @property
    def ok(self) -> bool:
        return self.identical or all(c.ok for c in self.checks)

    def verdict(self) -> str:
        """One line for the user."""
        if self.identical:
            return f"verdict: {self.what} is bit-identical to the shipped one"
        failed = [c for c in self.checks if not c.ok]
        where = f" ({', '.join(self.differing)} differ in their bits)" if self.differing else ""
        if not failed:
            return (
                f"verdict: {self.what} reproduced within tolerance: all {len(self.checks)} "
                f"checks hold{where}"
            )
        named = "; ".join(
            f"{c.name} {_fmt(c.rebuilt)} vs {_fmt(c.shipped)} ({c.rule})" for c in failed
        )
        count = f"{len(failed)} of {len(self.checks)} checks fail"
        return f"verdict: {self.what} NOT reproduced: {count}: {named}"


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def within(name: str, shipped: float, rebuilt: float, tolerance: float) -> Check:
    """|rebuilt − shipped| ≤ tolerance."""
    ok = abs(float(rebuilt) - float(shipped)) <= tolerance
    return Check(name, float(shipped), float(rebuilt), f"±{tolerance:g}", ok)


def _kept(name: str, shipped: bool, rebuilt: bool) -> Check:
    """A property the shipped result has must hold for the rebuild too."""
    return Check(name, shipped, rebuilt, "present at any index", rebuilt or not shipped)


def present(name: str, shipped: Iterable[str], rebuilt: Iterable[str], wanted: str) -> Check:
    """``wanted`` is among the rebuilt labels if it is among the shipped ones."""
    return _kept(name, wanted in set(shipped), wanted in set(rebuilt))


def verify_card(shipped: dict[str, Any], rebuilt: dict[str, Any]) -> Verification:
    """A rebuilt default model's ``card.json`` against the shipped one.

    Identical when every file's SHA-256 matches; otherwise every figure of
    :data:`CARD_TOLERANCES` must be within its tolerance and every :data:`CLAIMED_TYPES` label the
    shipped card has on a probe must be on the rebuilt card's same probe.
    """
    files = shipped.get("files", {})
    differing = [
        name
        for name, entry in files.items()
        if rebuilt.get("files", {}).get(name, {}).get("sha256") != entry["sha256"]
    ]
    checks = [
        within(name, shipped["figures"][name], rebuilt["figures"][name], tol)
        for name, tol in CARD_TOLERANCES.items()
        if name in shipped.get("figures", {}) and name in rebuilt.get("figures", {})
    ]
    for probe, heads in shipped.get("heads", {}).items():
        labels_s = [h[2] for h in heads]
        labels_r = [h[2] for h in rebuilt.get("heads", {}).get(probe, [])]
        checks += [
            present(f"{kind} head on {probe}", labels_s, labels_r, kind) for kind in CLAIMED_TYPES
        ]
    return Verification("the default model", bool(files) and not differing, checks, differing)


def verify_induction(shipped: dict[str, Any], rebuilt: dict[str, Any]) -> Verification:
    """A rerun of the induction experiment against its shipped ``results.json``, seed by seed.

    Identical when every seed's training history matches record for record; otherwise per seed
    the phase change is found or not alike, its step within :data:`STEP_TOLERANCE` (relative),
    the best induction score and the control's within :data:`SCORE_TOLERANCE`, and induction and
    previous-token heads are present alike.
    """
    if shipped.get("config") != rebuilt.get("config"):
        check = Check("config", shipped.get("config"), rebuilt.get("config"), "equal", False)
        return Verification("the induction experiment", False, [check], ["config"])
    by_seed = {s["seed"]: s for s in rebuilt.get("seeds", [])}
    checks: list[Check] = []
    for s in shipped.get("seeds", []):
        r = by_seed.get(s["seed"])
        tag = f"seed {s['seed']}"
        if r is None:
            checks.append(Check(f"{tag} run", True, False, "seed was rerun", False))
            continue
        checks += _seed_checks(tag, s, r)
    same = _timeless(shipped.get("history", [])) == _timeless(rebuilt.get("history", []))
    identical = same and bool(by_seed) and bool(shipped.get("history"))
    differing = [] if identical else ["training history"]
    return Verification("the induction experiment", identical, checks, differing)


TIMING_KEYS = ("wall", "elapsed")  # wall-clock fields of training records: never reproducible


def _timeless(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records without their wall-clock fields, and without the display patterns that
    histories written before they moved to the live events alone carried."""
    return [{k: v for k, v in r.items() if k not in (*TIMING_KEYS, "patterns")} for r in history]


def _seed_checks(tag: str, s: dict[str, Any], r: dict[str, Any]) -> list[Check]:
    step_tol = STEP_TOLERANCE * float(s["phase_change_step"])
    return [
        Check(
            f"{tag} phase change found", s["found"], r["found"], "equal", s["found"] == r["found"]
        ),
        within(
            f"{tag} phase-change step", s["phase_change_step"], r["phase_change_step"], step_tol
        ),
        within(
            f"{tag} best induction score",
            s["final_induction_score"],
            r["final_induction_score"],
            SCORE_TOLERANCE,
        ),
        Check(
            f"{tag} control's best induction score",
            s["control_max_induction_score"],
            r["control_max_induction_score"],
            f"≤ shipped + {SCORE_TOLERANCE}",
            r["control_max_induction_score"] <= s["control_max_induction_score"] + SCORE_TOLERANCE,
        ),
        _kept(f"{tag} induction head", bool(s["induction_heads"]), bool(r["induction_heads"])),
        _kept(
            f"{tag} previous-token head", bool(s["prev_token_heads"]), bool(r["prev_token_heads"])
        ),
    ]


def verify_default_run(run_dir: Path) -> Verification:
    """The model a `headlab train default` run exported to ``run_dir/model`` against the
    shipped one (``headlab/weights/card.json``); ValueError if the run has no card."""
    from headlab.zoo import WEIGHTS_DIR

    card = Path(run_dir) / "model" / "card.json"
    if not card.is_file():
        raise ValueError(
            f"{card} is missing: the run did not finish, so there is nothing to verify"
        )
    shipped = json.loads((WEIGHTS_DIR / "card.json").read_text(encoding="utf-8"))
    rebuilt = json.loads(card.read_text(encoding="utf-8"))
    # the files' hashes are taken from the files themselves, not from what the card says
    rebuilt["files"] = {
        name: {"sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
        for name in shipped.get("files", {})
        if (path := card.parent / name).is_file()
    }
    return verify_card(shipped, rebuilt)


def verify_induction_results(results: dict[str, Any]) -> Verification:
    """A fresh `headlab experiment induction` result against the shipped one."""
    from headlab.experiments import results_path

    shipped = json.loads(results_path("induction").read_text(encoding="utf-8"))
    return verify_induction(shipped, results)
