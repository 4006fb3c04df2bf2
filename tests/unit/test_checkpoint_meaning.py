"""Checkpoints checked by meaning, not by hash alone (issue 24): state.json's SHA-256 is of its
own content, so anyone can recompute it. Each test here forges one kind of edit the way a tool
would (state.json and the tensor files rewritten, every hash recomputed, the folder and
``latest`` renamed to match) and expects a refusal in one sentence naming the field, before
anything is loaded: no traceback, no silently different weights.

On the code before this change 10 of these edit kinds were accepted (3 of them change the final
weights) and 4 raised tracebacks.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load as load_bytes
from safetensors.torch import save as save_bytes
from test_train import _assert_same, _config, _StopAt, _weights, batches, make_model

from headlab.checkpoint import CheckpointError, latest_checkpoint, state_digest
from headlab.training.train import StopToken, train

Tensors = dict[str, torch.Tensor]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 14-step run of the tiny model stopped after step 10: checkpoints at steps 7 and 10, so
    a resume takes 4 more optimizer steps (an edit that changes them shows, or raises)."""
    out = tmp_path_factory.mktemp("run")
    token = StopToken()
    train(
        make_model(0),
        _config(steps=14),
        batches,
        out_dir=out,
        reporter=_StopAt(token, 10),
        stop=token,
    )
    assert latest_checkpoint(out).name == "step-000010"
    return out


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> Tensors:
    """The final weights of the same run, uninterrupted."""
    model = make_model(0)
    train(model, _config(steps=14), batches, out_dir=tmp_path_factory.mktemp("whole"))
    return _weights(model)


