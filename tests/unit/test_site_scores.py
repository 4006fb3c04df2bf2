"""The static site's head scores and labels equal :func:`headlab.heads.analyse` on many
sentences, both with the thresholds alone and gated by the random-weights floors of
:mod:`headlab.heads.baselines`: the exported graphs (the model's forward and the scores' own
module, :class:`headlab.site.SiteGraph`) run by onnxruntime-web's WASM build in Node, on the
inputs the site's own scripts (tokenizer.js, words.js, labels.js) make of each text."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest

from headlab import site
from headlab.heads import analyse
from headlab.heads.baselines import BASELINE_SEEDS, baselines
from headlab.measure import REPEAT_SENTENCE, text_probe, word_zipf

pytest.importorskip("onnxscript", reason="headlab[static] exports with torch.onnx (dynamo=True)")
pytest.importorskip("onnxruntime", reason="headlab[static] installs onnxruntime")
ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ROOT / "web" / "node_modules" / "onnxruntime-web" / "dist" / "ort.wasm.bundle.min.mjs"
NODE = shutil.which("node")
pytestmark = [
    pytest.mark.skipif(NODE is None, reason="needs Node (the site's scripts run in it)"),
    pytest.mark.skipif(not RUNTIME.is_file(), reason="needs onnxruntime-web (npm ci in web/)"),
]
OFFLINE = site.PAGE / "offline"

SENTENCES = [
    "Mary gave the red kite to John, and then Mary gave the red kite to Sue.",
    "The cat sat on the mat. The cat sat on the mat.",
    "Hello, world!",
    "A quixotic zephyr bewildered the xylophonist's ocelot.",
    "It's 1984 and the clocks strike 13; the year 2050 won't come.",
    "l'amour, o'clock, rock'n'roll — and the café’s crème brûlée.",
    "one two three one two three one two three",
    "?!?! ... ,,, ;;",
    "Sphinx of black quartz, judge my vow.",
    "The old lighthouse keeper, tired but careful, climbed the stairs at dusk.",
    "Colorless green ideas sleep furiously, furiously, furiously.",
    "I think, therefore I am; I am, therefore I think.",
    "Antidisestablishmentarianism is a long word; floccinaucinihilipilification is longer.",
    'She said: "Go!" and he went (quickly) — then stopped.',
    "the the the the the the the",
    "Naïve résumé façade jalapeño piñata",
    "x",
    "Buffalo buffalo Buffalo buffalo buffalo buffalo Buffalo buffalo.",
    "In 3.14 seconds, 1,000,000 photons hit the 2nd detector at 9:30pm.",
    "Where is the key? The key is under the mat, where the key always is.",
    "A<|endoftext|>B and then the end.",
    "emoji 🙂 and tabs\tand\nnew lines",
    REPEAT_SENTENCE,  # the head viewer's first render: the "repeat" probe
]


def _long(tokenizer, max_len: int) -> str:
    """A text of exactly ``max_len`` tokens (the model's limit)."""
    words = ("the quick brown fox jumps over the lazy dog, and the dog sleeps on " * 20).split()
    for k in range(len(words), 0, -1):
        text = " ".join(words[:k])
        if len(tokenizer.encode(text)) <= max_len:
            assert len(tokenizer.encode(text)) == max_len or k < len(words)
            return text
    raise AssertionError("no text fits")


DRIVER = Path(__file__).with_suffix(".mjs")  # the port run in Node on the cases written here


@pytest.fixture(scope="module")
def compared(tmp_path_factory) -> list[tuple[object, object, object, dict]]:
    """(probe, plain report, gated report, the site's answer) for every sentence."""
    from headlab import zoo

    model, tokenizer = zoo.load("default")
    texts = [*SENTENCES, _long(tokenizer, model.config.max_len)]
    tmp = tmp_path_factory.mktemp("scores")
    (tmp / "config.json").write_text(json.dumps(site.site_config(model, tokenizer)))
    site.write_word_table(tmp / "words.gz")
    site.export_onnx(model, tmp / "model.onnx", BASELINE_SEEDS)
    cases = []
    for text in texts:
        probe = text_probe(tokenizer, text, model.config.max_len)
        floors = baselines(model, probe, shuffled=False).floors()
        cases.append((probe, analyse(model, probe), analyse(model, probe, floors=floors), floors))
    tokenizer_file = site.PACKAGE / "weights" / "tokenizer.json"
    manifest = {"texts": texts, "seeds": list(BASELINE_SEEDS), "tokenizer": str(tokenizer_file)}
    (tmp / "manifest.json").write_text(json.dumps(manifest))
    command = [str(NODE), str(DRIVER), str(OFFLINE), str(tmp), str(RUNTIME)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    answers = json.loads(done.stdout)
    return [
        (p, plain, gated, {**a, "want_floors": f})
        for (p, plain, gated, f), a in zip(cases, answers, strict=True)
    ]


def test_enough_sentences_and_one_at_the_limit(compared) -> None:
    assert len(compared) >= 20
    assert max(p.n for p, *_ in compared) == 64
    # some sentences have a word wordfreq has never seen, and some repeat tokens
    assert any(0.0 in word_zipf(p.words[0]) for p, *_ in compared)
    assert any(len(set(p.tokens[0].tolist())) < p.n for p, *_ in compared)


def test_probe_tokens_and_words(compared) -> None:
    for probe, _, _, got in compared:
        assert got["ids"] == probe.tokens[0].tolist(), probe.text
        assert got["words"] == list(probe.words[0]), probe.text
        want = [None if math.isnan(z) else z for z in word_zipf(probe.words[0])]
        assert got["zipf"] == want, probe.text


def _same_report(want, got: dict, text: str) -> None:
    rows = [(s, g) for s, g in zip(want.heads, got["heads"], strict=True)]
    rows += list(zip(want.averaged, got["averaged"], strict=True))
    for s, g in rows:
        where = f"{text!r} head {s.layer}.{s.head}"
        assert (g["layer"], g["head"], g["label"], g["offset"]) == (
            s.layer,
            s.head,
            s.label,
            s.offset,
        ), where
        assert set(g["scores"]) == set(s.scores), where
        for kind, value in s.scores.items():
            # one definition, two runtimes: only their float arithmetic differs
            assert abs(g["scores"][kind] - value) <= 1e-5, f"{where} {kind}"
        assert (g["rest"] is None) == (s.rest is None), where
        if s.rest is not None:
            assert abs(g["rest"] - s.rest) <= 1e-4, where
    d = want.to_dict()
    assert got["best"].keys() == d["best"].keys(), text
    for kind, best in d["best"].items():
        # the same head and verdict; its score rounded to 4 places, which float arithmetic in
        # two runtimes may tip either way (0.94535 as 0.9453 or 0.9454)
        assert {**got["best"][kind], "score": 0} == {**best, "score": 0}, (text, kind)
        assert abs(got["best"][kind]["score"] - best["score"]) <= 1e-4, (text, kind)
    assert got["sinks"]["layers"] == d["sinks"]["layers"], text
    assert got["thresholds"] == d["thresholds"]
    assert got["needs"] == d["needs"]


def test_labels_and_scores_by_thresholds_equal_analyse(compared) -> None:
    for probe, plain, _, got in compared:
        _same_report(plain, got["thresholds"], probe.text)


def test_gated_labels_equal_analyse_with_floors(compared) -> None:
    for probe, _, gated, got in compared:
        want = got["want_floors"]
        for layer, floors in want.items():
            for kind, value in floors.items():
                assert abs(got["floors"][str(layer)][kind] - value) <= 1e-5, (probe.text, kind)
        _same_report(gated, got["gated"], probe.text)
    # the floors take labels away somewhere: the two rules are not the same test twice
    assert any(
        [s.label for s in plain.heads] != [s.label for s in gated.heads]
        for _, plain, gated, _ in compared
    )
