// The parts every stored experiment's view is built from: a table, a line chart fitted to its
// figure, and the run's verdict sentences.
import { h } from "./dom.js";
import { lineChart, CHART_WIDTH } from "./figures.js";
import { figure } from "./export.js";

export function table(id, head, rows) {
  return h("div", { class: "table-wrap" }, h("table", { id },
    h("thead", {}, h("tr", {}, head.map((c, k) => h("th", { class: k ? "num" : null }, c)))),
    h("tbody", {}, rows.map((r) => h("tr", {}, r.map((c, k) => h("td", { class: k ? "num" : null }, c)))))));
}

// A line chart drawn to the width of its figure; `note` (optional) says what it shows where it
// looks wrong, under its caption.
export function chart(name, series, opts, data, note = null) {
  const readout = h("p", { class: "note", "aria-live": "polite" }, "Hover the chart to read exact values; the buttons show or hide a line.");
  const { svg, legend, draw } = lineChart(series, { ...opts, readout });
  const why = note ? h("p", { class: "chart-note", "data-note": name }, note) : null;
  return figure(svg, { name, caption: opts.title, data, extra: h("div", {}, why, legend, readout), fit: { max: CHART_WIDTH, draw } });
}

export function verdictList(r, id) {
  const verdicts = Array.isArray(r.verdict) ? r.verdict : typeof r.verdict === "string" ? [r.verdict] : [];
  return verdicts.length ? h("ul", { id }, verdicts.map((v) => h("li", {}, v))) : null;
}
