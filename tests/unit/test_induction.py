"""The induction experiment: its data, its measurements against independent routes, and the quick
run asserted on what it found (phase change, induction head, ablation effect, 1-layer control)."""

from __future__ import annotations

import itertools
import json
import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from headlab.cli import app
from headlab.experiments import induction as ind
from headlab.experiments import induction_ablation as ab
from headlab.experiments.registry import experiments
from headlab.files import finite, one_thread
from headlab.heads import induction_mul_score
from headlab.training import watch
from headlab.training.tasks import RepeatTask

# ---------------------------------------------------------------------------------------------
# the data: copies are exact, their offsets are not fixed
# ---------------------------------------------------------------------------------------------


def test_repeat_task_copies_a_segment_at_random_offsets() -> None:
    task = RepeatTask(vocab_size=64, seq_len=32, min_span=4, max_span=12)
    tokens, source, is_copy = task.sample(512, torch.Generator().manual_seed(0))
    assert tokens.shape == source.shape == is_copy.shape == (512, 33)
    assert torch.equal(tokens.gather(1, source), tokens)  # every copy equals its source
    spans = is_copy.sum(1)
    assert spans.min() >= 4 and spans.max() <= 12
    offsets = {int(o) for o in (torch.arange(33) - source)[is_copy]}
    assert len(offsets) >= 20  # no fixed repeat period for a positional head to exploit
    assert min(offsets) >= 4  # a copy never overlaps its source
    inputs, targets = task.batch(8, torch.Generator().manual_seed(0))
    assert torch.equal(inputs[:, 1:], targets[:, :-1])


def test_repeat_task_is_seeded_and_validated() -> None:
    task = RepeatTask()
    a = task.batch(4, torch.Generator().manual_seed(3))[0]
    b = task.batch(4, torch.Generator().manual_seed(3))[0]
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="max_span"):
        RepeatTask(seq_len=10, max_span=8)


# ---------------------------------------------------------------------------------------------
# the measurements, each against a route that does not share its code
# ---------------------------------------------------------------------------------------------


def test_copy_masks_mark_the_same_tokens_in_both_copies() -> None:
    from headlab.measure import copy_targets, icl_positions

    data = ind.held_out(ind.QUICK, seed=0)
    first, later = copy_targets(data.copies.source)
    assert first.sum() == later.sum() > 0
    # the same rows found another way: target k is in the copy when tokens k and k + 1 both are
    is_copy = data.copies.source >= 0
    assert torch.equal(later, is_copy[:, 1:] & is_copy[:, :-1])
    targets = data.copies.tokens[:, 1:]
    for b in range(targets.shape[0]):  # every later-copy target equals its first-copy target
        assert targets[b][first[b]].tolist() == targets[b][later[b]].tolist()
    early, late = icl_positions(ind.QUICK.seq_len)
    assert (early.start, late.start) == (1, 22)  # tokens 50 and 500 of 512, scaled to n = 24


def test_ideal_induction_head_ceiling_by_hand() -> None:
    tokens = torch.tensor([[5, 6, 7, 5, 6, 7]])
    weights = ind.ideal_induction_weights(tokens)
    # rows 3, 4, 5 each have one earlier copy followed by a token: full marks on 3 of 6 rows
    assert float(induction_mul_score(weights, tokens)) == pytest.approx(3 / 6)
    assert torch.allclose(weights.sum(-1), torch.ones(1, 1, 6))


def test_head_mask_ablation_equals_zeroing_that_heads_slice_of_w_o() -> None:
    cfg = ind.QUICK
    model = ind.make_model(cfg, n_layers=2, seed=0)
    data = ind.held_out(cfg, seed=0)
    ablated = ab.ablate(model, data, [(0, 2)])
    d_k = cfg.d_model // cfg.n_heads
    tokens = data.copies.tokens
    with torch.no_grad():
        model.blocks[0].attn.W_O.weight[:, 2 * d_k : 3 * d_k] = 0.0
        logits = model(tokens[:, :-1])
    per_token = F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")
    is_copy = data.copies.source >= 0
    repeated = is_copy[:, 1:] & is_copy[:, :-1]
    assert ablated == pytest.approx(float(per_token[repeated].mean()), rel=1e-5)


