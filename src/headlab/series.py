"""Head roles across checkpoints: a series of checkpoints of one architecture, scored on one
probe, and how each head's scores and label change along it.

Shape legend
    C   checkpoints in the series; L layers; h heads per layer

    load_series   each name → (name, model, tokenizer): a checkpoint headlab's training loop
                  wrote (``…/checkpoints/step-000400``: verified, then its weights), a training
                  run folder (every checkpoint it keeps, in step order), a ``Transformer.save``
                  folder without a tokenizer, or anything :func:`headlab.zoo.load` takes (a
                  model name, a Hugging Face model in the cache, a folder with its tokenizer)
    compare       one probe, built once, through :func:`headlab.heads.baselines.label_heads`
                  for every checkpoint (each label above its random-weights floor; the
                  checkpoints share one architecture, so one set of floors): a :class:`Series`
    Series        scores (C, L, h) per score type, labels per checkpoint, the heads whose label
                  changes; ``to_dict`` (the CLI's --json), ``figure`` (heads × checkpoints, PNG)

A series is any checkpoints a user has of one architecture: Pythia's training steps, a base model
and its instruct tuning, the checkpoints of ``headlab train``. The probe is built with the first
checkpoint's tokenizer; a checkpoint without one (synthetic-token training) takes the repeated
random tokens probe over its ids.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from headlab.heads import HeadReport
from headlab.heads.baselines import label_heads
from headlab.heads.report import unused_seed
from headlab.measure import Probe, build_probe, random_repeat_probe
from headlab.model import ModelConfig, Transformer

# (name, model, tokenizer or None): one checkpoint of a series
Member = tuple[str, Transformer, Any]
# what must agree for two checkpoints to be compared head by head
SAME = ("n_layers", "n_heads", "vocab_size", "causal")


def load_series(names: list[str], tokenizer: Any = None) -> list[Member]:
    """The checkpoints ``names`` name, in order, each ``(name, model, tokenizer)``.

    ``tokenizer`` (a :class:`headlab.zoo.Tokenizer`) serves the checkpoints that carry none (a
    training checkpoint keeps only weights). Raises ValueError with one sentence for a name that
    is no checkpoint, run or model here, or a checkpoint that fails its verification.
    """
    from headlab import zoo

    members: list[Member] = []
    for name in names:
        path = Path(name).expanduser()
        kind = _kind(path)
        if kind == "run":  # every checkpoint it keeps
            steps = sorted(p for p in (path / "checkpoints").glob("step-*") if p.is_dir())
            if not steps:
                raise ValueError(f"the run {name} has no checkpoints in {path / 'checkpoints'}")
            members += [(f"{name}@{p.name}", _trained(p), tokenizer) for p in steps]
        elif kind == "checkpoint":
            members.append((name, _trained(path), tokenizer))
        elif kind == "weights":
            members.append((name, Transformer.load(path), tokenizer))
        else:
            model, own = zoo.load(name)
            members.append((name, model, own))
    return members


def _kind(path: Path) -> str:
    """What ``path`` holds: a training "run" folder, one "checkpoint", a model's "weights" alone,
    or else a "name" for the zoo, which says what it is not (so is a name no path can be:
    longer than the file system allows, or holding a NUL)."""
    try:
        if (path / "checkpoints").is_dir():
            return "run"
        if (path / "state.json").is_file():
            return "checkpoint"
        if _weights_alone(path):
            return "weights"
    except (OSError, ValueError):
        pass
    return "name"


def _weights_alone(path: Path) -> bool:
    """A ``Transformer.save`` folder with no tokenizer (a model of synthetic ids)."""
    import json

    config = path / "config.json"
    if not config.is_file() or (path / "tokenizer.json").is_file():
        return False
    try:
        return "model_type" not in json.loads(config.read_text())
    except (OSError, ValueError):
        return False


def _trained(path: Path) -> Transformer:
    """The model in a checkpoint of headlab's training loop, after its verification."""
    from headlab.checkpoint import read_checkpoint

    ck = read_checkpoint(path)
    config = ck.state.get("model_config")
    if not isinstance(config, dict):
        raise ValueError(f"the checkpoint {path} records no model config; it holds no Transformer")
    model = Transformer(ModelConfig.from_dict(config))
    model.load_state_dict(ck.model)
    return model.eval()


def series_probe(
    members: list[Member], probe: str, seed: int = 0, text: str | None = None
) -> Probe:
    """The probe every checkpoint is scored on: ``probe`` (a :data:`headlab.measure.PROBES`
    name) built with the first checkpoint's tokenizer, or repeated random ids without one."""
    _, model, tokenizer = members[0]
    c = model.config
    if tokenizer is None:
        if probe != "random-repeat" or text is not None:
            raise ValueError(
                f"{members[0][0]} has no tokenizer, so only the random-repeat probe (random ids) "
                "can run; give a tokenizer (--tokenizer) for a text or the repeat probe"
            )
        return random_repeat_probe(None, c.vocab_size, c.max_len, seed=seed)
    return build_probe(probe, tokenizer, c.max_len, c.vocab_size, text, seed)


def check_same_architecture(members: list[Member]) -> None:
    """A ValueError naming the first checkpoint whose layers, heads, vocabulary or causality
    differ from the first one's: head l.h must mean the same head all along the series."""
    first_name, first, _ = members[0]
    for name, model, _ in members[1:]:
        for field in SAME:
            a, b = getattr(first.config, field), getattr(model.config, field)
            if a != b:
                raise ValueError(
                    f"{name} has {field}={b} but {first_name} has {field}={a}: a series compares "
                    "checkpoints of one architecture"
                )


