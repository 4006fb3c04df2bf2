"""A watched run: :func:`headlab.training.train.train` with typed events for whoever watches it.

Shape legend
    B   probe sequences, n tokens each
    L   layers, h heads per layer

Events (frozen dataclasses; ``to_dict()`` is the JSON the page's live panel reads, ``name`` the
server-sent event's name)
    Start         the run begins: total steps, the probe's first sequence, an ideal head's score
    Step          every ``STEP_EVENTS`` steps: the training loss
    Evaluation    every evaluation: its record (losses, every head's scores), the phase change as
                  detected so far, the best heads, and on every ``PATTERN_EVERY``-th one the
                  patterns of those two heads, taken from the evaluation's own traced forward
    PhaseChange   once, at the first evaluation whose prefix of the history shows the phase change
    Verdict       the study's result, without its history (sent by the experiment)
    Done, Cancelled, Failed   how a live run ended (sent by the server, which knows the run's id)

:class:`Watch` makes the first four: it is the run's :class:`~headlab.training.train.Reporter`
(start and step events; everything is passed on to an inner reporter, e.g. a progress bar) and
its evaluation hook (``measure(model) -> (metrics, weights)``, one forward, then the detector and
the event). The CLI's progress lines and the server's event stream both listen to it.

:class:`PhaseDetector` is the induction experiment's phase-change rule (the rule is stated in
:mod:`headlab.experiments.induction`) fed one evaluation at a time: O(window) work per evaluation,
and for every prefix of a history exactly the batch rule's answer.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from torch import Tensor, nn

from headlab.training.train import Reporter, eval_record

STEP_EVENTS = 10  # a Step event (training loss) every this many steps
PATTERN_EVERY = 2  # the two heads' patterns ride on every this-many-th evaluation
Measure = Callable[[nn.Module], tuple[dict[str, Any], Sequence[Tensor]]]


# ---------------------------------------------------------------------------------------------
# The events
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Start:
    name: ClassVar[str] = "start"
    total: int  # optimizer steps in the run
    tokens: list[int]  # (n,) the probe's first sequence, the one the patterns are drawn on
    ceiling: float  # an ideal induction head's score on the probe

    def to_dict(self) -> dict[str, Any]:
        return {
            "event": self.name,
            "total": self.total,
            "tokens": self.tokens,
            "ceiling": self.ceiling,
        }


@dataclass(frozen=True)
class Step:
    name: ClassVar[str] = "step"
    step: int
    loss: float  # this step's training loss

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.name, "step": self.step, "loss": self.loss}


@dataclass(frozen=True)
class BestHead:
    """The head with the highest score of one kind in one layer."""

    head: str  # "layer.head"
    score: float


def best_head(record: dict[str, Any], kind: str, layer: int) -> BestHead:
    """The best head of ``layer`` (negative: from the end) by ``record[kind]``, (L, h) scores."""
    scores = record[kind][layer]
    i = max(range(len(scores)), key=scores.__getitem__)  # the first of equals
    return BestHead(f"{layer % len(record[kind])}.{i}", float(scores[i]))


def best_induction(record: dict[str, Any]) -> float:
    """The highest induction score of any head in an evaluation record."""
    return max(max(layer) for layer in record["induction"])


@dataclass(frozen=True)
class Evaluation:
    name: ClassVar[str] = "eval"
    record: dict[str, Any]  # the history's record: step, kind, metrics
    phase_change: dict[str, Any]  # PhaseDetector's answer for the history up to here
    patterns: dict[str, Any] | None = None  # {kind: {"head", "weights" (n, n)}} or None
    circuit: dict[str, Any] | None = None  # what Watch's ``weights_view`` said of the weights

    @property
    def step(self) -> int:
        return int(self.record["step"])

    @property
    def best_induction(self) -> BestHead:
        """The last layer's best induction head (where an induction head can form)."""
        return best_head(self.record, "induction", -1)

    @property
    def best_prev_token(self) -> BestHead:
        """Layer 0's best previous-token head (the induction head's partner)."""
        return best_head(self.record, "prev_token", 0)

    def to_dict(self) -> dict[str, Any]:
        shown = {} if self.patterns is None else {"patterns": self.patterns}
        if self.circuit is not None:
            shown["circuit"] = self.circuit
        return {"event": self.name, **self.record, **shown, "phase_change": self.phase_change}