def _forge(
    run: Path,
    tmp_path: Path,
    state: Callable[[dict[str, Any]], dict[str, Any]] = lambda s: s,
    tensors: dict[str, Callable[[Tensors], Tensors]] | None = None,
) -> Path:
    """A copy of ``run`` whose newest checkpoint is edited as a careful forger would: tensor
    files rewritten with their sizes and hashes updated, state.json's own hash recomputed, and
    the folder and ``latest`` renamed when the step changed."""
    out = tmp_path / "run"
    shutil.copytree(run, out)
    folder = latest_checkpoint(out)
    data = json.loads((folder / "state.json").read_text())
    for fname, edit in (tensors or {}).items():
        blob = save_bytes(edit(load_bytes((folder / fname).read_bytes())))
        (folder / fname).write_bytes(blob)
        data["files"][fname] = {"bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
    data = state(data)
    data["sha256"] = state_digest(data)
    (folder / "state.json").write_text(json.dumps(data))
    name = f"step-{data['step']:06d}" if isinstance(data.get("step"), int) else folder.name
    if name != folder.name:
        folder.rename(folder.with_name(name))
        (out / "checkpoints" / "latest").write_text(name)
    return out


def _refused(out: Path, match: str, steps: int = 14) -> str:
    """Resuming must raise CheckpointError matching ``match``, in one line, leaving the model's
    weights and torch's global RNG as they were."""
    model = make_model(3)
    torch.manual_seed(0)
    before, rng = _weights(model), torch.get_rng_state()
    with pytest.raises(CheckpointError, match=match) as err:
        train(model, _config(steps=steps), batches, out_dir=out, resume=True)
    _assert_same(_weights(model), before)
    assert torch.equal(torch.get_rng_state(), rng)
    assert "\n" not in str(err.value)
    return str(err.value)


def _group(i: int, **fields: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """An edit of the optimizer's param group ``i``."""

    def edit(s: dict[str, Any]) -> dict[str, Any]:
        s["optimizer"]["param_groups"][i].update(fields)
        return s

    return edit


def _set(**fields: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda s: {**s, **fields}


def _tensor(name: str, change: Callable[[torch.Tensor], torch.Tensor | None]):
    """An edit of one tensor of a safetensors file; ``change`` returning None removes it."""

    def edit(tensors: Tensors) -> Tensors:
        out = dict(tensors)
        new = change(out.pop(name))
        return out if new is None else {**out, name: new.contiguous()}

    return edit


def _flip_bits(index: int, how: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """Flip bits of the float32 at ``index`` (little-endian: byte 3 holds the sign and the top
    of the exponent): "nan" sets the exponent to all ones with a mantissa bit, "sign" negates."""

    def change(t: torch.Tensor) -> torch.Tensor:
        raw = t.detach().clone().flatten().view(torch.uint8)
        if how == "nan":
            raw[4 * index + 3] |= 0x7F
            raw[4 * index + 2] |= 0xC0
        else:
            raw[4 * index + 3] ^= 0x80
        return raw.view(torch.float32).view(t.shape)

    return change


# --- the three edits that changed the final weights -------------------------------------------


def test_weight_decay_unlike_the_runs_config_is_refused(run, tmp_path) -> None:
    out = _forge(run, tmp_path, state=_group(0, weight_decay=0.5))
    _refused(out, r"param group 0 'weight_decay' is 0\.5.*0\.01")


def test_a_step_renamed_with_its_folder_and_latest_is_refused(run, tmp_path) -> None:
    """step 10 → 8, the folder renamed step-000008 and ``latest`` updated: the optimizer's own
    step counters still say 10."""
    out = _forge(run, tmp_path, state=_set(step=8))
    assert (out / "checkpoints" / "latest").read_text() == "step-000008"
    msg = _refused(out, r"'0\.step' is 10.*step 8")
    assert "the intact checkpoint step-000007 remains" in msg


@pytest.mark.parametrize(
    ("fname", "name", "how", "match"),
    [
        ("model.safetensors", "out.bias", "nan", r"'out\.bias' holds a value that is not finite"),
        ("optimizer.safetensors", "1.exp_avg_sq", "sign", r"'1\.exp_avg_sq' holds a negative"),
    ],
    ids=["weight-becomes-nan", "second-moment-negative"],
)
def test_a_flipped_tensor_byte_that_breaks_meaning_is_refused(
    run, tmp_path, fname, name, how, match
) -> None:
    """A tensor byte flipped and every hash updated: refused where the value can say so (not
    finite; an Adam second moment below 0)."""
    out = _forge(run, tmp_path, tensors={fname: _tensor(name, _flip_bits(0, how))})
    _refused(out, match)


def test_a_plausible_forged_weight_is_out_of_scope(run, whole, tmp_path) -> None:
    """The documented limit (headlab.checkpoint's docstring): a weight changed to another
    finite value, every hash recomputed, is a valid checkpoint of *some* run; the hashes catch
    corruption, not a deliberate forgery by someone who can write the run folder."""
    out = _forge(run, tmp_path, tensors={"model.safetensors": _tensor("out.bias", lambda t: -t)})
    model = make_model(3)
    train(model, _config(steps=14), batches, out_dir=out, resume=True)
    assert not torch.equal(model.out.bias, whole["out.bias"])


# --- the four edits that gave tracebacks ----------------------------------------------------


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (_group(0, betas=[0.9]), r"param group 0 field 'betas' should be two numbers in \[0, 1\)"),
        (_group(1, eps="x"), r"param group 1 field 'eps' should be a finite number >= 0"),
        (
            lambda s: {**s, "optimizer": {**s["optimizer"], "scalars": {"0": {"step": "abc"}}}},
            r"optimizer scalar '0\.step' should be a finite number",
        ),
    ],
    ids=["betas-one-number", "eps-text", "scalar-step-text"],
)
def test_optimizer_meta_of_the_wrong_type_is_refused(run, tmp_path, edit, match) -> None:
    out = _forge(run, tmp_path, state=edit)
    msg = _refused(out, match)
    assert "the intact checkpoint step-000007 remains" in msg


def test_a_missing_adam_moment_is_refused(run, tmp_path) -> None:
    out = _forge(
        run, tmp_path, tensors={"optimizer.safetensors": _tensor("0.exp_avg", lambda t: None)}
    )
    _refused(out, r"parameter 0 lacks the optimizer state 'exp_avg'")


# --- a representative set of the others -------------------------------------------------------


def _swap_params(s: dict[str, Any]) -> dict[str, Any]:
    # parameters 0 and 1 (embed.weight, out.weight) have the same shape: only the order tells
    s["optimizer"]["param_groups"][0]["params"] = [1, 0]
    return s


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (_group(0, lr=0.05), r"param group 0 'lr' is 0\.05; this run's schedule gives 0\.0314"),
        (_group(0, decoupled_weight_decay=False), r"'decoupled_weight_decay' is False.*True"),
        (_group(1, amsgrad=True), r"parameter 2 lacks the optimizer state 'max_exp_avg_sq'"),
        (_group(0, foreach="x"), r"field 'foreach' should be true, false or null"),
        (_swap_params, r"param group 0 'params' is \[1, 0\].*\[0, 1\]"),
        (
            lambda s: {**s, "optimizer": {**s["optimizer"], "scalars": {"2": {"step": 3}}}},
            r"optimizer scalar '2\.step' duplicates",
        ),
        (_set(loss_count=20), r"field 'loss_count' is 20, more than the checkpoint's step 10"),
        (_set(loss_sum=1.5), r"field 'loss_sum' is 1\.5 while 'loss_count' is 0"),
        (_set(elapsed=-1.0), r"field 'elapsed' should be a number of seconds >= 0"),
        (_set(comment="hi"), r"has an unknown field 'comment'"),
        (lambda s: {**s, "config": {**s["config"], "log_every": "x"}}, r"config 'log_every'"),
        (lambda s: {**s, "config": {**s["config"], "extra": 1}}, r"config has an unknown.*extra"),
        (lambda s: {**s, "rng": {**s["rng"], "more": "AAAA"}}, r"field 'rng' should be"),
    ],
    ids=[
        "lr-off-schedule",
        "adam-not-adamw",
        "amsgrad",
        "foreach-text",
        "params-swapped",
        "scalar-step-duplicate",
        "loss-count",
        "loss-sum",
        "elapsed",
        "unknown-field",
        "bookkeeping-text",
        "config-extra",
        "rng-extra",
    ],
)
def test_other_state_edits_are_refused(run, tmp_path, edit, match) -> None:
    out = _forge(run, tmp_path, state=edit)
    _refused(out, match)


