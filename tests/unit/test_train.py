"""headlab.training.train: the schedule and AdamW against torch's own, determinism, metrics,
checkpoints
written atomically, exact resume after SIGKILL and Ctrl-C, corrupt checkpoints refused."""

from __future__ import annotations

import io
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from headlab.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint
from headlab.cli.support import LogReporter
from headlab.training.train import StopToken, TrainConfig, lr_at, read_metrics, train

V, N, B = 16, 6, 8  # vocabulary, sequence length, batch of the tiny task

# The tiny model and task, shared verbatim by the in-process tests and the worker subprocesses.
TINY = textwrap.dedent(
    """
    import torch
    from torch import nn

    V, N, B = 16, 6, 8

    class Tiny(nn.Module):
        '''Embedding, dropout (exercises the global RNG), linear: learns next = (3x + 1) % V.'''

        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(V, 12)
            self.drop = nn.Dropout(0.1)
            self.out = nn.Linear(12, V)

        def forward(self, x):
            return self.out(self.drop(self.embed(x)))

    def batches(generator):
        inputs = torch.randint(0, V, (B, N), generator=generator)
        return inputs, (3 * inputs + 1) % V

    def make_model(seed=0):
        torch.manual_seed(seed)
        return Tiny()
    """
)
_ns: dict = {}
exec(TINY, _ns)
make_model, batches = _ns["make_model"], _ns["batches"]

WORKER = textwrap.dedent(
    """
    import os, sys, time, signal
    import torch
    torch.set_num_threads(1)
    sys.path.insert(0, os.path.dirname(__file__))
    from tiny import make_model, batches
    import headlab.checkpoint as C
    import headlab.files as F
    import headlab.training.train as T

    out, steps, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    delay = float(os.environ.get("STEP_DELAY", "0"))

    def slow_batches(g):
        time.sleep(delay)
        return batches(g)

    if mode == "die-in-save":  # SIGKILL halfway through writing the 2nd checkpoint's files
        real = F._write_file
        def write(path, blob):
            if "step-000014" in str(path) and path.name == "optimizer.safetensors":
                with open(path, "wb") as f:
                    f.write(blob[: len(blob) // 2])
                os.kill(os.getpid(), signal.SIGKILL)
            real(path, blob)
        F._write_file = write
    if mode.startswith("die-before"):  # SIGKILL after a checkpoint dir is renamed in place,
        # before `latest` names it: the 2nd checkpoint's, or the 1st's (no `latest` yet)
        name = b"step-000007" if mode == "die-before-first-latest" else b"step-000014"
        real_replace = C.write_atomic
        def replace(path, blob):
            if path.name == "latest" and blob == name:
                os.kill(os.getpid(), signal.SIGKILL)
            real_replace(path, blob)
        C.write_atomic = replace

    config = T.TrainConfig(steps=steps, lr=0.05, warmup_steps=5, checkpoint_every=7,
                           log_every=5, eval_every=0)
    result = T.train(make_model(), config, slow_batches, out_dir=out,
                     resume=(mode == "resume"))
    print("INTERRUPTED" if result.interrupted else "DONE", result.step, flush=True)
    """
)


def _config(**kw) -> TrainConfig:
    base = dict(steps=30, lr=0.05, warmup_steps=5, checkpoint_every=7, log_every=5, eval_every=0)
    return TrainConfig(**(base | kw))


def _weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs"


def _final_weights(out: Path) -> dict[str, torch.Tensor]:
    path = latest_checkpoint(out)
    assert path is not None
    return load_file(str(path / "model.safetensors"))


# ---------------------------------------------------------------------------------------------
# the schedule and the optimizer, against torch's own implementations
# ---------------------------------------------------------------------------------------------