@dataclass(frozen=True)
class PhaseChange:
    name: ClassVar[str] = "phase_change"
    step: int  # the evaluation at which it was first detected
    phase_change: dict[str, Any]  # the detector's answer then (step, window, found …)

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.name, "step": self.step, "phase_change": self.phase_change}


@dataclass(frozen=True)
class Verdict:
    name: ClassVar[str] = "verdict"
    summary: dict[str, Any]  # a study's result without its history and model

    @property
    def n_layers(self) -> int:
        return int(self.summary["n_layers"])

    @property
    def text(self) -> str:
        return str(self.summary["verdict"]["text"])

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.name, **self.summary}


@dataclass(frozen=True)
class Done:
    name: ClassVar[str] = "done"
    run_id: str
    # how it went, as the server measured it (seconds, steps, threads, text); may be empty
    ending: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.name, "run_id": self.run_id, **self.ending}


@dataclass(frozen=True)
class Cancelled:
    name: ClassVar[str] = "stopped"
    run_id: str
    reason: str  # the stop token's reason
    ending: dict[str, Any] = field(default_factory=dict)  # as Done's

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.name, "run_id": self.run_id, "reason": self.reason, **self.ending}


@dataclass(frozen=True)
class Failed:
    name: ClassVar[str] = "error"
    run_id: str
    detail: str  # the exception, named

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.name, "run_id": self.run_id, "detail": self.detail}


Event = Start | Step | Evaluation | PhaseChange | Verdict | Done | Cancelled | Failed
Listener = Callable[[Event], None]


# ---------------------------------------------------------------------------------------------
# The phase-change detector, one evaluation at a time
# ---------------------------------------------------------------------------------------------

NOT_YET: dict[str, Any] = {"step": None, "window": None, "found": False}


class PhaseDetector:
    """The steepest fall of the in-context gain g = repeated_loss − first_copy_loss (smoothed
    over 3 points) and whether an induction head formed with it, for the history so far.

    A new point changes only the last two smoothed values (the last one is a 2-point mean until
    its right neighbour arrives), so only the last slope is provisional: the steepest settled
    slope is kept, the provisional one compared with it, and the window walked out from the
    steepest. The answer for a prefix may still move (window, found) as points arrive.
    """

    def __init__(self, ceiling: float) -> None:
        self.ceiling = ceiling  # an ideal induction head's score on the probe
        self.steps: list[int] = []
        self.gain: list[float] = []  # g per evaluation
        self.smooth: list[float] = []  # g averaged with its neighbours
        self.slopes: list[float] = []  # smoothed g's change per step between evaluations
        self.best: list[float] = []  # the best head's induction score per evaluation
        self.settled: int | None = None  # the steepest final slope (the first of equals)
        self.phase: dict[str, Any] = dict(NOT_YET)

    def add(self, record: dict[str, Any]) -> dict[str, Any]:
        """Take the next evaluation record; the answer for the history up to it."""
        self.steps.append(record["step"])
        self.gain.append(record["repeated_loss"] - record["first_copy_loss"])
        self.best.append(best_induction(record))
        n = len(self.gain)
        if n >= 2:
            self.smooth[n - 2] = self._mean_at(n - 2)  # now with its right neighbour
        self.smooth.append(self._mean_at(n - 1))
        if n >= 3:
            self.slopes[n - 3] = self._slope(n - 3)  # final from here on
            if self.settled is None or self.slopes[n - 3] < self.slopes[self.settled]:
                self.settled = n - 3
        if n >= 2:
            self.slopes.append(self._slope(n - 2))
        if self.settled is not None:  # three points or more
            self.phase = self._answer(record, self.settled)
        return self.phase

    def _mean_at(self, i: int) -> float:
        return statistics.fmean(self.gain[max(0, i - 1) : i + 2])

    def _slope(self, i: int) -> float:
        return (self.smooth[i + 1] - self.smooth[i]) / (self.steps[i + 1] - self.steps[i])

    def _answer(self, last: dict[str, Any], settled: int) -> dict[str, Any]:
        slopes, smooth, steps, best = self.slopes, self.smooth, self.steps, self.best
        k = len(slopes) - 1 if slopes[-1] < slopes[settled] else settled  # min()'s first of equals
        lo, hi = k, k
        while lo > 0 and slopes[lo - 1] <= 0.5 * slopes[k]:
            lo -= 1
        while hi + 1 < len(slopes) and slopes[hi + 1] <= 0.5 * slopes[k]:
            hi += 1
        final_gain, window_gain = -self.gain[-1], smooth[lo] - smooth[hi + 1]
        rise = best[hi + 1] - best[lo]
        return {
            "step": round((steps[k] + steps[k + 1]) / 2),
            "window": [steps[lo], steps[hi + 1]],
            "steepest_fall_per_1k_steps": -1000 * slopes[k],
            "final_gain": final_gain,
            "window_gain": window_gain,
            "induction_rise": rise,
            "final_induction": best[-1],
            "found": final_gain >= 0.5 * last["first_copy_loss"]
            and window_gain >= 0.25 * final_gain
            and rise >= 0.25 * self.ceiling
            and best[-1] >= 0.5 * self.ceiling,
        }


