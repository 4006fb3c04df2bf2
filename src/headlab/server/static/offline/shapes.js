// Widget 1 in the browser: the JSON of POST /api/shapes, evaluated from the shape statement that
// Python's report is evaluated from (headlab/shapes/statement.py, written by `headlab static` to
// shape-statement.json). Which fields a request may give, their limits and defaults, every shape,
// count, check and sentence are the statement's; this file only walks through it.
// tests/unit/test_shape_statement.py holds the answers equal to `headlab.shapes.trace_shapes` over
// every preset and hundreds of random sizes, and the refusals to the server's.

import { fromJSON, statementScope, toJSON, truthy } from "./formula.js";

// {error: sentence} for a request the server would refuse; else the report, with the head counts
// that would be valid (the widget offers them)
export function shapesReport(statement, body) {
  const rules = statementScope(statement, {});
  for (const [field, value] of Object.entries(body)) {
    if (!truthy(rules.call("accepts", field, fromJSON(value)))) return { error: rules.call("refused", field, JSON.stringify(value)) };
  }
  const config = rules.call("config_of", fromJSON(body));
  const problems = statementScope(statement, { config }).get("size_problems");
  // a closed form, as headlab.shapes.table_shapes (the server traces the real layer)
  const report = statementScope(statement, { config, valid: problems.length === 0, problems, source: "table" });
  return toJSON({ ...report.get("report"), ...report.get("head_counts") });
}
