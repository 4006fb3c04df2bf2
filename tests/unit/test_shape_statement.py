"""The shape calculator stated once (headlab/shapes/statement.py): the static site's browser
evaluates the same statement (offline/formula.js and shapes.js, run here by Node) and must give
exactly the report of the real layer traced on PyTorch's meta device
(:func:`headlab.shapes.trace_shapes`) for every preset and hundreds of random sizes, refuse
exactly the requests the server refuses, and evaluate the language as Python does (Python's own
``eval`` is the oracle)."""

from __future__ import annotations

import json
import math
import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from headlab import site
from headlab.shapes import LIMITS, PRESETS, statement, trace_shapes
from headlab.shapes.formula import BUILTINS, Scope, compile_expression, evaluate

NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="needs Node (the site's scripts run in it)")
DRIVER = Path(__file__).with_suffix(".mjs")
OFFLINE = site.PAGE / "offline"


def run_node(tmp_path: Path, bodies: list[dict], expressions: list[str] = ()) -> dict[str, Any]:
    """The browser's shape reports for ``bodies`` and the values of ``expressions``."""
    cases = {
        "statement": json.loads(json.dumps(statement.exported())),  # as the site writes it
        "bodies": bodies,
        "expressions": [compile_expression(e) for e in expressions],
    }
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(cases), encoding="utf-8")
    command = [str(NODE), str(DRIVER), str(OFFLINE), str(path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def as_doubles(value: object) -> object:
    """Python's JSON as the browser's numbers hold it: integers are doubles there."""
    if isinstance(value, dict):
        return {k: as_doubles(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [as_doubles(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def served(body: dict) -> dict:
    """What POST /api/shapes answers (the real layer traced), as the site's port must."""
    from headlab.server.schemas import ShapesRequest

    want = trace_shapes(**ShapesRequest(**body).model_dump())  # the API's defaults
    return {**want.to_dict(), **want.config.head_counts(), "source": "table"}


def preset_bodies() -> list[dict]:
    """Every preset as the page's sections ask for it (§6 at one token, §9 at its context in
    bfloat16, both sending d_k null when the preset has none) and with a cache."""
    bodies = []
    for p in PRESETS.values():
        sizes = {
            "d_model": p.d_model,
            "n_heads": p.n_heads,
            "n_kv_heads": p.n_kv_heads,
            "d_k": p.d_k,
            "bias": p.bias,
            "batch": 1,
        }
        bodies.append({**sizes, "seq_len": 1})
        bodies.append({**sizes, "seq_len": p.context, "dtype": "bfloat16"})
        bodies.append({**sizes, "seq_len": 16, "cache_len": 7, "dtype": "fp16", "batch": 3})
    return bodies


def random_body(rng: random.Random) -> dict:
    """A request within the API's limits: small sizes (often indivisible), now and then huge,
    a given head width or an explicit null one, every dtype name."""

    def pick(name: str) -> int:
        lo, hi = LIMITS[name]
        return rng.choice(
            [rng.randint(lo, min(hi, 64)), rng.randint(lo, min(hi, 4096)), rng.randint(lo, hi)]
        )

    body: dict[str, Any] = {name: pick(name) for name in ("d_model", "n_heads", "seq_len", "batch")}
    body["n_kv_heads"] = rng.choice([None, pick("n_kv_heads"), rng.randint(1, 8)])
    body["cache_len"] = rng.choice([0, 0, pick("cache_len")])
    body["bias"] = rng.random() < 0.5
    body["dtype"] = rng.choice(
        ["float32", "float16", "bfloat16", "float64", "bf16", "fp16", "half"]
    )
    if rng.random() < 0.5:  # a divisible width, so that most reports are valid and complete
        body["d_model"] = min(body["n_heads"] * rng.randint(1, 64), LIMITS["d_model"][1])
        if body["n_kv_heads"] is not None and rng.random() < 0.7:
            body["n_kv_heads"] = rng.choice([h for h in range(1, 9) if body["n_heads"] % h == 0])
    body["d_k"] = rng.choice([None, None, rng.randint(1, 16), rng.randint(1, 512), pick("d_k")])
    for name in rng.sample(sorted(body), rng.randint(0, 3)):  # left out: the API's defaults
        del body[name]
    return body


def test_the_browsers_report_equals_the_traced_layer_for_every_preset_and_random_sizes(tmp_path):
    rng = random.Random(44)
    bodies = [{}, {"d_k": None}, {"d_model": 100, "n_heads": 6}, *preset_bodies()]
    bodies += [random_body(rng) for _ in range(500)]
    got = run_node(tmp_path, bodies)["reports"]
    valid = 0
    for body, report in zip(bodies, got, strict=True):
        want = served(body)
        assert as_doubles(report) == as_doubles(want), body
        valid += want["valid"]
    assert 150 < valid < len(bodies)  # both kinds were compared
    assert all(r["valid"] for r in got[3 : 3 + 3 * len(PRESETS)])  # every preset's
    assert any(r["warnings"] for r in got) and any("2**62" in " ".join(r["problems"]) for r in got)
    assert "nearest valid head counts: 5 or 10" in got[2]["problems"][0]


def request_bodies() -> list[dict]:
    """Each field null, at its limits and one past them, a fraction, a bool, a string; the
    other fields' odd values; a field the calculator does not have."""
    bodies: list[dict] = [{}]
    for name, (lo, hi) in LIMITS.items():
        bodies += [{name: v} for v in (None, lo, hi, lo - 1, hi + 1, 8.0, 2.5, True, "8", [8])]
    bodies += [{"bias": v} for v in (True, False, None, 1, 0, "true")]
    bodies += [{"dtype": v} for v in ("bf16", "half", "fp64", "BF16", "int8", None, 4, ["bf16"])]
    bodies += [{"heads": 8}, {"d_model": 1e300}, {"d_model": 64, "n_heads": 4, "d_k": None}]
    return bodies


def test_the_browser_refuses_exactly_what_the_server_refuses(tmp_path):
    """The disagreement this statement ended: the page sends ``d_k: null``, which the server
    takes and the site's port refused ("d_k: must be a whole number ..."), so §6's and §9's
    tables failed in the static site. Which fields may be null, and their limits, are now the
    statement's; the server's schema and the browser must agree on every request."""
    from fastapi.testclient import TestClient

    from headlab.server.app import create_app

    bodies = request_bodies()
    got = run_node(tmp_path, bodies)["reports"]
    rules = statement.scope({})
    with TestClient(create_app(preload=())) as client:
        for body, answer in zip(bodies, got, strict=True):
            status = client.post("/api/shapes", json=body).status_code
            assert status in (200, 422), body
            assert ("error" in answer) == (status == 422), (body, answer)
            taken = all(rules.call("accepts", k, _from_json(v)) for k, v in body.items())
            assert taken == (status == 200), body
            if status == 422:
                field = next(iter(body))
                assert answer["error"].startswith(f"{field}: "), answer
    nulls = [a for b, a in zip(bodies, got, strict=True) if list(b.values()) == [None]]
    assert sum("error" not in a for a in nulls) == 2  # n_kv_heads and d_k
    assert got[-1]["valid"] and got[-1]["config"]["sizes"]["d_k"] == 16


def _from_json(value: Any) -> Any:
    """A JSON value as the browser's evaluator holds it: a whole number is an int."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


# the language, against Python's own eval: arithmetic as Python rounds and floors it, format
# specs with exact ties (JavaScript's toFixed rounds them up), comprehensions, lambdas, records
EXPRESSIONS = [
    "7 // 2",
    "-7 // 2",
    "7 // -2",
    "-7 % 3",
    "7 % -3",
    "2**62 + 1",
    "(2**62 + 1) * 3 - 2**63",
    "1 / 3",
    "(2**62 + 1) / 3",
    "2**70 / 3",
    "-(2**70) / 7",
    "10**25 / 3",
    "7 // 2.0",
    "1 + 0.5",
    "2**0.5",
    "-(3)",
    "abs(-4)",
    "abs(-2.5)",
    "f'{0.25:.1f} {0.35:.1f} {0.125:.2f} {2.5:.0f} {3.5:.0f} {-0.25:.1f} {0.05:.1f}'",
    "f'{1234567.891:,.1f} {1024:,.0f} {2**62:,} {-1234567:,} {1e22:,.1f}'",
    "f'{0.0005:.1%} {0.00125:.1%} {1 / 3:.1%} {0.98765:.1%}'",
    "f'{4.0:g} {65536.0:g} {0.5:g} {1e-05:g} {123456789.0:g} {4:g} {2.5e-07:g}'",
    "f'{1.5} {2.0} {1e16} {1e-05} {0.1} {123456.789} {None} {True} {False} {12}'",
    "f'{10**25 / 3:.1f} {2**62 / 7:,.1f}'",
    "max(3, 9, 2)",
    "max([1, 5, 5])",
    "sum([1, 2, 3])",
    "sum([])",
    "len([1, 2])",
    "len('abc')",
    "[x * 2 for x in [1, 2, 3] if x != 2]",
    "{k: k + '!' for k in ['a', 'b']}",
    "{**{'a': 1}, 'b': 2, **{'a': 3}}",
    "[1, 2, 3][-1:]",
    "[1, 2, 3][:1]",
    "[1, 2, 3][-2]",
    "[][-1:] + [7][:1]",
    "'ab' + 'c'",
    "[1] + [2]",
    "3 if 0 else 4",
    "0 or 5",
    "2 and 0",
    "[] or {}",
    "not []",
    "None is None",
    "(lambda v: v is not None)(3)",
    "3 in [1, 3]",
    "'a' in {'a': 1}",
    "'z' not in {'a': 1}",
    "(lambda a, b: a * b)(6, 7)",
    "[a + b for a, b in [[1, 2], [3, 4]]]",
    "1 == 1.0",
    "[1, [2]] == [1, [2]]",
    "{'a': 1} == {'a': 1.0}",
    "2**53 + 1 > 2**53",
    "2**53 + 1 == 2.0**53",
    "'b' > 'a'",
    "divisors(720720)[-5:]",
    "divisors(1)",
    "join([1, 'x', 2.5], ' or ')",
    "rename('B×h_kv×s×h·d_k', {'h_kv': 'h', 's': 'n'})",
    "log2(2**62)",
    "prod([2, 3, 4])",
    "prod([])",
    "is_int(True)",
    "is_int(3)",
    "is_bool(False)",
    "max([st['b'] for st in [{'b': 1}, {'b': 9}, {'b': -2}] if st['b'] > 0])",
]


def _typed(value: Any) -> Any:
    """A value as the driver writes the browser's: ints and floats told apart."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return {"int": str(value)}
    if isinstance(value, float):
        return {"float": value}
    if isinstance(value, list | tuple):
        return [_typed(v) for v in value]
    return {k: _typed(v) for k, v in value.items()}


def _floats(value: Any) -> Any:
    """The driver's answer with each float a float (JSON writes 1.5e18 as a whole number)."""
    if isinstance(value, list):
        return [_floats(v) for v in value]
    if isinstance(value, dict):
        if list(value) == ["float"]:
            return {"float": float(value["float"])}
        return {k: _floats(v) for k, v in value.items()}
    return value


def _without_scope(fn: Any) -> Any:
    return lambda *args: fn(None, *args)


def test_the_language_means_what_python_means(tmp_path):
    names = {name: _without_scope(fn) for name, fn in BUILTINS.items()}
    got = run_node(tmp_path, [], EXPRESSIONS)["values"]
    for source, answer in zip(EXPRESSIONS, got, strict=True):
        want = eval(source, {"__builtins__": {}}, names)  # the oracle: Python itself
        assert evaluate(compile_expression(source), Scope({}, {})) == want, source
        assert _floats(answer) == {"value": _typed(want)}, source


@pytest.mark.parametrize(
    "source",
    [
        "x.upper()",
        "a < b < c",
        "f'{x!r}'",
        "f'{x:>10}'",
        "x is 3",
        "[*xs]",
        "f(*xs)",
        "f(a=1)",
        "[x for x in a for y in b]",
        "lambda *a: a",
        "(x := 3)",
        "{1, 2}",
        "a[::2]",
    ],
)
def test_what_the_browser_could_not_run_is_refused_when_compiled(source):
    with pytest.raises(ValueError, match=r"shape statement|compares with None|formatted with"):
        compile_expression(source)


def test_the_statement_holds_the_servers_request_schema():
    """The API's schema takes its limits, defaults and nullable sizes from the statement."""
    from headlab.server.schemas import ShapesRequest

    for name, field in ShapesRequest.model_fields.items():
        assert field.default == statement.REQUEST_DEFAULTS[name], name
        if name in statement.FIELDS:
            nullable = ShapesRequest.model_json_schema()["properties"][name].get("anyOf")
            assert bool(nullable) == statement.FIELDS[name]["nullable"], name
    assert list(ShapesRequest.model_fields) == list(statement.REQUEST_DEFAULTS)
