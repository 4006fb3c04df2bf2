"""Step 4) of the recipe: export the trained model and write its card, ``card.json`` (every
figure) and ``README.md`` (``templates/model_card.md`` filled from those figures), all measured
on the exported files.
"""

from __future__ import annotations

import hashlib
import io
import json
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from headlab.default_model.data import Prepared, measure
from headlab.model import Transformer
from headlab.training.train import TrainResult


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def export(
    model: Transformer, prepared: Prepared, results: list[TrainResult], directory: Path
) -> Path:
    """Write the model, tokenizer, ``card.json`` (every figure) and ``README.md`` (the card),
    the folder whole or not at all (:func:`headlab.files.new_folder`): the card's figures are
    measured on the files in the folder being written, before it takes ``directory``'s place."""
    from headlab.files import new_folder

    model.eval()
    with new_folder(directory) as folder:
        model.save(folder)
        prepared.tokenizer.save(str(folder / "tokenizer.json"))
        _write_card(model, prepared, results, folder)
    return directory


def _write_card(
    model: Transformer, prepared: Prepared, results: list[TrainResult], directory: Path
) -> None:
    """``card.json`` and ``README.md`` for the model and tokenizer saved in ``directory``; the
    card records the versions its figures were measured on (:mod:`headlab.provenance`)."""
    from headlab.files import json_text
    from headlab.provenance import versions

    with torch.no_grad():
        figures = measure(model, prepared.evals)
    card = {
        "recipe": asdict(prepared.recipe),
        "config": model.config.to_dict(),
        "parameters": model.num_params(),
        "corpus": prepared.corpus,
        "training": [_phase_summary(r) for r in results],
        "figures": {k: v for k, v in figures.items() if not isinstance(v, list)},
        "per_head": {k: figures[k] for k in ("previous_token", "induction", "prefix_matching")},
        "files": {
            name: {"sha256": sha256(directory / name), "bytes": (directory / name).stat().st_size}
            for name in ("config.json", "model.safetensors", "tokenizer.json")
        },
    }
    tables, card["heads"] = head_tables(directory)
    card["load_seconds"] = round(load_seconds(directory), 3)
    card["versions"] = versions()  # what the figures were measured on
    (directory / "card.json").write_text(json_text(card), encoding="utf-8")
    (directory / "README.md").write_text(model_card(card, tables), encoding="utf-8")


def _phase_summary(result: TrainResult) -> dict[str, Any]:
    keys = ("step", "val_loss", "max_previous_token", "max_induction", "max_prefix_matching")
    return {
        "steps": result.step,
        "train_seconds": round(result.elapsed, 1),
        "eval_history": [{k: r[k] for k in keys} for r in result.records("eval")],
    }


def head_tables(directory: Path) -> tuple[dict[str, str], dict[str, list]]:
    """``headlab heads`` for the model in ``directory`` on both built-in probes: the tables as
    plain text, and each head's ``[layer, head, label]``."""
    from rich.console import Console

    from headlab import measure
    from headlab.heads import analyse
    from headlab.heads.render import heads_table
    from headlab.zoo import Tokenizer

    model = Transformer.load(directory)
    tokenizer = Tokenizer.from_dir(directory, "default")
    max_len, V = model.config.max_len, model.config.vocab_size
    tables, labels = {}, {}
    for name, probe in (
        ("repeat", measure.sentence_probe(tokenizer, max_len)),
        ("random-repeat", measure.random_repeat_probe(tokenizer, V, max_len)),
    ):
        report = analyse(model, probe)
        console = Console(record=True, width=120, file=io.StringIO())
        console.print(heads_table(report, f"default: {name} probe, {len(report.tokens)} tokens"))
        tables[name] = console.export_text()
        labels[name] = [[s.layer, s.head, s.label, s.offset] for s in report.heads]
    return tables, labels


def heads_summary(card: dict[str, Any]) -> str:
    """What the classifier found, in a sentence per probe, computed from the card's labels."""
    lines = []
    for probe, heads in card["heads"].items():
        found: dict[str, list[str]] = {}
        for layer, head, label, offset in heads:
            found.setdefault(label, []).append(f"{layer}.{head} (δ {offset:+d})")
        parts = [f"{label}: {', '.join(hs)}" for label, hs in sorted(found.items())]
        lines.append(f"- {probe} probe — " + "; ".join(parts))
    return "\n".join(lines)


def load_seconds(directory: Path, repeats: int = 5) -> float:
    """Median wall time of loading the model and tokenizer, as ``headlab.zoo`` does."""
    from headlab.zoo import Tokenizer

    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        Transformer.load(directory)
        Tokenizer.from_dir(directory)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


CARD_TEMPLATE = Path(__file__).parents[1] / "templates" / "model_card.md"


def model_card(card: dict[str, Any], tables: dict[str, str]) -> str:
    """The model card (markdown): ``templates/model_card.md`` filled from ``card.json``'s figures
    and the head tables. The template names the card's sections as ``c`` (config), ``r``
    (recipe), ``data`` (corpus) and ``card``, and the values worked out here by name."""
    c, r = card["config"], card["recipe"]
    files = "\n".join(
        f"| `{name}` | {v['bytes']:,} | `{v['sha256']}` |" for name, v in card["files"].items()
    )
    return CARD_TEMPLATE.read_text(encoding="utf-8").format_map(
        {
            "c": c,
            "r": r,
            "data": card["corpus"],
            "card": card,
            "held_out": card["corpus"]["validation_work"].replace("_", " ").title(),
            "all_span": r.get("copy_all_min_span", r["copy_min_span"]),
            "bos_phrase": _bos_phrase(r),
            "lr_floor": r["lr"] * r["min_lr_ratio"],
            "minutes": sum(phase["train_seconds"] for phase in card["training"]) / 60,
            "config_json": json.dumps(c, indent=1),
            "figures_table": _figures_table(card["figures"]),
            "heads_summary": heads_summary(card),
            "repeat_table": tables["repeat"].rstrip(),
            "random_repeat_table": tables["random-repeat"].rstrip(),
            "files": files,
        }
    )


def _bos_phrase(r: dict[str, Any]) -> str:
    start = "after the start token" if r.get("copy_bos", True) else "without the start token"
    if r.get("copy_pool_logits", False):
        return start + ", the loss over the pool's logits only"
    return start


def _figures_table(f: dict[str, float]) -> str:
    rows = [
        ("validation loss (nats/token)", f"{f['val_loss']:.3f}"),
        ("in-context-learning score (last tokens − tokens near n/10)", f"{f['icl_score']:+.3f}"),
        (
            "repeated passage: loss on the 1st copy → the 2nd",
            f"{f['passage_first_copy_loss']:.2f} → {f['passage_second_copy_loss']:.2f}",
        ),
        (
            "repeated random tokens: loss on the 1st copy → the 2nd",
            f"{f['random_first_copy_loss']:.2f} → {f['random_second_copy_loss']:.2f}",
        ),
        ("best previous-token score (held-out text)", f"{f['max_previous_token']:.2f}"),
        (
            'TransformerLens\'s induction score ("mul", all 51 queries count; at most 25/51)',
            f"{f['max_induction']:.2f}",
        ),
        (
            "best induction score (headlab's: prefix matching over the 2nd copy, Olsson et al.)",
            f"{f['max_prefix_matching']:.2f}",
        ),
    ]
    return "| figure | value |\n|---|---|\n" + "\n".join(f"| {a} | {b} |" for a, b in rows)