def test_schedule_matches_torch_cosine_annealing_after_linear_warmup() -> None:
    config = TrainConfig(steps=100, lr=2e-3, warmup_steps=10, min_lr_ratio=0.1)
    p = nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=config.lr)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=90, eta_min=2e-4)
    for step in range(10):
        assert lr_at(config, step) == pytest.approx(2e-3 * (step + 1) / 10)
    for step in range(10, 100):
        assert lr_at(config, step) == pytest.approx(opt.param_groups[0]["lr"], rel=1e-9)
        opt.step()
        cosine.step()
    assert lr_at(config, 9) == pytest.approx(config.lr)  # the peak ends warm-up
    assert lr_at(config, 99) == pytest.approx(2e-4, rel=0.01)  # the floor


def test_train_is_adamw_with_the_schedule_step_for_step() -> None:
    """Oracle: a hand-written loop with torch's AdamW and LambdaLR on the same batches."""
    config = _config(steps=25, grad_clip=0.0, weight_decay=0.1)
    model = make_model(0)
    model.drop.p = 0.0
    reference = make_model(0)
    reference.drop.p = 0.0
    train(model, config, batches)

    decay = [p for p in reference.parameters() if p.dim() >= 2]
    rest = [p for p in reference.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
        lr=config.lr,
        betas=(config.beta1, config.beta2),
    )

    def factor(step: int) -> float:
        if step < 5:
            return (step + 1) / 5
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - 5) / 20))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    generator = torch.Generator().manual_seed(config.seed)
    for _ in range(config.steps):
        inputs, targets = batches(generator)
        loss = F.cross_entropy(reference(inputs).flatten(0, 1), targets.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    ours, theirs = model.state_dict(), reference.state_dict()
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-5, atol=1e-6, msg=name)


def test_training_learns_and_is_deterministic() -> None:
    first, second, other = make_model(0), make_model(0), make_model(0)
    result = train(first, _config(steps=60), batches)
    train(second, _config(steps=60), batches)
    train(other, _config(steps=60, seed=1), batches)
    _assert_same(_weights(first), _weights(second))
    assert not torch.equal(first.out.weight, other.out.weight)
    losses = [r["loss"] for r in result.records("train")]
    assert losses[-1] < 0.2 * losses[0]  # the map (3x + 1) % V is learnable exactly
    assert [r["step"] for r in result.records("train")] == list(range(5, 61, 5))


def test_evaluation_hook_runs_on_schedule_and_does_not_change_training() -> None:
    seen: list[int] = []

    def evaluate(model: nn.Module, step: int) -> dict:
        seen.append(step)
        assert not model.training and not torch.is_grad_enabled()
        torch.rand(100)  # draws from the global RNG: training must not notice
        return {"weight_norm": float(model.out.weight.norm())}

    with_eval, without = make_model(0), make_model(0)
    result = train(with_eval, _config(steps=23, eval_every=10), batches, evaluate=evaluate)
    train(without, _config(steps=23), batches)
    assert seen == [0, 10, 20, 23]
    assert [r["step"] for r in result.records("eval")] == seen
    _assert_same(_weights(with_eval), _weights(without))


def test_metrics_file_and_log_reporter(tmp_path: Path) -> None:
    stream = io.StringIO()
    config = _config(steps=12, eval_every=6)
    result = train(
        make_model(0),
        config,
        batches,
        evaluate=lambda m, s: {"step_seen": s},
        out_dir=tmp_path,
        reporter=LogReporter(stream, every=5),
    )
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert records == result.history
    assert [(r["kind"], r["step"]) for r in records] == [
        ("eval", 0),
        ("train", 5),
        ("eval", 6),
        ("train", 10),
        ("train", 12),
        ("eval", 12),
    ]
    text = stream.getvalue()
    assert "step 5/12" in text and "steps/s" in text and "eta" in text and "step 12/12" in text


def test_reporters_pick_bar_or_lines_and_draw_the_bar() -> None:
    from rich.console import Console

    from headlab.cli.support import RichReporter, make_reporter

    assert isinstance(make_reporter(io.StringIO()), LogReporter)  # not a terminal: log lines
    sink = io.StringIO()
    bar = RichReporter(Console(file=sink, force_terminal=True, width=100))
    train(make_model(0), _config(steps=10), batches, reporter=bar)
    text = sink.getvalue()
    assert "10/10" in text and "steps/s" in text and "loss" in text


