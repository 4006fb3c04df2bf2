"""The shape statement's small language: Python's expression syntax, compiled once into a JSON
tree that this module and the browser's ``static/offline/formula.js`` evaluate alike.

The statement (:mod:`headlab.shapes.statement`) is written as ``name = expression`` lines.
:func:`compile_definitions` parses them with Python's own parser and keeps only what both
evaluators implement, so a construct the browser could not run is refused here, with the line.
Both sides then walk the same tree, so no number or sentence of the report is written twice.

The language:
    values       int (exact: BigInt in the browser), float, str, True/False/None, lists, dicts
    names        the statement's definitions (evaluated once, when first read), the values a
                 caller gives (``config`` and the like; they take precedence), the constants,
                 and the built-in functions :data:`BUILTINS`
    operators    + - * / // % ** (``/`` is true division, correctly rounded), unary - and
                 ``not``, one comparison at a time (== != < <= > >= in, not in; ``is`` and
                 ``is not`` only against None), ``and``/``or`` (which give an operand, as
                 Python's do), ``a if test else b``
    records      ``row.field`` reads a dict's key; ``xs[i]``, ``xs[a:b]``, ``d[key]``
    displays     [..], (..) (a list), {k: v, **d}, one-``for`` comprehensions (list, generator
                 and dict, with ``if`` filters; ``for a, b in``), ``lambda x, y: ...``
    f-strings    ``{value:spec}`` with spec "", ",", "g", or [,].Nf / .N% (Python's meaning)

Python evaluates the tree with its own operators, so its results are Python's by definition;
the browser's evaluator is held equal to them over every preset and hundreds of random sizes
(tests/unit/test_shape_statement.py).
"""

from __future__ import annotations

import ast
import math
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any

from headlab.numbers import valid_head_counts

Tree = Any  # a JSON list: [kind, ...operands]

_BINARY = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
}
_COMPARE = {
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.In: "in",
    ast.NotIn: "not in",
    ast.Is: "is",
    ast.IsNot: "is not",
}
# the format specs both evaluators implement: "", ",", "g", ".1f", ",.1f", ".1%", ...
FORMAT_SPEC = re.compile(r"(,?(\.\d+[f%])?|g)\Z")


# CPython 3.11's parser is not safe in two threads at once: the server's first two /api/shapes
# requests, answered in parallel, raised "SystemError: AST constructor recursion depth mismatch"
# in one of them (a 500). Every parse here takes this lock.
_PARSING = threading.Lock()


def _statements(source: str) -> list[ast.stmt]:
    """``ast.parse(source).body``, one thread at a time."""
    with _PARSING:
        return ast.parse(source).body


def _expression(source: str) -> ast.expr:
    """``ast.parse(source, mode="eval").body``, one thread at a time."""
    with _PARSING:
        return ast.parse(source, mode="eval").body


def compile_definitions(source: str) -> dict[str, Tree]:
    """The ``name = expression`` lines of ``source`` as trees, in order; anything else (a
    statement, a construct outside the language, a name defined twice) is refused with its line."""
    trees: dict[str, Tree] = {}
    for node in _statements(source):
        target = node.targets[0] if isinstance(node, ast.Assign) else None
        if not isinstance(target, ast.Name) or len(node.targets) != 1:  # type: ignore[attr-defined]
            raise ValueError(f"line {node.lineno}: the statement holds only `name = expression`")
        if target.id in trees:
            raise ValueError(f"line {node.lineno}: {target.id} is defined twice")
        trees[target.id] = compile_node(node.value)  # type: ignore[attr-defined]
    return trees


def compile_expression(source: str) -> Tree:
    """One expression as a tree."""
    return compile_node(_expression(source.strip()))


def literal(value: Any) -> Tree:
    """A constant (numbers, strings, None, bools, lists, tuples, dicts of them) as a tree."""
    if value is None or isinstance(value, bool):
        return ["const", value]
    if isinstance(value, int):
        return ["int", str(value)]
    if isinstance(value, float):
        return ["float", value]
    if isinstance(value, str):
        return ["str", value]
    if isinstance(value, list | tuple):
        return ["list", [literal(v) for v in value]]
    if isinstance(value, Mapping):
        return ["dict", [[["str", str(k)], literal(v)] for k, v in value.items()]]
    raise TypeError(f"{value!r} is not a constant of the shape statement")


