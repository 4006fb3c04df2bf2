// tests/unit/test_shape_statement.py's driver: the static site's shape calculator, run by Node.
// node test_shape_statement.mjs OFFLINE_DIR CASES.json → {reports, values} as JSON on stdout:
// shapesReport(statement, body) for each body, and each expression's value in the statement's
// scope, ints written {"int": digits} and floats {"float": x} so that Python can tell them apart.
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const [offline, casesFile] = process.argv.slice(2);
const at = (f) => pathToFileURL(`${offline}/${f}`).href;
const { shapesReport } = await import(at("shapes.js"));
const { evaluate, statementScope } = await import(at("formula.js"));
const { statement, bodies, expressions } = JSON.parse(readFileSync(casesFile, "utf8"));

function typed(v) {
  if (typeof v === "bigint") return { int: String(v) };
  if (typeof v === "number") return { float: v };
  if (Array.isArray(v)) return v.map(typed);
  if (v !== null && typeof v === "object") return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, typed(x)]));
  return v;
}

function value(tree) {
  try {
    return { value: typed(evaluate(tree, statementScope(statement, {}))) };
  } catch (err) {
    return { error: String(err.message || err) };
  }
}

const reports = bodies.map((body) => shapesReport(statement, body));
process.stdout.write(JSON.stringify({ reports, values: expressions.map(value) }));