def test_nan_loss_is_reported_with_a_fix() -> None:
    model = make_model(0)
    with torch.no_grad():
        model.out.weight.fill_(float("nan"))
    with pytest.raises(FloatingPointError, match="lower the learning rate"):
        train(model, _config(steps=3), batches)


# ---------------------------------------------------------------------------------------------
# checkpoints and resume
# ---------------------------------------------------------------------------------------------


def test_checkpoint_layout_and_pruning(tmp_path: Path) -> None:
    train(make_model(0), _config(steps=30, keep_checkpoints=2), batches, out_dir=tmp_path)
    root = tmp_path / "checkpoints"
    assert (root / "latest").read_text() == "step-000030"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-000028", "step-000030"]
    state = json.loads((root / "step-000030" / "state.json").read_text())
    assert state["step"] == 30 and {"data", "torch"} <= set(state["rng"])
    assert set(state["files"]) == {"model.safetensors", "optimizer.safetensors"}
    assert state["optimizer"]["param_groups"][0]["lr"] == pytest.approx(lr_at(_config(), 29))


def test_resume_after_a_crash_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    whole = make_model(0)
    train(whole, _config(), batches, out_dir=tmp_path / "whole")

    calls = 0

    def crashing(generator: torch.Generator):
        nonlocal calls
        calls += 1
        if calls == 18:  # the run dies between the checkpoints at 14 and 21
            raise RuntimeError("simulated crash")
        return batches(generator)

    with pytest.raises(RuntimeError, match="simulated crash"):
        train(make_model(0), _config(), crashing, out_dir=tmp_path / "cut")
    assert latest_checkpoint(tmp_path / "cut").name == "step-000014"
    resumed = make_model(5)  # different initial weights: all of them must come from the file
    result = train(resumed, _config(), batches, out_dir=tmp_path / "cut", resume=True)
    assert result.step == 30
    _assert_same(_weights(resumed), _weights(whole))
    whole_metrics = read_metrics(tmp_path / "whole" / "metrics.jsonl")
    cut_metrics = read_metrics(tmp_path / "cut" / "metrics.jsonl")
    strip = [{k: v for k, v in r.items() if k != "elapsed"} for r in whole_metrics]
    assert strip == [{k: v for k, v in r.items() if k != "elapsed"} for r in cut_metrics]


class _StopAt:
    """A reporter that sets ``token`` when step ``at`` is reported (a cancel mid-run)."""

    def __init__(self, token: StopToken, at: int) -> None:
        self.token, self.at = token, at

    def start(self, total: int, step: int) -> None: ...

    def update(self, step: int, loss: float, lr: float) -> None:
        if step == self.at:
            self.token.stop("cancelled")

    def record(self, record: dict) -> None: ...

    def message(self, text: str) -> None: ...

    def finish(self) -> None: ...


def test_a_stop_token_ends_the_run_after_the_step_and_resume_finishes_it(tmp_path: Path) -> None:
    """A token set during step 10 ends the run there: no exception, the reason returned, a
    checkpoint at 10; resuming gives the uninterrupted run's weights bit for bit."""
    whole = make_model(0)
    train(whole, _config(), batches, out_dir=tmp_path / "whole")
    token = StopToken()
    cut = _StopAt(token, 10)
    result = train(
        make_model(0), _config(), batches, out_dir=tmp_path / "cut", reporter=cut, stop=token
    )
    assert (result.step, result.stopped, result.interrupted) == (10, "cancelled", False)
    assert latest_checkpoint(tmp_path / "cut").name == "step-000010"
    resumed = make_model(5)
    done = train(resumed, _config(), batches, out_dir=tmp_path / "cut", resume=True)
    assert done.step == 30 and done.stopped is None
    _assert_same(_weights(resumed), _weights(whole))


def test_a_stop_token_keeps_its_first_reason_and_can_time_out() -> None:
    token = StopToken()
    assert token.reason is None
    token.stop("cancelled")
    token.stop("the client went away")
    assert token.reason == "cancelled"
    late = StopToken(seconds=0.0)
    time.sleep(0.01)
    assert late.reason == "time limit: stopped after 0 s"
    result = train(make_model(0), _config(), batches, stop=late)
    assert (result.step, result.stopped) == (1, late.reason)  # the first step, then it stops
    untimed = train(make_model(0), _config(steps=3), batches, stop=StopToken(seconds=600))
    assert (untimed.step, untimed.stopped) == (3, None)