def compile_node(node: ast.AST) -> Tree:
    """``node`` as a tree, or ValueError naming the construct the language lacks."""
    match node:
        case ast.Constant(value=str() | int() | float() | bool() | None as value):
            return literal(value)
        case ast.Name(id=name):
            return ["name", name]
        case ast.Attribute(value=record, attr=field):
            return ["attr", compile_node(record), field]
        case ast.Subscript(value=seq, slice=ast.Slice(lower=low, upper=high, step=None)):
            return ["slice", compile_node(seq), _maybe(low), _maybe(high)]
        case ast.Subscript(value=seq, slice=key) if not isinstance(key, ast.Slice):
            return ["index", compile_node(seq), compile_node(key)]
        case ast.BinOp(left=a, op=op, right=b) if type(op) in _BINARY:
            return [_BINARY[type(op)], compile_node(a), compile_node(b)]
        case ast.UnaryOp(op=ast.USub(), operand=a):
            return ["neg", compile_node(a)]
        case ast.UnaryOp(op=ast.Not(), operand=a):
            return ["not", compile_node(a)]
        case ast.Compare(left=a, ops=[op], comparators=[b]) if type(op) in _COMPARE:
            if isinstance(op, ast.Is | ast.IsNot) and not _is_none(b):
                raise ValueError(f"{ast.unparse(node)!r}: `is` compares with None only")
            return [_COMPARE[type(op)], compile_node(a), compile_node(b)]
        case ast.BoolOp(op=op, values=values):
            return ["and" if isinstance(op, ast.And) else "or", *map(compile_node, values)]
        case ast.IfExp(test=test, body=yes, orelse=no):
            return ["if", compile_node(test), compile_node(yes), compile_node(no)]
        case ast.Call(func=fn, args=args, keywords=[]) if _plain_call(fn, args):
            return ["call", compile_node(fn), [compile_node(a) for a in args]]
        case ast.Lambda(
            args=ast.arguments(
                posonlyargs=[], args=params, vararg=None, kwonlyargs=[], kwarg=None, defaults=[]
            ),
            body=body,
        ):
            return ["lambda", [p.arg for p in params], compile_node(body)]
        case ast.List(elts=items) | ast.Tuple(elts=items) if not _starred(items):
            return ["list", [compile_node(x) for x in items]]
        case ast.Dict(keys=keys, values=values):
            return [
                "dict",
                [
                    [None if k is None else compile_node(k), compile_node(v)]
                    for k, v in zip(keys, values, strict=True)
                ],
            ]
        case (
            ast.ListComp(elt=elt, generators=[loop]) | ast.GeneratorExp(elt=elt, generators=[loop])
        ):
            return ["comp", "list", compile_node(elt), *_loop(loop)]
        case ast.DictComp(key=key, value=value, generators=[loop]):
            return ["comp", "dict", [compile_node(key), compile_node(value)], *_loop(loop)]
        case ast.JoinedStr(values=parts):
            return ["fstr", [_part(p) for p in parts]]
    raise ValueError(f"{ast.unparse(node)!r} is outside the shape statement's language")


def _maybe(node: ast.AST | None) -> Tree:
    return None if node is None else compile_node(node)


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _plain_call(fn: ast.expr, args: list[ast.expr]) -> bool:
    """A call of a function by position (no methods: a record holds no functions)."""
    return not isinstance(fn, ast.Attribute) and not _starred(args)


def _starred(nodes: list[ast.expr]) -> bool:
    return any(isinstance(n, ast.Starred) for n in nodes)


def _loop(loop: ast.comprehension) -> list[Any]:
    """[targets, whether they unpack, iterable, filters] of a comprehension's one ``for``."""
    target = loop.target
    names = target.elts if isinstance(target, ast.Tuple) else [target]
    if loop.is_async or not all(isinstance(n, ast.Name) for n in names):
        raise ValueError(f"{ast.unparse(loop)!r}: a comprehension binds plain names")
    targets = [n.id for n in names]  # type: ignore[attr-defined]
    return [
        targets,
        isinstance(target, ast.Tuple),
        compile_node(loop.iter),
        [compile_node(f) for f in loop.ifs],
    ]


def _part(node: ast.expr) -> Tree:
    """A piece of an f-string: its text, or ["fmt", value, spec]."""
    if isinstance(node, ast.Constant):
        return node.value
    assert isinstance(node, ast.FormattedValue)
    pieces = [] if node.format_spec is None else node.format_spec.values  # type: ignore[attr-defined]
    spec = "".join(str(p.value) if isinstance(p, ast.Constant) else "{}" for p in pieces)
    if node.conversion != -1 or not FORMAT_SPEC.match(spec):
        raise ValueError(
            f"{ast.unparse(node)!r}: a value is formatted with '', ',', 'g', [,].Nf or .N% only"
        )
    return ["fmt", compile_node(node.value), spec]


