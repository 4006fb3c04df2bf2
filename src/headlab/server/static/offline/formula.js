// The shape statement's evaluator in the browser. headlab.shapes.formula compiles the statement
// (headlab/shapes/statement.py: Python's expression syntax) into JSON trees, which `headlab static`
// writes to shape-statement.json; Python evaluates those trees and so does this file. It holds no
// formula of its own, only the language: each operator as Python means it, f-string specs, the
// built-ins. tests/unit/test_shape_statement.py holds its answers equal to Python's.
//
// Values: Python's int is a BigInt here (exact: FLOPs reach 2**62), float a Number, None null,
// a list an Array, a dict a plain object.

export class Scope {
  // names: the values given, then the definitions (each evaluated once, on first use), then the
  // parent's, then the built-ins
  constructor(definitions, values, parent = null) {
    this.definitions = definitions;
    this.values = new Map(Object.entries(values));
    this.parent = parent;
    this.busy = new Set();
  }

  get(name) {
    for (let scope = this; scope; scope = scope.parent) {
      if (scope.values.has(name)) return scope.values.get(name);
      if (Object.hasOwn(scope.definitions, name)) return scope.define(name);
    }
    if (Object.hasOwn(BUILTINS, name)) return BUILTINS[name];
    throw new Error(`'${name}' is not defined in the shape statement`);
  }

  define(name) {
    if (this.busy.has(name)) throw new Error(`${name} is defined in terms of itself`);
    this.busy.add(name);
    try {
      this.values.set(name, evaluate(this.definitions[name], this));
    } finally {
      this.busy.delete(name);
    }
    return this.values.get(name);
  }

  call(name, ...args) {
    return this.get(name)(this, ...args);
  }

  child(values) {
    return new Scope(NONE, values, this);
  }
}

const NONE = Object.freeze({});
const constantsOf = new WeakMap();

// the statement (shape-statement.json) with `values` given: config, valid, problems, source, ...
export function statementScope(statement, values) {
  if (!constantsOf.has(statement)) {
    const constants = {};
    for (const [name, tree] of Object.entries(statement.constants)) constants[name] = evaluate(tree, new Scope(NONE, {}));
    constantsOf.set(statement, new Scope(NONE, constants));
  }
  return new Scope(statement.definitions, values, constantsOf.get(statement));
}

// JSON as the language holds it (whole numbers as ints), and back
export function fromJSON(v) {
  if (typeof v === "number" && Number.isInteger(v)) return BigInt(v);
  if (Array.isArray(v)) return v.map(fromJSON);
  if (isRecord(v)) return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, fromJSON(x)]));
  return v;
}

export function toJSON(v) {
  if (typeof v === "bigint") return Number(v);
  if (Array.isArray(v)) return v.map(toJSON);
  if (isRecord(v)) return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, toJSON(x)]));
  return v;
}

const isRecord = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
const isNumeric = (v) => typeof v === "bigint" || typeof v === "number" || typeof v === "boolean";
const asInt = (v) => (typeof v === "boolean" ? BigInt(v) : v);  // Python: True + 1 == 2
const asFloat = (v) => Number(v);

// Python's truth of a value
export function truthy(v) {
  if (v === null || v === undefined) return false;
  if (typeof v === "bigint") return v !== 0n;
  if (typeof v === "number") return v !== 0;
  if (typeof v === "string" || Array.isArray(v)) return v.length > 0;
  if (isRecord(v)) return Object.keys(v).length > 0;
  return Boolean(v);
}

// Python's ==
function equal(a, b) {
  if (isNumeric(a) && isNumeric(b)) return asInt(a) == asInt(b);  // loose: a BigInt equals a Number of its value
  if (Array.isArray(a) && Array.isArray(b)) return a.length === b.length && a.every((x, i) => equal(x, b[i]));
  if (isRecord(a) && isRecord(b)) {
    const keys = Object.keys(a);
    return keys.length === Object.keys(b).length && keys.every((k) => Object.hasOwn(b, k) && equal(a[k], b[k]));
  }
  return a === b;
}

function contains(container, item) {
  if (Array.isArray(container)) return container.some((x) => equal(x, item));
  if (typeof container === "string") return typeof item === "string" && container.includes(item);
  if (isRecord(container)) return typeof item === "string" && Object.hasOwn(container, item);
  throw new Error(`cannot look for a value in ${typeof container}`);
}