def _run_worker(tmp_path: Path, out: Path, steps: int, mode: str, delay: float = 0.0):
    if not (tmp_path / "worker.py").exists():  # once: a worker already started may be reading
        (tmp_path / "tiny.py").write_text(TINY)
        (tmp_path / "worker.py").write_text(WORKER)
    env = dict(os.environ, STEP_DELAY=str(delay), PYTHONPATH=str(Path(__file__).parents[2] / "src"))
    args = [sys.executable, str(tmp_path / "worker.py"), str(out), str(steps), mode]
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait_for_checkpoint(out: Path, proc: subprocess.Popen, at_least: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            path = latest_checkpoint(out)
        except CheckpointError:
            path = None
        if path is not None and int(path.name[5:]) >= at_least:
            return
        time.sleep(0.02)
    raise AssertionError(f"the worker never reached a checkpoint at step {at_least}")


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_is_bit_identical(tmp_path: Path) -> None:
    whole = _run_worker(tmp_path, tmp_path / "whole", 40, "run")
    killed = _run_worker(tmp_path, tmp_path / "killed", 40, "run", delay=0.03)
    _wait_for_checkpoint(tmp_path / "killed", killed, at_least=14)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert killed.returncode == -signal.SIGKILL
    cut_at = int(latest_checkpoint(tmp_path / "killed").name[5:])
    assert cut_at < 40
    resumed = _run_worker(tmp_path, tmp_path / "killed", 40, "resume")
    assert resumed.wait() == 0, resumed.stderr.read() if resumed.stderr else ""
    assert whole.wait() == 0
    assert latest_checkpoint(tmp_path / "killed").name == "step-000040"
    _assert_same(_final_weights(tmp_path / "whole"), _final_weights(tmp_path / "killed"))


@pytest.fixture(scope="module")
def whole_30(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """The final weights of the worker's uninterrupted 30-step run: the one reference both
    kill-during-a-save cases must resume to (a worker process costs seconds to start)."""
    tmp = tmp_path_factory.mktemp("whole-30")
    whole = _run_worker(tmp, tmp / "whole", 30, "run")
    assert whole.wait() == 0, whole.stderr.read() if whole.stderr else ""
    return _final_weights(tmp / "whole")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "kept"),
    [("die-in-save", 7), ("die-before-latest", 14), ("die-before-first-latest", 7)],
)
def test_kill_during_a_save_leaves_the_newest_complete_checkpoint(
    tmp_path: Path, mode: str, kept: int, whole_30: dict[str, torch.Tensor]
) -> None:
    """Killed while a checkpoint's files are written, the previous one is resumed; killed after
    its folder is renamed into place but before `latest` names it, that folder is (even the
    run's first, where there is no `latest` at all: --resume refused and the run began again
    at step 0), and the resumed run ends with the weights of one never killed."""
    out = tmp_path / "run"
    proc = _run_worker(tmp_path, out, 30, mode)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert (out / "checkpoints" / "latest").exists() == (mode != "die-before-first-latest")
    ck = load_checkpoint(out)  # loadable and verified
    assert ck.step == kept
    with pytest.raises(CheckpointError, match="already holds a run"):
        train(make_model(), _config(), batches, out_dir=out)  # not begun again over it
    resumed = _run_worker(tmp_path, out, 30, "resume")
    assert resumed.wait() == 0, resumed.stderr.read() if resumed.stderr else ""
    _assert_same(whole_30, _final_weights(out))
    assert not [p for p in (out / "checkpoints").iterdir() if p.name.startswith(".")]