Fn = Callable[["Scope"], Any]  # a compiled tree: its value in a scope


def evaluator(tree: Tree) -> Fn:
    """``tree`` as a Python function of the scope (compiled once, evaluated many times)."""
    kind = tree[0]
    if kind in _LEAVES:
        return _LEAVES[kind](tree)
    if kind in _OPERATORS:
        op = _OPERATORS[kind]
        a, b = evaluator(tree[1]), evaluator(tree[2])
        return lambda scope: op(a(scope), b(scope))
    return _BRANCHES[kind](tree)


def evaluate(tree: Tree, scope: Scope) -> Any:
    """The value of ``tree`` in ``scope``."""
    return evaluator(tree)(scope)


class Scope:
    """Names and their values: those given first, then the definitions (each evaluated once, on
    first use), then the parent's, then :data:`BUILTINS`."""

    def __init__(
        self,
        definitions: Mapping[str, Fn],
        values: Mapping[str, Any],
        parent: Scope | None = None,
    ) -> None:
        self.definitions = definitions
        self.values = dict(values)
        self.parent = parent
        self._busy: set[str] = set()

    def __getitem__(self, name: str) -> Any:
        scope: Scope | None = self
        while scope is not None:
            if name in scope.values:
                return scope.values[name]
            if name in scope.definitions:
                return scope._define(name)
            scope = scope.parent
        if name in BUILTINS:
            return BUILTINS[name]
        raise NameError(f"{name!r} is not defined in the shape statement")

    def _define(self, name: str) -> Any:
        if name in self._busy:
            raise ValueError(f"{name} is defined in terms of itself")
        self._busy.add(name)
        try:
            self.values[name] = self.definitions[name](self)
        finally:
            self._busy.discard(name)
        return self.values[name]

    def call(self, name: str, *args: Any) -> Any:
        """The function ``name`` (a definition's lambda or a built-in) applied to ``args``."""
        return self[name](self, *args)

    def child(self, values: Mapping[str, Any]) -> Scope:
        return Scope(_NONE, values, self)


_NONE: dict[str, Fn] = {}


class Lambda:
    """A ``lambda`` of the statement, closed over the scope it was made in."""

    def __init__(self, params: list[str], body: Fn, scope: Scope) -> None:
        self.params, self.body, self.scope = params, body, scope

    def __call__(self, _caller: Scope, *args: Any) -> Any:
        if len(args) != len(self.params):
            raise TypeError(f"a lambda of {len(self.params)} arguments was given {len(args)}")
        return self.body(self.scope.child(dict(zip(self.params, args, strict=True))))


def _name(tree: Tree) -> Fn:
    name = tree[1]
    return lambda scope: scope[name]


def _record(tree: Tree) -> Fn:
    of, field = evaluator(tree[1]), tree[2]

    def read(scope: Scope) -> Any:
        record = of(scope)
        if not isinstance(record, dict):
            raise TypeError(f"{field!r} read from {record!r}, which is not a record")
        return record[field]

    return read


def _slice(tree: Tree) -> Fn:
    of = evaluator(tree[1])
    low, high = (None if t is None else evaluator(t) for t in tree[2:])
    return lambda s: of(s)[None if low is None else low(s) : None if high is None else high(s)]


def _unary(op: Callable[[Any], Any]) -> Callable[[Tree], Fn]:
    def make(tree: Tree) -> Fn:
        a = evaluator(tree[1])
        return lambda scope: op(a(scope))

    return make


def _and(tree: Tree) -> Fn:
    operands = [evaluator(t) for t in tree[1:]]

    def run(scope: Scope) -> Any:
        value = None
        for operand in operands:
            value = operand(scope)
            if not value:
                return value
        return value

    return run


def _or(tree: Tree) -> Fn:
    operands = [evaluator(t) for t in tree[1:]]

    def run(scope: Scope) -> Any:
        value = None
        for operand in operands:
            value = operand(scope)
            if value:
                return value
        return value

    return run


def _if(tree: Tree) -> Fn:
    test, yes, no = (evaluator(t) for t in tree[1:])
    return lambda scope: yes(scope) if test(scope) else no(scope)