def compare(
    members: list[Member],
    probe: Probe,
    seed: int | None = None,
    content: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> Series:
    """Every checkpoint of ``members`` analysed on ``probe`` (:func:`headlab.heads.baselines.
    label_heads`, scores only, labels gated); ``progress(done, C)`` after each checkpoint.
    ``seed`` changes nothing and is deprecated (:func:`headlab.heads.report.unused_seed`)."""
    unused_seed(seed, "compare")
    if len(members) < 2:
        raise ValueError(f"a series needs at least 2 checkpoints, got {len(members)}")
    check_same_architecture(members)
    reports = []
    for i, (_, model, _) in enumerate(members):
        reports.append(label_heads(model, probe, content=content, keep=()))
        if progress is not None:
            progress(i + 1, len(members))
    return Series(names=tuple(m[0] for m in members), probe=probe.name, reports=tuple(reports))


@dataclass(frozen=True, kw_only=True)
class Series:
    """Every head of every checkpoint of a series, scored on one probe (see :func:`compare`)."""

    names: tuple[str, ...]  # the checkpoints, in series order
    probe: str
    reports: tuple[HeadReport, ...]  # one per checkpoint

    @property
    def heads(self) -> list[tuple[int, int]]:
        """(layer, head) of every head, layer-major."""
        return [(s.layer, s.head) for s in self.reports[0].heads]

    def scores(self, kind: str) -> Tensor:
        """Score ``kind`` (a :data:`headlab.heads.SCORE_TYPES` or MUL_TYPES name) of every
        head at every checkpoint, (C, L, h); NaN where it was not measured."""
        L = 1 + max(layer for layer, _ in self.heads)
        rows = [[s.scores.get(kind, float("nan")) for s in r.heads] for r in self.reports]
        return torch.tensor(rows).view(len(self.reports), L, -1)  # (C, L, h)

    def labels(self) -> list[list[str]]:
        """Each head's label at each checkpoint: (C, L·h), layer-major."""
        return [[s.label for s in r.heads] for r in self.reports]

    def changed(self) -> list[tuple[int, int]]:
        """The heads whose label is not the same at every checkpoint."""
        columns = zip(*self.labels(), strict=True)
        return [
            head for head, labels in zip(self.heads, columns, strict=True) if len(set(labels)) > 1
        ]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the checkpoints, and per head its label and scores at each of them."""
        heads = []
        for i, (layer, head) in enumerate(self.heads):
            per = [r.heads[i] for r in self.reports]
            kinds = sorted({k for s in per for k in s.scores})
            scores = {
                k: [round(s.scores[k], 4) if k in s.scores else None for s in per] for k in kinds
            }
            heads.append(
                {"layer": layer, "head": head, "labels": [s.label for s in per], "scores": scores}
            )
        changed = [f"{l}.{h}" for l, h in self.changed()]
        return {
            "checkpoints": list(self.names),
            "probe": self.probe,
            "heads": heads,
            "changed": changed,
        }

    def figure(self, out: Path, kind: str = "induction", name: str = "series.png") -> str | None:
        """A heads × checkpoints heatmap of score ``kind``, each cell marked with the head's
        label there, saved as ``out/name`` (PNG, atomically); returns the file name."""
        from headlab.experiments import save_figure

        return save_figure(self._draw(kind), out, name)

    def png(self, kind: str = "induction") -> bytes:
        """The figure of :meth:`figure` as PNG bytes (for a notebook, :mod:`headlab.show`)."""
        import io

        from headlab.experiments import pyplot

        fig = self._draw(kind)
        try:
            data = io.BytesIO()
            fig.savefig(data, format="png", dpi=110, bbox_inches="tight")
            return data.getvalue()
        finally:
            pyplot().close(fig)

    def _draw(self, kind: str) -> Any:
        """The matplotlib figure: rows are heads (layer.head), columns checkpoints."""
        from headlab.experiments import pyplot

        values = self.scores(kind).flatten(1).T.numpy()  # (L·h, C)
        labels = self.labels()
        height = min(0.3 * len(self.heads) + 1.5, 40)
        fig, ax = pyplot().subplots(figsize=(1.6 * len(self.names) + 3, height))
        image = ax.imshow(values, aspect="auto", cmap="viridis", vmin=0, vmax=1)
        for row in range(values.shape[0]):
            for col in range(values.shape[1]):
                light = not values[row, col] >= 0.5  # NaN (not measured) too
                ax.text(
                    col,
                    row,
                    labels[col][row],
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if light else "black",
                )
        ax.set_xticks(
            range(len(self.names)), [_short(n) for n in self.names], rotation=30, ha="right"
        )
        ax.set_yticks(range(len(self.heads)), [f"{l}.{h}" for l, h in self.heads], fontsize=7)
        ax.set(
            xlabel="checkpoint",
            ylabel="head (layer.head)",
            title=f"{kind} score and label of every head, {self.probe} probe",
        )
        fig.colorbar(image, ax=ax, label=f"{kind} score")
        return fig


def _short(name: str, limit: int = 28) -> str:
    """A checkpoint's name short enough for an axis: its tail."""
    return name if len(name) <= limit else "…" + name[-(limit - 1) :]