def _logistic(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def _curve(step: int, gain: float, induction: float) -> dict:
    """An evaluation record: losses and a 2-layer model's scores (best head 1.0)."""
    return {
        "step": step,
        "first_copy_loss": 4.0,
        "repeated_loss": 4.0 - gain,
        "induction": [[0.05] * 4, [induction, 0.05, 0.05, 0.05]],
    }


def test_phase_change_rule_on_a_known_curve() -> None:
    steps = list(range(0, 2001, 50))
    ceiling = 0.45
    # gain and induction score rise along a logistic centred on step 800 with width 60
    evals = [
        _curve(s, 3.5 * _logistic((s - 800) / 60), 0.05 + 0.37 * _logistic((s - 800) / 60))
        for s in steps
    ]
    phase = ind.find_phase_change(evals, ceiling)
    assert abs(phase["step"] - 800) <= 50
    assert phase["window"][0] < 800 < phase["window"][1]
    assert phase["window"][1] - phase["window"][0] <= 400
    assert phase["found"]
    flat = [_curve(s, 1.0 + s / 4000, 0.05 + 0.37 * s / 2000) for s in steps]
    assert not ind.find_phase_change(flat, ceiling)["found"]  # a slow steady fall is not one


def test_a_loss_drop_without_an_induction_head_is_no_phase_change() -> None:
    """REFERENCES: d_model 32 models dropped their repeated-token loss without forming an
    induction head (0.12-0.14 of ideal), and the old rule still reported a phase change."""
    steps = list(range(0, 1201, 50))
    ceiling = 0.45
    no_head = [_curve(s, 3.0 * _logistic((s - 600) / 40), 0.06) for s in steps]
    phase = ind.find_phase_change(no_head, ceiling)
    assert phase["window"][0] < 600 < phase["window"][1]  # the drop is still located
    assert not phase["found"]
    # an induction head that was already there before the drop did not form in it either
    early = [_curve(s, 3.0 * _logistic((s - 600) / 40), 0.40) for s in steps]
    assert not ind.find_phase_change(early, ceiling)["found"]
    assert not ind.find_phase_change(no_head[:2], ceiling)["found"]  # too few points to tell


def _batch_rule(evals: list[dict], ceiling: float) -> dict:
    """The phase-change rule as first written (main before the watched run): every evaluation
    rescanned. The incremental detector must give exactly this for every prefix."""
    import statistics

    if len(evals) < 3:
        return {"step": None, "window": None, "found": False}
    steps = [r["step"] for r in evals]
    gain = [r["repeated_loss"] - r["first_copy_loss"] for r in evals]
    smooth = [statistics.fmean(gain[max(0, i - 1) : i + 2]) for i in range(len(gain))]
    slopes = [(smooth[i + 1] - smooth[i]) / (steps[i + 1] - steps[i]) for i in range(len(gain) - 1)]
    k = min(range(len(slopes)), key=slopes.__getitem__)
    lo, hi = k, k
    while lo > 0 and slopes[lo - 1] <= 0.5 * slopes[k]:
        lo -= 1
    while hi + 1 < len(slopes) and slopes[hi + 1] <= 0.5 * slopes[k]:
        hi += 1
    final_gain, window_gain = -gain[-1], smooth[lo] - smooth[hi + 1]
    best = [max(max(layer) for layer in r["induction"]) for r in evals]
    rise = best[hi + 1] - best[lo]
    return {
        "step": round((steps[k] + steps[k + 1]) / 2),
        "window": [steps[lo], steps[hi + 1]],
        "steepest_fall_per_1k_steps": -1000 * slopes[k],
        "final_gain": final_gain,
        "window_gain": window_gain,
        "induction_rise": rise,
        "final_induction": best[-1],
        "found": final_gain >= 0.5 * evals[-1]["first_copy_loss"]
        and window_gain >= 0.25 * final_gain
        and rise >= 0.25 * ceiling
        and best[-1] >= 0.5 * ceiling,
    }


def _check_every_prefix(evals: list[dict], ceiling: float) -> list[dict]:
    """The detector fed one record at a time against the batch rule on each prefix; equal
    dicts, floats bit for bit. Returns the answers."""
    detector = watch.PhaseDetector(ceiling)
    answers = []
    for i, record in enumerate(evals):
        got = detector.add(record)
        assert got == _batch_rule(evals[: i + 1], ceiling), f"prefix of {i + 1}"
        answers.append(dict(got))
    assert ind.find_phase_change(evals, ceiling) == _batch_rule(evals, ceiling)
    return answers


def test_the_incremental_detector_equals_the_batch_rule_on_every_prefix_of_the_shipped_run() -> (
    None
):
    from headlab.experiments import results_path

    shipped = json.loads(results_path("induction").read_text())
    ceiling = shipped["induction_ceiling"]
    evals = [r for r in shipped["history"] if r["kind"] == "eval"]
    answers = _check_every_prefix(evals, ceiling)
    assert answers[-1] == shipped["phase_change"]
    control = [r for r in shipped["control_history"] if r["kind"] == "eval"]
    assert _check_every_prefix(control, ceiling)[-1] == shipped["control_phase_change"]
    # the answer for a prefix moves as points arrive: the window changes, "found" turns on
    assert len({tuple(a["window"]) for a in answers if a["window"]}) > 1
    assert [a["found"] for a in answers].index(True) < len(answers) - 1
    steps = list(range(0, 2001, 50))
    curve = [
        _curve(s, 3.5 * _logistic((s - 800) / 60), 0.05 + 0.37 * _logistic((s - 800) / 60))
        for s in steps
    ]
    _check_every_prefix(curve, 0.45)
    ties = [_curve(s, 1.0 if s >= 500 else 0.0, 0.4) for s in steps]  # equal slopes: the first
    _check_every_prefix(ties, 0.45)


def test_shapley_values_of_a_known_game_by_hand() -> None:
    # heads 0 and 1 are both needed (ablating either removes everything); head 2 is idle
    effects = {
        frozenset(s): (1.0 if {0, 1} & set(s) else 0.0)
        for r in range(4)
        for s in itertools.combinations(range(3), r)
    }
    # v({0}) = v({1}) = v({0,1}) = 1: by symmetry each gets 1/2, the idle head 0
    assert ab.shapley(effects, 3) == pytest.approx([0.5, 0.5, 0.0])
    additive = {
        frozenset(s): sum((0.6, 0.3, 0.1)[i] for i in s)
        for r in range(4)
        for s in itertools.combinations(range(3), r)
    }
    assert ab.shapley(additive, 3) == pytest.approx([0.6, 0.3, 0.1])  # additive: own effect


def test_feeder_rule_takes_joint_effects_not_one_heads_threshold() -> None:
    h = 4
    subsets = [frozenset(s) for r in range(h + 1) for s in itertools.combinations(range(h), r)]

    def game(fn):  # effect of ablating subset s
        return {s: fn(s) for s in subsets}

    # REFERENCES' seed 5: head 1 (attends to itself) removes 0.45 alone, the previous-token head
    # 0 only 0.28 (under the old single-head rule's 0.3), both together 0.95
    seed5 = game(lambda s: 0.95 if {0, 1} <= s else 0.45 if 1 in s else 0.28 if 0 in s else 0.05)
    assert ab.choose_feeders(seed5, h) == {0, 1}
    # one head does the job alone: it is the only feeder
    alone = game(lambda s: 0.9 if 2 in s else 0.05 * len(s))
    assert ab.choose_feeders(alone, h) == {2}
    # two redundant heads: either alone removes little, both together most of the gain
    spare = game(lambda s: 0.85 if {0, 3} <= s else 0.1)
    assert ab.choose_feeders(spare, h) == {0, 3}
    # nothing in layer 0 matters: no smaller set qualifies, so all of layer 0 is reported
    assert ab.choose_feeders(game(lambda s: 0.02 * len(s)), h) == frozenset(range(h))


def test_registry_and_results_helpers() -> None:
    known = experiments()
    assert "induction" in known and known["induction"].run is ind.run
    assert known["induction"].options == {"reporter", "listener", "threads"}
    assert known["induction"].summary.startswith("Induction heads")
    assert finite({"a": [float("nan"), 1.0], "b": float("inf")}) == {"a": [None, 1.0], "b": None}


def test_cli_rejects_bad_input_without_a_traceback() -> None:
    runner = CliRunner()
    for args, expect in [
        (["experiment", "nope"], "unknown experiment"),
        (["experiment", "induction", "--seeds", "0"], "'--seeds': Input should be greater"),
        (["experiment", "induction", "--quick", "--ship"], "without --quick"),
        (["train", "nope"], "valid recipes: "),
        (["experiment", "induction", "--threads", "0"], "'--threads': Input should be greater"),
        (["experiment", "prune", "--quick", "--threads", "2"], "--threads is for the induction"),
        (["experiment", "induction", "--verify", "--threads", "2"], "drop --threads"),
    ]:
        result = runner.invoke(app, args)
        assert result.exit_code == 2, args
        assert expect in " ".join(result.output.split()) and "Traceback" not in result.output


def test_run_trains_on_the_threads_asked_for_and_restores_the_count(monkeypatch) -> None:
    """`headlab experiment induction --threads N` trains on N torch threads (the page's runs use
    the server's count), and gives the caller's count back, also when the run fails."""
    seen = []

    def study(*args, **kwargs):
        seen.append(torch.get_num_threads())
        raise RuntimeError("recorded")

    monkeypatch.setattr(ind, "study", study)
    before = torch.get_num_threads()
    for threads in (2, 1):
        with pytest.raises(RuntimeError, match="recorded"):
            ind.run(quick=True, threads=threads)
        assert torch.get_num_threads() == before
    assert seen == [2, 1]
    with pytest.raises(ValueError, match="threads must be at least 1"):
        ind.run(quick=True, threads=0)


# ---------------------------------------------------------------------------------------------
# the quick experiment, asserted on its results (seed fixed)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def quick(induction_quick) -> tuple[dict, Path]:
    """`ind.run(quick=True, seed=0, out=out)` (one thread, its default), and ``out``."""
    results, out, _ = induction_quick(1)
    return results, out


@pytest.mark.slow
def test_quick_run_shows_the_phase_change(quick: tuple[dict, Path]) -> None:
    results, _ = quick
    phase = results["phase_change"]
    assert phase["found"], phase
    lo, hi = phase["window"]
    assert 0 < lo <= results["phase_change_step"] <= hi < ind.QUICK.steps
    evals = [r for r in results["history"] if r["kind"] == "eval"]
    before = [r for r in evals if r["step"] <= lo]
    after = [r for r in evals if r["step"] >= hi]
    # before the window the copies are a little easier than the originals; after, far easier
    gain_before = before[-1]["first_copy_loss"] - before[-1]["repeated_loss"]
    gain_after = after[-1]["first_copy_loss"] - after[-1]["repeated_loss"]
    assert gain_before < 0.5 * gain_after
    assert after[-1]["repeated_loss"] < 0.5 * after[-1]["first_copy_loss"]
    assert results["final"]["icl_score"] < -0.5  # late tokens predicted better than early ones


@pytest.mark.slow
def test_quick_run_finds_the_induction_head_and_its_previous_token_partner(quick) -> None:
    results, _ = quick
    assert results["induction_heads"] and all(
        h.startswith("1.") for h in results["induction_heads"]
    )
    # the live recipe's bar (issue 15): ≥ 0.8 of an ideal head, fed by a ≥ 0.6 previous-token head
    assert results["final_induction_score"] >= 0.8 * results["induction_ceiling"]
    assert any(h.startswith("0.") for h in results["prev_token_heads"])
    assert max(f["prev_token_score"] for f in results["feeder_heads"]) >= 0.6
    assert results["verdict"]["circuit"] and results["seeds"][0]["circuit"]


@pytest.mark.slow
def test_quick_run_ablation_removes_the_gain_only_for_the_feeders(quick) -> None:
    results, _ = quick
    # the rule: the feeders together remove most of the gain, the other layer-0 heads little
    assert results["ablate_feeders_effect"] >= ab.MOST
    assert results["ablate_others_effect"] <= ab.LITTLE
    assert set(results["ablation"]) == {f"{l}.{h}" for l in range(2) for h in range(4)}
    assert len(results["layer0_subsets"]) == 2**4 - 1
    feeders = "+".join(sorted(f["head"] for f in results["feeder_heads"]))
    assert results["layer0_subsets"][feeders] == results["ablate_feeders_effect"]


def _zero_heads_in_w_o(model, heads: list[int], tokens: torch.Tensor) -> torch.Tensor:
    """Per-token losses with layer-0 heads' slices of W_O zeroed: another route to the ablation
    than the head mask the experiment uses."""
    import copy

    clone = copy.deepcopy(model)
    d_k = clone.config.d_model // clone.config.n_heads
    with torch.no_grad():
        for i in heads:
            clone.blocks[0].attn.W_O.weight[:, i * d_k : (i + 1) * d_k] = 0.0
        logits = clone(tokens[:, :-1])
    return F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")


def test_joint_ablations_and_shapley_values_against_zeroed_w_o() -> None:
    with one_thread():
        _check_joint_ablations()


def _check_joint_ablations() -> None:
    cfg = ind.QUICK
    model = ind.make_model(cfg, n_layers=2, seed=1).eval()
    data = ind.held_out(cfg, seed=1)
    is_copy = data.copies.source >= 0
    later = is_copy[:, 1:] & is_copy[:, :-1]
    clean = float(_zero_heads_in_w_o(model, [], data.copies.tokens)[later].mean())
    # an untrained model has no gain to lose: give it a span of 1 nat so effects are losses
    final = {
        "repeated_loss": clean,
        "first_copy_loss": clean + 1.0,
        "prev_token": [[0.0] * 4, [0.0] * 4],
    }
    study = ab.ablation_study(model, data, final)
    for name, effect in study["layer0_subsets"].items():
        heads = [int(x.split(".")[1]) for x in name.split("+")]
        loss = float(_zero_heads_in_w_o(model, heads, data.copies.tokens)[later].mean())
        assert effect == pytest.approx(loss - clean, abs=1e-5), name
    feeders = [int(f["head"][2:]) for f in study["feeder_heads"]]
    loss = float(_zero_heads_in_w_o(model, feeders, data.copies.tokens)[later].mean())
    assert study["ablate_feeders_repeated_loss"] == pytest.approx(loss, abs=1e-5)
    # Shapley values share out exactly the effect of ablating all of layer 0 (efficiency)
    every = study["layer0_subsets"]["0.0+0.1+0.2+0.3"]
    assert sum(study["layer0_shapley"].values()) == pytest.approx(every, abs=1e-6)


@pytest.mark.slow
def test_quick_run_one_layer_control_fails(quick) -> None:
    results, _ = quick
    assert results["control_max_induction_score"] < 0.25 * results["induction_ceiling"]
    control_gain = (
        results["control_final"]["first_copy_loss"] - results["control_final"]["repeated_loss"]
    )
    gain = results["final"]["first_copy_loss"] - results["final"]["repeated_loss"]
    assert control_gain < 0.5 * gain
    assert not results["control_phase_change"]["found"]


@pytest.mark.slow
def test_quick_run_writes_results_and_figures(quick) -> None:
    results, out = quick
    on_disk = json.loads((out / "results.json").read_text())
    for key in (
        "phase_change_step",
        "induction_heads",
        "final_induction_score",
        "control_max_induction_score",
        "ablation",
        "wall_seconds",
        "history",
    ):
        assert key in on_disk
    assert on_disk["induction_heads"] == results["induction_heads"]
    evals = [r for r in on_disk["history"] if r["kind"] == "eval"]
    assert len(evals[-1]["induction"]) == 2 and len(evals[-1]["induction"][1]) == 4
    assert set(on_disk["figures"]) == {"loss.png", "head_scores.png", "patterns.png"}
    for name in on_disk["figures"]:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_cli_train_recipe_ctrl_c_then_resume(tmp_path: Path) -> None:
    """`headlab train induction --quick`: Ctrl-C saves and exits 130; --resume finishes the run."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from headlab.checkpoint import latest_checkpoint
    from headlab.model import Transformer

    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "headlab.cli", "train", "induction", "--quick", "--out", str(out)]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2] / "src"))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while latest_checkpoint(out) is None and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr.decode()
    assert b"--resume" in stderr and b"Traceback" not in stderr
    stopped_at = int(latest_checkpoint(out).name[5:])
    assert 0 < stopped_at < ind.QUICK.steps

    runner = CliRunner()
    again = runner.invoke(app, ["train", "induction", "--quick", "--out", str(out)])
    assert again.exit_code == 2 and "--resume" in again.output  # never overwrites a run
    done = runner.invoke(app, ["train", "induction", "--quick", "--resume", "--out", str(out)])
    assert done.exit_code == 0, done.output
    assert latest_checkpoint(out).name == f"step-{ind.QUICK.steps:06d}"
    model = Transformer.load(out / "model")
    assert model.config.n_layers == 2 and model.config.positional == "rotary"


def test_cli_prints_the_live_progress_events(capsys: pytest.CaptureFixture[str]) -> None:
    from headlab.cli import experiment as cli

    scores = {"induction": [[0.1, 0.2], [0.05, 0.38]], "prev_token": [[0.71, 0.02], [0.1, 0.1]]}
    record = {"step": 300, "kind": "eval", "first_copy_loss": 4.2, "repeated_loss": 1.5, **scores}
    phase = {"step": 275, "window": [250, 300], "found": True}
    cli._print_event(watch.Evaluation(record, phase))
    cli._print_event(watch.Evaluation({**record, "step": 350}, phase))  # between the hundreds
    cli._print_event(watch.Step(300, 2.5))  # steps: the progress bar's, not a line
    cli._print_event(watch.PhaseChange(300, phase))
    cli._print_event(watch.Verdict({"n_layers": 2, "verdict": {"text": "It formed."}}))
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "step   300  loss first copy 4.200, repeated 1.500  best induction 1.1 0.380  "
        "best previous-token 0.0 0.710",
        "phase change detected at step 300: window 250–300",
        "2 layer(s): It formed.",
    ]


def test_events_serialise_to_the_json_the_page_reads() -> None:
    """The SSE data of each event: the names and fields live-train.js and the tests read."""
    record = {
        "step": 50,
        "kind": "eval",
        "first_copy_loss": 4.0,
        "repeated_loss": 3.0,
        "induction": [[0.1, 0.3]],
        "prev_token": [[0.6, 0.2]],
        "wall": 1.5,
    }
    phase = {"step": None, "window": None, "found": False}
    shown = {"induction": {"head": "0.1", "weights": [[1.0]]}}
    assert watch.Evaluation(record, phase, shown).to_dict() == {
        "event": "eval",
        **record,
        "patterns": shown,
        "phase_change": phase,
    }
    assert "patterns" not in watch.Evaluation(record, phase).to_dict()
    assert watch.Start(700, [1, 2], 0.4).to_dict() == {
        "event": "start",
        "total": 700,
        "tokens": [1, 2],
        "ceiling": 0.4,
    }
    assert watch.Step(10, 3.5).to_dict() == {"event": "step", "step": 10, "loss": 3.5}
    assert watch.Done("ab").to_dict() == {"event": "done", "run_id": "ab"}
    assert watch.Cancelled("ab", "cancelled").to_dict() == {
        "event": "stopped",
        "run_id": "ab",
        "reason": "cancelled",
    }
    assert watch.Failed("ab", "E: x").to_dict() == {
        "event": "error",
        "run_id": "ab",
        "detail": "E: x",
    }
    verdict = {"n_layers": 1, "verdict": {"text": "No."}, "final": {}}
    assert watch.Verdict(verdict).to_dict() == {"event": "verdict", **verdict}
    for event in (watch.Start(1, [], 0.0), watch.Evaluation(record, phase), watch.Done("a")):
        assert event.to_dict()["event"] == event.name
    ev = watch.Evaluation(record, phase)
    assert (ev.best_induction, ev.best_prev_token) == (
        watch.BestHead("0.1", 0.3),
        watch.BestHead("0.0", 0.6),
    )


def test_live_events_carry_the_patterns_and_the_history_keeps_only_scores() -> None:
    """The two heads' patterns ride on every PATTERN_EVERY-th eval event (the page draws them)
    and equal the model's own at that step (run_patterns, a separate forward, as the oracle);
    the training history, which results.json keeps, has the scores alone (the shipped run's
    file too); each evaluation's phase change is the batch rule's on the history so far."""
    from dataclasses import replace

    from headlab.experiments import results_path
    from headlab.measure import run_patterns

    cfg = replace(ind.LIVE, steps=50, eval_every=25)
    events: list = []
    with one_thread():
        r = ind.study(cfg, 2, seed=3, listener=events.append)
    assert r is not None
    assert [type(e) for e in events[:3]] == [watch.Start, watch.Evaluation, watch.Step]
    assert isinstance(events[-1], watch.Verdict) and events[-1].to_dict()["verdict"] == r["verdict"]
    evals = [e.to_dict() for e in events if isinstance(e, watch.Evaluation)]
    history = [x for x in r["history"] if x["kind"] == "eval"]
    assert [e["step"] for e in evals] == [x["step"] for x in history]
    assert [
        {k: v for k, v in e.items() if k not in ("event", "patterns", "phase_change")}
        for e in evals
    ] == history
    for i, e in enumerate(evals):
        assert e["phase_change"] == _batch_rule(history[: i + 1], r["induction_ceiling"])
    assert all("patterns" not in x for x in r["history"])
    carried = [i for i, e in enumerate(evals) if "patterns" in e]
    assert carried == [i for i in range(len(evals)) if i % watch.PATTERN_EVERY == 0]
    last = evals[-1]
    assert "patterns" in last, "the run's length leaves the last evaluation without patterns"
    data = ind.held_out(cfg, seed=3)
    want = run_patterns(r["_model"], data.inputs[:1])[:, 0]  # (L, h, n, n), the final model
    for shown in last["patterns"].values():
        layer, head = (int(x) for x in shown["head"].split("."))
        got = torch.tensor(shown["weights"])
        torch.testing.assert_close(got, want[layer, head], atol=5e-4, rtol=0)
    shipped = json.loads(results_path("induction").read_text())
    assert all("patterns" not in x for x in shipped["history"] + shipped["control_history"])


def test_a_stop_token_ends_a_study_between_steps_without_raising() -> None:
    """A stop token set from the listener (as the page's Cancel button sets it from another
    thread) ends the run after the step it arrives in: no verdict, None returned."""
    from headlab.training.train import StopToken

    token = StopToken()
    events: list = []

    def listen(event: object) -> None:
        events.append(event)
        if isinstance(event, watch.Step) and event.step == 20:
            token.stop("cancelled")

    with one_thread():
        assert ind.study(ind.LIVE, 1, seed=0, listener=listen, stop=token) is None
    steps = [e.step for e in events if isinstance(e, watch.Step)]
    assert steps == [10, 20] and token.reason == "cancelled"
    assert not [e for e in events if isinstance(e, watch.Verdict)]


@pytest.mark.slow
def test_the_detector_equals_the_batch_rule_on_a_quick_run(quick) -> None:
    results, _ = quick
    for history in (results["history"], results["control_history"]):
        evals = [r for r in history if r["kind"] == "eval"]
        _check_every_prefix(evals, results["induction_ceiling"])


@pytest.mark.parametrize("scores", [[0.9, 0.1, 0.7, 0.8], [0.1, 0.1, 0.95, 0.1]])
def test_the_verdict_counts_and_names_every_induction_head_the_run_labels(scores) -> None:
    """The verdict names as many induction heads as the run's labels found (the page's text
    said one when three had formed), the strongest named as the one its share is of."""
    ceiling = 1.0
    final = {"induction": [[0.0] * 4, scores], "prev_token": [[0.9, 0.1, 0.1, 0.1], [0.0] * 4]}
    labelled = ind.label_heads(final, ceiling)["induction"]
    r = {
        "final_induction_score": max(scores),
        "induction_ceiling": ceiling,
        "phase_change": {"found": True, "window": [100, 140]},
        "n_layers": 2,
        "induction_heads": labelled,
        "final": final,
        "feeder_heads": [{"head": "0.0", "prev_token_score": 0.9}],
        "ablate_feeders_effect": 0.8,
        "ablate_others_effect": 0.1,
    }
    text = ind.verdict(r)["text"]
    named = set(re.findall(r"\b1\.\d\b", text.split(" at steps")[0]))
    assert named == set(labelled)
    best = f"1.{scores.index(max(scores))}"
    assert ind.verdict(r)["induction_head"] == best
    if len(labelled) > 1:
        assert f"{['', 'One', 'Two', 'Three'][len(labelled)]} induction heads" in text
        assert f"the strongest, {best}, reaches" in text