function order(op, a, b) {
  const ok = (isNumeric(a) && isNumeric(b)) || (typeof a === "string" && typeof b === "string");
  if (!ok) throw new Error(`cannot compare ${typeof a} and ${typeof b}`);
  [a, b] = [asInt(a), asInt(b)];
  return { "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b }[op];
}

// a / b for ints, correctly rounded as Python's int / int is (a sticky bit keeps it exact)
function ratio(a, b) {
  if (b === 0n) throw new Error("division by zero");
  if (a < 0n !== b < 0n && a !== 0n) return -ratio(a < 0n ? -a : a, b < 0n ? -b : b);
  [a, b] = [a < 0n ? -a : a, b < 0n ? -b : b];
  if (a < 2n ** 53n && b < 2n ** 53n) return Number(a) / Number(b);
  const shift = BigInt(Math.max(0, b.toString(2).length - a.toString(2).length + 64));
  let q = (a << shift) / b;
  if ((a << shift) % b) q |= 1n;
  let x = Number(q);
  for (let k = shift; k > 0n; k -= 512n) x /= 2 ** Number(k > 512n ? 512n : k);
  return x;
}

function arithmetic(op, a, b) {
  if (op === "+" && typeof a === "string" && typeof b === "string") return a + b;
  if (op === "+" && Array.isArray(a) && Array.isArray(b)) return [...a, ...b];
  if (!isNumeric(a) || !isNumeric(b)) throw new Error(`cannot ${op} ${typeof a} and ${typeof b}`);
  [a, b] = [asInt(a), asInt(b)];
  if (typeof a === "bigint" && typeof b === "bigint") {
    if ((op === "//" || op === "%") && b === 0n) throw new Error("division by zero");
    switch (op) {
      case "+": return a + b;
      case "-": return a - b;
      case "*": return a * b;
      case "/": return ratio(a, b);
      case "//": return a / b - ((a % b !== 0n && (a < 0n) !== (b < 0n)) ? 1n : 0n);
      case "%": { const r = a % b; return r !== 0n && (r < 0n) !== (b < 0n) ? r + b : r; }
      case "**": return b < 0n ? Number(a) ** Number(b) : a ** b;
    }
  }
  const [x, y] = [asFloat(a), asFloat(b)];  // Python: an int with a float gives a float
  if ((op === "/" || op === "//" || op === "%") && y === 0) throw new Error("division by zero");
  switch (op) {
    case "+": return x + y;
    case "-": return x - y;
    case "*": return x * y;
    case "/": return x / y;
    case "//": return Math.floor(x / y);
    case "%": return x - y * Math.floor(x / y);
    case "**": return x ** y;
  }
  throw new Error(`unknown operator ${op}`);
}

function index(seq, key) {
  if (Array.isArray(seq) || typeof seq === "string") {
    let i = Number(key);
    if (i < 0) i += seq.length;
    if (!Number.isInteger(i) || i < 0 || i >= seq.length) throw new Error(`index ${key} out of range`);
    return seq[i];
  }
  if (isRecord(seq) && typeof key === "string" && Object.hasOwn(seq, key)) return seq[key];
  throw new Error(`no ${JSON.stringify(String(key))} in this record`);
}

function items(iterable) {
  if (Array.isArray(iterable)) return iterable;
  if (isRecord(iterable)) return Object.keys(iterable);
  if (typeof iterable === "string") return [...iterable];
  throw new Error(`cannot go through ${typeof iterable}`);
}

const OPERATORS = new Set(["+", "-", "*", "/", "//", "%", "**"]);
const ORDERS = new Set(["<", "<=", ">", ">="]);

export function evaluate(tree, scope) {
  const [kind] = tree;
  const at = (i) => evaluate(tree[i], scope);
  if (OPERATORS.has(kind)) return arithmetic(kind, at(1), at(2));
  if (ORDERS.has(kind)) return order(kind, at(1), at(2));
  switch (kind) {
    case "const": return tree[1];
    case "int": return BigInt(tree[1]);
    case "float": return Number(tree[1]);
    case "str": return tree[1];
    case "name": return scope.get(tree[1]);
    case "attr": {
      const record = at(1);
      if (!isRecord(record) || !Object.hasOwn(record, tree[2])) throw new Error(`no field ${tree[2]} in this record`);
      return record[tree[2]];
    }
    case "index": return index(at(1), at(2));
    case "slice": {
      const bound = (i) => (tree[i] === null ? undefined : Number(at(i)));
      return at(1).slice(bound(2), bound(3));
    }
    case "neg": { const a = asInt(at(1)); return -a; }
    case "not": return !truthy(at(1));
    case "==": return equal(at(1), at(2));
    case "!=": return !equal(at(1), at(2));
    case "in": return contains(at(2), at(1));
    case "not in": return !contains(at(2), at(1));
    case "is": return at(1) === at(2);
    case "is not": return at(1) !== at(2);
    case "and": case "or": {
      let value = null;
      for (let i = 1; i < tree.length; i++) {
        value = at(i);
        if (truthy(value) === (kind === "or")) return value;
      }
      return value;
    }
    case "if": return truthy(at(1)) ? at(2) : at(3);
    case "call": {
      const fn = at(1);
      if (typeof fn !== "function") throw new Error("called something that is not a function");
      return fn(scope, ...tree[2].map((arg) => evaluate(arg, scope)));
    }
    case "lambda": {
      const [, params, body] = tree;
      return (_caller, ...args) => {
        if (args.length !== params.length) throw new Error(`a lambda of ${params.length} arguments was given ${args.length}`);
        return evaluate(body, scope.child(Object.fromEntries(params.map((p, i) => [p, args[i]]))));
      };
    }
    case "list": return tree[1].map((x) => evaluate(x, scope));
    case "dict": {
      const out = {};
      for (const [key, value] of tree[1]) {
        if (key === null) Object.assign(out, evaluate(value, scope));
        else out[evaluate(key, scope)] = evaluate(value, scope);
      }
      return out;
    }
    case "comp": return comprehension(tree, scope);
    case "fstr": return tree[1].map((p) => (typeof p === "string" ? p : format(evaluate(p[1], scope), p[2]))).join("");
  }
  throw new Error(`unknown construct ${kind} in the shape statement`);
}

function comprehension(tree, scope) {
  const [, kind, elt, targets, unpack, iterable, filters] = tree;
  const out = kind === "dict" ? {} : [];
  for (const item of items(evaluate(iterable, scope))) {
    const bound = unpack ? Object.fromEntries(targets.map((t, i) => [t, index(item, BigInt(i))])) : { [targets[0]]: item };
    const inner = scope.child(bound);
    if (!filters.every((f) => truthy(evaluate(f, inner)))) continue;
    if (kind === "dict") out[evaluate(elt[0], inner)] = evaluate(elt[1], inner);
    else out.push(evaluate(elt, inner));
  }
  return out;
}

// ---- formatting: Python's str() and format specs "", ",", "g", [,].Nf and .N% ----------------

// Python's "{:,}": thousands grouped in the whole part
function group(s) {
  const [whole, frac] = s.split(".");
  const sign = whole.startsWith("-") ? "-" : "";
  const digits = whole.slice(sign.length).replace(/\B(?=(\d{3})+(?!\d))/g, ",");
  return sign + digits + (frac === undefined ? "" : "." + frac);
}

// Python's "{:.pf}": correctly rounded, an exact tie to the even digit (toFixed rounds it up).
// A double is a tie at p decimals exactly when x·2^(p+1) is an odd integer.
function fixed(x, p) {
  if (!Number.isFinite(x)) return Number.isNaN(x) ? "nan" : x > 0 ? "inf" : "-inf";
  const sign = x < 0 || Object.is(x, -0) ? "-" : "";
  const a = Math.abs(x);
  const t = a * 2 ** (p + 1);
  let digits;  // round(a · 10^p) as a decimal string
  if (Number.isInteger(t) && t % 2 === 1) {
    const low = (BigInt(t) * 5n ** BigInt(p) - 1n) / 2n;  // a · 10^p = low + ½
    digits = (low % 2n === 0n ? low : low + 1n).toString();
  } else if (a < 1e21) {
    digits = a.toFixed(p).replace(".", "");
  } else {
    digits = BigInt(a).toString() + "0".repeat(p);  // a whole number at that size
  }
  digits = digits.padStart(p + 1, "0");
  return sign + (p ? `${digits.slice(0, -p)}.${digits.slice(-p)}` : digits);
}

const stripZeros = (s) => (s.includes(".") ? s.replace(/0+$/, "").replace(/\.$/, "") : s);
const exponent = (e) => `e${e < 0 ? "-" : "+"}${String(Math.abs(e)).padStart(2, "0")}`;

// Python's "{:g}" (6 significant digits; a tie in the exponent form rounds up here)
function general(x) {
  if (!Number.isFinite(x)) return fixed(x, 0);
  if (x === 0) return Object.is(x, -0) ? "-0" : "0";
  const [mantissa, power] = x.toExponential(5).split("e");
  const e = Number(power);
  if (e >= -4 && e < 6) return stripZeros(fixed(x, 5 - e));
  return stripZeros(mantissa) + exponent(e);
}

// Python's repr of a float: the shortest digits that read back the same, in Python's layout
function floatRepr(x) {
  if (!Number.isFinite(x)) return fixed(x, 0);
  if (x === 0) return Object.is(x, -0) ? "-0.0" : "0.0";
  const [m, power] = Math.abs(x).toExponential().split("e");
  const digits = m.replace(".", ""), e = Number(power), sign = x < 0 ? "-" : "";
  if (e < -4 || e >= 16) return sign + (digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits) + exponent(e);
  if (e < 0) return `${sign}0.${"0".repeat(-e - 1)}${digits}`;
  if (digits.length <= e + 1) return `${sign}${digits}${"0".repeat(e + 1 - digits.length)}.0`;
  return `${sign}${digits.slice(0, e + 1)}.${digits.slice(e + 1)}`;
}

// Python's str() of a value in a sentence
export function pyStr(v) {
  if (v === null) return "None";
  if (typeof v === "boolean") return v ? "True" : "False";
  if (typeof v === "bigint" || typeof v === "string") return String(v);
  if (typeof v === "number") return floatRepr(v);
  throw new Error(`cannot write ${Array.isArray(v) ? "a list" : typeof v} in a sentence`);
}

export function format(value, spec) {
  if (spec === "") return pyStr(value);
  if (spec === "g") return general(asFloat(value));
  const m = /^(,?)(?:\.(\d+)([f%]))?$/.exec(spec);
  if (!m) throw new Error(`format spec '${spec}' is not one the shape statement uses`);
  if (m[2] === undefined) return group(typeof value === "bigint" ? String(value) : pyStr(asFloat(value)));
  const pct = m[3] === "%";
  const s = fixed(asFloat(value) * (pct ? 100 : 1), Number(m[2]));
  return (m[1] ? group(s) : s) + (pct ? "%" : "");
}

// ---- the built-in functions (headlab.shapes.formula.BUILTINS) --------------------------------

function maximum(...args) {
  const values = args.length === 1 ? items(args[0]) : args;
  if (!values.length) throw new Error("max() of nothing");
  return values.reduce((best, v) => (order(">", v, best) ? v : best));
}

const product = (values) => items(values).reduce((a, b) => arithmetic("*", a, b), 1n);
const splitShape = (pattern) => pattern.split("×").map((dim) => dim.split("·"));

export const BUILTINS = {
  abs: (_s, v) => (typeof v === "bigint" ? (v < 0n ? -v : v) : Math.abs(v)),
  // ascending divisors: the head counts that split n (each up to √n paired with its cofactor)
  divisors: (_s, n) => {
    const small = [];
    for (let h = 1n; h * h <= n; h++) if (n % h === 0n) small.push(h);
    const all = [...small, ...small.map((h) => n / h)].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
    return all.filter((h, i) => i === 0 || h !== all[i - 1]);
  },
  // a symbolic shape ("B×h×n×d_k"; '·' multiplies) at the sizes the caller's scope names
  dims: (scope, pattern) => splitShape(pattern).map((dim) => product(dim.map((f) => scope.get(f)))),
  is_bool: (_s, v) => typeof v === "boolean",
  is_int: (_s, v) => typeof v === "bigint",
  join: (_s, values, sep) => items(values).map(pyStr).join(sep),
  len: (_s, v) => BigInt(isRecord(v) ? Object.keys(v).length : v.length),
  log2: (_s, v) => Math.log2(asFloat(v)),
  max: (_s, ...args) => maximum(...args),
  prod: (_s, values) => product(values),
  rename: (_s, pattern, names) => splitShape(pattern).map((dim) => dim.map((f) => (Object.hasOwn(names, f) ? names[f] : f)).join("·")).join("×"),
  sum: (_s, values) => items(values).reduce((a, b) => arithmetic("+", a, b), 0n),
};