def _call(tree: Tree) -> Fn:
    fn, args = evaluator(tree[1]), [evaluator(a) for a in tree[2]]
    return lambda scope: fn(scope)(scope, *(a(scope) for a in args))


def _lambda(tree: Tree) -> Fn:
    params, body = tree[1], evaluator(tree[2])
    return lambda scope: Lambda(params, body, scope)


def _list(tree: Tree) -> Fn:
    items = [evaluator(x) for x in tree[1]]
    return lambda scope: [item(scope) for item in items]


def _dict(tree: Tree) -> Fn:
    entries = [(None if k is None else evaluator(k), evaluator(v)) for k, v in tree[1]]

    def build(scope: Scope) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        for key, value in entries:
            if key is None:
                out.update(value(scope))
            else:
                out[key(scope)] = value(scope)
        return out

    return build


def _comprehension(tree: Tree) -> Fn:
    _, kind, elt, targets, unpack, iterable, filters = tree
    source, tests = evaluator(iterable), [evaluator(f) for f in filters]
    if kind == "dict":
        key, value = evaluator(elt[0]), evaluator(elt[1])
    else:
        item_of = evaluator(elt)

    def run(scope: Scope) -> Any:
        out: Any = {} if kind == "dict" else []
        for item in source(scope):
            bound = dict(zip(targets, item, strict=True)) if unpack else {targets[0]: item}
            inner = scope.child(bound)
            if all(test(inner) for test in tests):
                if kind == "dict":
                    out[key(inner)] = value(inner)
                else:
                    out.append(item_of(inner))
        return out

    return run


def _fstring(tree: Tree) -> Fn:
    parts = [p if isinstance(p, str) else (evaluator(p[1]), p[2]) for p in tree[1]]

    def run(scope: Scope) -> str:
        return "".join(p if isinstance(p, str) else format(p[0](scope), p[1]) for p in parts)

    return run


def _constant(read: Callable[[Any], Any]) -> Callable[[Tree], Fn]:
    def make(tree: Tree) -> Fn:
        value = read(tree[1])
        return lambda _scope: value

    return make


_LEAVES: dict[str, Callable[[Tree], Fn]] = {
    "const": _constant(lambda v: v),
    "int": _constant(int),
    "float": _constant(float),
    "str": _constant(str),
    "name": _name,
}
_OPERATORS: dict[str, Callable[[Any, Any], Any]] = {
    "index": lambda seq, key: seq[key],
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b,
    "//": lambda a, b: a // b,
    "%": lambda a, b: a % b,
    "**": lambda a, b: a**b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "in": lambda a, b: a in b,
    "not in": lambda a, b: a not in b,
    "is": lambda a, b: a is b,
    "is not": lambda a, b: a is not b,
}
_BRANCHES: dict[str, Callable[[Tree], Fn]] = {
    "attr": _record,
    "slice": _slice,
    "neg": _unary(lambda a: -a),
    "not": _unary(lambda a: not a),
    "and": _and,
    "or": _or,
    "if": _if,
    "call": _call,
    "lambda": _lambda,
    "list": _list,
    "dict": _dict,
    "comp": _comprehension,
    "fstr": _fstring,
}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _max(*args: Any) -> Any:
    return max(args[0]) if len(args) == 1 else max(args)


def _dims(scope: Scope, pattern: str) -> list[int]:
    """A symbolic shape ("B×h×n×d_k"; '·' multiplies) at the sizes ``scope`` names."""
    return [math.prod(scope[f] for f in dim.split("·")) for dim in pattern.split("×")]


def _rename(pattern: str, names: Mapping[str, str]) -> str:
    """A symbolic shape with each factor renamed as ``names`` says (others kept)."""
    return "×".join("·".join(names.get(f, f) for f in dim.split("·")) for dim in pattern.split("×"))


def _plain(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A built-in that does not read the caller's scope."""
    return lambda _scope, *args: fn(*args)


# the built-in functions (offline/formula.js has the same, by the same names)
BUILTINS: dict[str, Callable[..., Any]] = {
    "abs": _plain(abs),
    "divisors": _plain(valid_head_counts),  # ascending divisors: the head counts that split n
    "dims": _dims,
    "is_bool": _plain(lambda v: isinstance(v, bool)),
    "is_int": _plain(_is_int),
    "join": _plain(lambda items, sep: sep.join(map(str, items))),
    "len": _plain(len),
    "log2": _plain(math.log2),
    "max": _plain(_max),
    "prod": _plain(math.prod),
    "rename": _plain(_rename),
    "sum": _plain(sum),
}