# ---------------------------------------------------------------------------------------------
# The watch: a reporter and an evaluation hook that send the events
# ---------------------------------------------------------------------------------------------


class Watch:
    """Turns a run's progress into events for ``listener``; pass it to ``train`` as both the
    reporter and (:meth:`evaluate`) the evaluation hook.

    ``measure(model) -> (metrics, weights)``: the evaluation's JSON-able metrics, which must hold
    every head's "induction" and "prev_token" scores ((L, h) lists) and the two losses the
    detector reads, and the attention weights of that same forward, one (B, h, n, n) per layer.
    """

    def __init__(
        self,
        measure: Measure,
        listener: Listener,
        tokens: list[int],
        ceiling: float,
        inner: Reporter | None = None,
        weights_view: Callable[[nn.Module], dict[str, Any]] | None = None,
    ) -> None:
        self.measure, self.listener, self.inner = measure, listener, inner
        # read from the weights alone at each evaluation; rides on the event only, as patterns
        self.weights_view = weights_view
        self.tokens, self.ceiling = tokens, ceiling  # (n,) probe sequence 0; an ideal head's score
        self.detector = PhaseDetector(ceiling)
        self.evaluations = 0
        self.detected: PhaseChange | None = None

    def evaluate(self, model: nn.Module, step: int) -> dict[str, Any]:
        """``train``'s evaluation hook: measure, detect, send the Evaluation (and PhaseChange)."""
        metrics, weights = self.measure(model)
        record = eval_record(step, metrics)
        phase = self.detector.add(record)
        shown = None if self.evaluations % PATTERN_EVERY else _patterns(record, weights)
        self.evaluations += 1
        circuit = None if self.weights_view is None else self.weights_view(model)
        self.listener(Evaluation(record, phase, shown, circuit))
        if phase["found"] and self.detected is None:
            self.detected = PhaseChange(step, phase)
            self.listener(self.detected)
        return metrics

    def start(self, total: int, step: int) -> None:
        if self.inner is not None:
            self.inner.start(total, step)
        self.listener(Start(total, self.tokens, self.ceiling))

    def update(self, step: int, loss: float, lr: float) -> None:
        if self.inner is not None:
            self.inner.update(step, loss, lr)
        if step % STEP_EVENTS == 0:
            self.listener(Step(step, loss))

    def record(self, record: dict[str, Any]) -> None:
        if self.inner is not None:
            self.inner.record(record)

    def message(self, text: str) -> None:
        if self.inner is not None:
            self.inner.message(text)

    def finish(self) -> None:
        if self.inner is not None:
            self.inner.finish()


def _patterns(record: dict[str, Any], weights: Sequence[Tensor]) -> dict[str, Any]:
    """The patterns on probe sequence 0 of the last layer's best induction head and layer 0's
    best previous-token head, rounded to 3 decimals. They ride on the event only: the history
    (and results.json) keeps the scores, not 17 KB of patterns per evaluation."""
    shown = {
        "induction": best_head(record, "induction", -1),
        "prev_token": best_head(record, "prev_token", 0),
    }
    out = {}
    for kind, best in shown.items():
        layer, head = (int(x) for x in best.head.split("."))
        pattern = weights[layer][0, head].float()  # (n, n)
        out[kind] = {"head": best.head, "weights": pattern.round(decimals=3).tolist()}
    return out