@pytest.mark.slow
def test_ctrl_c_saves_a_checkpoint_and_exits_cleanly(tmp_path: Path) -> None:
    out = tmp_path / "run"
    whole = _run_worker(tmp_path, tmp_path / "whole", 60, "run")  # the reference, meanwhile
    proc = _run_worker(tmp_path, out, 60, "run", delay=0.03)
    _wait_for_checkpoint(out, proc, at_least=7)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr.decode()
    word, step = stdout.decode().split()
    assert word == "INTERRUPTED" and 7 <= int(step) < 60
    assert latest_checkpoint(out).name == f"step-{int(step):06d}"  # saved where it stopped
    assert b"Traceback" not in stderr
    resumed = _run_worker(tmp_path, out, 60, "resume")
    assert resumed.wait() == 0 and whole.wait() == 0
    _assert_same(_final_weights(tmp_path / "whole"), _final_weights(out))


# ---------------------------------------------------------------------------------------------
# refusals: corrupt checkpoints, another run's checkpoint, overwriting a run
# ---------------------------------------------------------------------------------------------


def _corrupt(out: Path, how: str) -> None:
    ck = out / "checkpoints" / "step-000014"
    if how == "truncated weights":
        blob = (ck / "model.safetensors").read_bytes()
        (ck / "model.safetensors").write_bytes(blob[: len(blob) - 40])
    elif how == "flipped byte":
        blob = bytearray((ck / "optimizer.safetensors").read_bytes())
        blob[len(blob) // 2] ^= 0xFF
        (ck / "optimizer.safetensors").write_bytes(bytes(blob))
    elif how == "garbage state":
        (ck / "state.json").write_text('{"step": 14, "form')
    elif how == "missing file":
        (ck / "model.safetensors").unlink()
    elif how == "bad pointer":
        (out / "checkpoints" / "latest").write_text("../../etc")
    elif how == "dangling pointer":
        (out / "checkpoints" / "latest").write_text("step-000099")


@pytest.mark.parametrize(
    "how",
    [
        "truncated weights",
        "flipped byte",
        "garbage state",
        "missing file",
        "bad pointer",
        "dangling pointer",
    ],
)
def test_corrupt_checkpoint_is_refused_and_nothing_is_loaded(tmp_path: Path, how: str) -> None:
    train(make_model(0), _config(steps=14), batches, out_dir=tmp_path)
    _corrupt(tmp_path, how)
    model = make_model(3)
    before = _weights(model)
    with pytest.raises(CheckpointError, match=r"corrupt|truncated|missing") as err:
        train(model, _config(), batches, out_dir=tmp_path, resume=True)
    assert str(tmp_path) in str(err.value)  # the message names the file
    _assert_same(_weights(model), before)  # never half-loaded


def test_resume_refuses_another_runs_settings(tmp_path: Path) -> None:
    train(make_model(0), _config(steps=14), batches, out_dir=tmp_path)
    with pytest.raises(CheckpointError, match=r"lr: 0\.05 in the checkpoint, 0\.01 now"):
        train(make_model(0), _config(steps=14, lr=0.01), batches, out_dir=tmp_path, resume=True)
    with pytest.raises(CheckpointError, match=r"steps: 14 in the checkpoint, 30 now"):
        train(make_model(0), _config(steps=30), batches, out_dir=tmp_path, resume=True)
    # bookkeeping may change: evaluating more often does not alter the weights
    done = train(
        make_model(0), _config(steps=14, eval_every=3), batches, out_dir=tmp_path, resume=True
    )
    assert done.step == 14 and not done.interrupted


def test_fresh_run_refuses_to_overwrite_and_resume_needs_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no checkpoint"):
        train(make_model(0), _config(), batches, out_dir=tmp_path / "empty", resume=True)
    train(make_model(0), _config(steps=7), batches, out_dir=tmp_path / "run")
    with pytest.raises(CheckpointError, match="--resume"):
        train(make_model(0), _config(steps=7), batches, out_dir=tmp_path / "run")
    with pytest.raises(ValueError, match="out_dir"):
        train(make_model(0), _config(), batches, resume=True)


def test_config_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="steps must be at least 1"):
        TrainConfig(steps=0)
    with pytest.raises(ValueError, match="min_lr_ratio"):
        TrainConfig(min_lr_ratio=2.0)
