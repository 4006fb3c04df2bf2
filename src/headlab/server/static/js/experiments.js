// Draws an experiment's shipped results (GET /api/experiments/NAME): its headline numbers, every
// per-step history as an interactive line chart, and every name → number table as bars.
import { h, clear, fmtCompact } from "./dom.js";
import { lineChart, barChart } from "./figures.js";
import { figure } from "./export.js";

const isNum = (v) => typeof v === "number" && Number.isFinite(v);
const pretty = (key) => key.replace(/_/g, " ");

function fmt(v) {
  if (isNum(v)) return Number.isInteger(v) ? fmtCompact(v) : Number(v).toPrecision(3);
  if (Array.isArray(v)) return v.map(fmt).join(", ");
  return String(v);
}

// Top-level scalars and short lists: the run's headline figures.
function headline(results) {
  const facts = Object.entries(results).filter(([, v]) => isNum(v) || typeof v === "string" || typeof v === "boolean"
    || (Array.isArray(v) && v.length <= 8 && v.every((x) => isNum(x) || typeof x === "string")));
  if (!facts.length) return null;
  return h("div", { class: "facts" }, facts.slice(0, 12).map(([k, v]) => h("div", { class: "fact", "data-key": k }, h("b", {}, fmt(v)), h("span", {}, pretty(k)))));
}

// A list of records sharing an x key (step, h, fraction, ...) → one line per numeric field.
function historyKey(rows) {
  if (!Array.isArray(rows) || rows.length < 2 || typeof rows[0] !== "object" || rows[0] === null) return null;
  return ["step", "steps", "tokens", "h", "n_heads", "fraction", "pruned", "context", "h_kv"].find((k) => rows.every((r) => isNum(r[k]))) || null;
}

function phaseWindow(results) {
  const w = results.phase_change_window;
  if (Array.isArray(w) && w.length === 2 && w.every(isNum)) return w;
  if (w && isNum(w.start) && isNum(w.end)) return [w.start, w.end];
  return null;
}

function charts(name, results, path = []) {
  const out = [];
  for (const [key, value] of Object.entries(results)) {
    const x = historyKey(value);
    if (x) {
      const fields = Object.keys(value[0]).filter((k) => k !== x && value.some((r) => isNum(r[k])));
      const groups = [fields.filter((k) => /loss/.test(k)), fields.filter((k) => !/loss/.test(k))].filter((g) => g.length);
      groups.forEach((group, gi) => {
        const series = group.slice(0, 8).map((k) => ({ name: pretty(k), points: value.map((r) => [r[x], r[k]]) }));
        const readout = h("p", { class: "note", "aria-live": "polite" }, "Hover the chart to read exact values.");
        const title = `${pretty([...path, key].join(" "))}${groups.length > 1 ? (gi ? " (scores)" : " (losses)") : ""}`;
        const { svg, legend } = lineChart(series, { title, xLabel: pretty(x), yLabel: gi || !/loss/.test(group[0]) ? "value" : "loss", shade: phaseWindow(results), readout, logX: ["h", "n_heads", "h_kv", "context"].includes(x) });
        out.push(figure(svg, { name: `${name}-${key}-${gi}`, caption: title, data: value, extra: h("div", {}, legend, readout) }));
      });
    } else if (value && typeof value === "object" && !Array.isArray(value)) {
      const entries = Object.entries(value);
      if (entries.length >= 2 && entries.length <= 64 && entries.every(([, v]) => isNum(v))) {
        const title = pretty([...path, key].join(" "));
        const svg = barChart(entries.map(([k, v]) => ({ label: k, value: v })), { title, format: (v) => Number(v).toPrecision(3) });
        out.push(figure(svg, { name: `${name}-${key}`, caption: title, data: value }));
      } else if (path.length < 2) {
        out.push(...charts(name, value, [...path, key]));
      }
    }
  }
  return out;
}

export function renderExperiment(el, name, results) {
  const summary = results.summary || results.conclusion || results.verdict;
  clear(el,
    h("p", { class: "note" }, `From the shipped results of headlab experiment ${name}${results.quick ? " (quick run)" : ""}.`),
    typeof summary === "string" ? h("p", {}, summary) : null,
    headline(results),
    charts(name, results));
}
