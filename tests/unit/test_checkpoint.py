"""headlab.checkpoint against a hand-edited state.json (issue 18, item 4): every edit is refused
before anything is loaded, the refusal names the intact checkpoint that remains, and following it
resumes exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_train import _assert_same, _config, _final_weights, _weights, batches, make_model

from headlab.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint, state_digest
from headlab.training.train import train


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 14-step run with checkpoints at steps 7 and 14 (keep_checkpoints=2)."""
    out = tmp_path_factory.mktemp("run")
    train(make_model(0), _config(steps=14), batches, out_dir=out)
    assert sorted(p.name for p in (out / "checkpoints").glob("step-*")) == [
        "step-000007",
        "step-000014",
    ]
    return out


def _copy(run: Path, tmp_path: Path) -> Path:
    import shutil

    shutil.copytree(run, tmp_path / "run")
    return tmp_path / "run"


def _edit_state(out: Path, edit) -> None:
    path = latest_checkpoint(out) / "state.json"
    state = json.loads(path.read_text())
    path.write_text(json.dumps(edit(state)))


def _refused_untouched(out: Path, match: str) -> CheckpointError:
    """Resume must raise CheckpointError matching ``match`` and change neither the model's
    weights nor torch's global RNG (beyond train's own seeding with config.seed = 0)."""
    model = make_model(3)
    torch.manual_seed(0)
    before, rng = _weights(model), torch.get_rng_state()
    with pytest.raises(CheckpointError, match=match) as err:
        train(model, _config(steps=14), batches, out_dir=out, resume=True)
    _assert_same(_weights(model), before)
    assert torch.equal(torch.get_rng_state(), rng)
    return err.value


def _set(key: str, value):
    return lambda state: {**state, key: value}


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda s: None, "should hold an object, got NoneType"),
        (lambda s: [s], "should hold an object, got list"),
        (_set("step", "abc"), r"field 'step' should be a whole number >= 0, got \"abc\""),
        (_set("step", -1), "field 'step' should be a whole number"),
        (_set("step", 9), "altered"),  # a plausible step: only the hash tells
        (_set("rng", {"data": "not base64!", "torch": "AAAA"}), "altered"),
        (
            lambda s: {**s, "files": {**s["files"], "model.safetensors": {"sha256": "0" * 64}}},
            "field 'files' should be",
        ),
        (lambda s: {k: v for k, v in s.items() if k != "optimizer"}, "lacks the field 'optimizer'"),
        (_set("format", 1), "format 1; this headlab reads format 2"),
        (_set("loss_sum", float("nan")), "field 'loss_sum' should be a finite number"),
    ],
    ids=[
        "null",
        "list",
        "step-abc",
        "step-negative",
        "step-14-to-9",
        "rng",
        "files-no-bytes",
        "no-optimizer",
        "old-format",
        "nan",
    ],
)
def test_hand_edited_state_is_refused_before_anything_loads(run, tmp_path, edit, match) -> None:
    out = _copy(run, tmp_path)
    _edit_state(out, edit)
    err = _refused_untouched(out, match)
    assert "step-000014" in str(err)  # names the checkpoint it refuses
    assert "the intact checkpoint step-000007 remains" in str(err)


def test_a_bad_rng_state_with_a_valid_hash_is_refused_before_the_weights(run, tmp_path) -> None:
    """Even with the hash recomputed (a tool rewrote the file), an RNG state that is not one is
    refused while verifying, not after the weights were loaded."""
    out = _copy(run, tmp_path)

    def bad_rng(state):
        state = {**state, "rng": {**state["rng"], "torch": "AAAA"}}
        return {**state, "sha256": state_digest(state)}

    _edit_state(out, bad_rng)
    _refused_untouched(out, "'torch' RNG state is not a torch RNG state")


def test_following_the_hint_resumes_exactly(run, tmp_path) -> None:
    """Step 14 edited to 9 is refused; pointing `latest` at the intact step 7, as the message
    says, resumes and ends bit-identical with an uninterrupted run."""
    out = _copy(run, tmp_path)
    _edit_state(out, _set("step", 9))
    err = _refused_untouched(out, "altered")
    pointer = out / "checkpoints" / "latest"
    assert f"write step-000007 into {pointer}" in str(err)
    pointer.write_text("step-000007")
    resumed = make_model(5)
    result = train(resumed, _config(steps=14), batches, out_dir=out, resume=True)
    assert result.step == 14
    _assert_same(_weights(resumed), _final_weights(run))


def test_no_intact_checkpoint_is_said_too(run, tmp_path) -> None:
    out = _copy(run, tmp_path)
    for ck in (out / "checkpoints").glob("step-*"):
        (ck / "state.json").write_text("null")
    err = _refused_untouched(out, "should hold an object")
    assert "no other intact checkpoint remains" in str(err)


# JSON values, small: what a hand or a tool might write into any field
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_any_edit_of_state_json_is_refused_or_changes_nothing(run, data) -> None:
    """Property: replace any field (or a field inside one) of state.json with any JSON value;
    loading either refuses with CheckpointError or, when the value was the same, loads the
    same state. No other exception, ever."""
    path = latest_checkpoint(run) / "state.json"
    original = path.read_text()
    state = json.loads(original)
    key = data.draw(st.sampled_from(sorted(state)), label="field")
    edited = dict(state)
    if isinstance(state[key], dict) and state[key] and data.draw(st.booleans(), label="inner"):
        inner = data.draw(st.sampled_from(sorted(state[key])), label="inner field")
        edited[key] = {**state[key], inner: data.draw(_json, label="value")}
    else:
        edited[key] = data.draw(_json, label="value")
    try:
        path.write_text(json.dumps(edited))
        try:
            ck = load_checkpoint(run)
        except CheckpointError:
            return
        assert ck.state == state  # loaded: then nothing was changed
    finally:
        path.write_text(original)