@pytest.mark.parametrize(
    ("name", "change", "match"),
    [
        ("2.step", lambda t: t - 1, r"'2\.step' is 9\.0.*step 10"),
        ("0.exp_avg", lambda t: t.T, r"'0\.exp_avg' has shape \[12, 16\].*\[16, 12\]"),
        ("1.exp_avg", lambda t: t.double(), r"'1\.exp_avg' is float64.*float32"),
        ("2.exp_avg", lambda t: t.unsqueeze(0), r"'2\.exp_avg' has shape \[1, 16\].*\[16\]"),
    ],
    ids=["step-counter", "moment-transposed", "moment-dtype", "moment-shape"],
)
def test_optimizer_tensor_edits_are_refused(run, tmp_path, name, change, match) -> None:
    out = _forge(run, tmp_path, tensors={"optimizer.safetensors": _tensor(name, change)})
    _refused(out, match)


def test_a_step_beyond_the_runs_length_is_refused(run, tmp_path) -> None:
    """Every counter moved to step 20 consistently (state, folder, optimizer) in a 14-step run."""

    def counters(tensors: Tensors) -> Tensors:
        return {k: v.fill_(20.0) if k.endswith(".step") else v for k, v in tensors.items()}

    out = _forge(run, tmp_path, state=_set(step=20), tensors={"optimizer.safetensors": counters})
    _refused(out, r"step 20 is beyond the run's 14 steps")


def test_an_unedited_checkpoint_still_resumes_exactly(run, whole, tmp_path) -> None:
    """The forger's pipeline with no edit changes nothing: the copy resumes and ends
    bit-identical with the uninterrupted run."""
    out = _forge(run, tmp_path)
    resumed = make_model(5)
    result = train(resumed, _config(steps=14), batches, out_dir=out, resume=True)
    assert result.step == 14
    _assert_same(_weights(resumed), whole)


# --- a failed resume leaves no folder behind --------------------------------------------------


def test_a_refused_resume_into_a_new_folder_creates_nothing(tmp_path) -> None:
    new = tmp_path / "no-such-run"
    with pytest.raises(CheckpointError, match="no checkpoint"):
        train(make_model(0), _config(steps=7), batches, out_dir=new, resume=True)
    assert not new.exists()
    nested = tmp_path / "a" / "b"
    with pytest.raises(CheckpointError, match="no checkpoint"):
        train(make_model(0), _config(steps=7), batches, out_dir=nested, resume=True)
    assert not (tmp_path / "a").exists()
