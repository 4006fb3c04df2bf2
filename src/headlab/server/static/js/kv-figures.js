// The KV cache at the calculator's sizes: what MQA and GQA save against MHA, and the three
// streaming policies on one picture. Every byte count is the ShapeReport's (POST /api/shapes:
// real caches built on the meta device); this module only multiplies a report's bytes per
// position by the positions a policy keeps.
import { h, s, fmtInt, fmtBytes } from "./dom.js";
import { glossed } from "./glossary.js";
import { barChart, BAR_WIDTH } from "./bars.js";
import { figure } from "./export.js";
import { FONT, titleLines } from "./svg-text.js";

const COLOURS = { MHA: "#999999", GQA: "#0072B2", MQA: "#009E73" };

// MHA (h K/V heads), this layer's GQA when h_kv is between, and MQA (one), at B·s tokens.
export function kvHeadRows(report) {
  const c = report.config, kv = report.kv_cache;
  const rows = [{ kind: "MHA", heads: c.sizes.h, bytes: kv.mha_bytes, perToken: kv.mha_bytes_per_token }];
  if (c.kind === "GQA") rows.push({ kind: "GQA", heads: c.sizes.h_kv, bytes: kv.bytes, perToken: kv.bytes_per_token });
  if (c.sizes.h > 1) rows.push({ kind: "MQA", heads: 1, bytes: kv.mqa_bytes, perToken: kv.mqa_bytes_per_token });
  return rows;
}

// The positions 0 … t−1 a policy keeps after t tokens, as [from, to) ranges (Xiao et al. 2023;
// headlab.model.streaming.SinkCache keeps the first `sinks` and the last `window`).
export function keptRanges(policy, t, window, sinks) {
  if (policy === "full" || t <= (policy === "window" ? window : sinks + window)) return [[0, t]];
  if (policy === "window") return [[t - window, t]];
  return sinks ? [[0, sinks], [t - window, t]] : [[t - window, t]];
}

const kept = (ranges) => ranges.reduce((a, [x, y]) => a + (y - x), 0);

export function policyRows(report, t, window, sinks) {
  const kv = report.kv_cache, B = report.config.batch;
  const perSlot = kv.sink_bytes_per_token * B;  // a SinkCache slot: keys, values, keys before rotary
  return [
    { policy: "full", name: "full cache", ranges: keptRanges("full", t, window, sinks), slot: kv.bytes_per_token * B },
    { policy: "window", name: `window only (w = ${fmtInt(window)})`, ranges: keptRanges("window", t, window, sinks), capacity: window, slot: perSlot },
    { policy: "sinks", name: `${fmtInt(sinks)} sinks + window`, ranges: keptRanges("sinks", t, window, sinks), capacity: sinks + window, slot: perSlot },
  ].map((r) => ({ ...r, kept: kept(r.ranges), bytes: r.slot * (r.capacity ?? t) }));  // a streaming cache is allocated whole, once
}

function headsFigure(report) {
  const rows = kvHeadRows(report);
  const c = report.config;
  const title = `One layer's KV cache for ${fmtInt(report.kv_cache.tokens)} tokens (B·s), d_k ${c.sizes.d_k}, ${c.dtype}`;
  const items = rows.map((r) => ({ label: `${r.kind}: ${r.heads} K/V head${r.heads > 1 ? "s" : ""}`, value: r.bytes, colour: COLOURS[r.kind] }));
  const draw = (width) => barChart(items, { title, format: fmtBytes, width });
  const table = h("table", { id: "kv-heads-table", class: "compact" },
    h("caption", { class: "note" }, "The same layer with each number of key/value heads"),
    h("thead", {}, h("tr", {}, h("th", {}, "attention"), h("th", { class: "num" }, "K/V heads"), h("th", { class: "num" }, "per token"), h("th", { class: "num" }, "for B·s tokens"), h("th", { class: "num" }, "against MHA"))),
    h("tbody", {}, rows.map((r) => h("tr", { "data-kind": r.kind, "data-bytes": String(r.bytes), "data-per-token": String(r.perToken) },
      h("td", {}, r.kind), h("td", { class: "num" }, fmtInt(r.heads)), h("td", { class: "num" }, fmtBytes(r.perToken)),
      h("td", { class: "num" }, fmtBytes(r.bytes)), h("td", { class: "num" }, r.kind === "MHA" ? "—" : `${(rows[0].bytes / r.bytes).toPrecision(3)}× smaller`)))));
  return figure(null, { name: "kv-heads", caption: `${rows.map((r) => r.kind).join(", ")}: the KV cache of this layer`, data: { rows }, fit: { max: BAR_WIDTH, draw }, extra: h("div", { class: "table-wrap" }, table) });
}

// Three strips over the positions 0 … t−1, one per policy, the kept positions filled.
function policyPicture(rows, t, width) {
  const W = Math.min(width, BAR_WIDTH), L = Math.min(150, Math.round(W * 0.3)), rowH = 30;
  const heading = titleLines(`Positions each policy keeps after ${fmtInt(t)} tokens (oldest left, newest right)`, 0, 16, W);
  const T = heading.bottom + 10, H = T + rows.length * rowH + 18, X = (p) => L + (p / t) * (W - L - 4);
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, width: W, role: "img", "font-family": FONT,
    "aria-label": rows.map((r) => `${r.name}: keeps ${fmtInt(r.kept)} of ${fmtInt(t)} positions`).join("; ") });
  svg.append(s("rect", { width: W, height: H, fill: "#ffffff" }), ...heading.els);
  rows.forEach((r, k) => {
    const y = T + k * rowH;
    svg.append(s("text", { x: L - 6, y: y + 16, "text-anchor": "end", "font-size": 11, fill: "#1d2330", text: r.policy === "full" ? "full" : r.policy === "window" ? "window" : "sinks + window" }));
    svg.append(s("rect", { x: L, y: y + 4, width: W - L - 4, height: 16, fill: "#f1f3f7", stroke: "#8a93a6" }));
    for (const [a, b] of r.ranges) {
      svg.append(s("rect", { x: X(a), y: y + 4, width: Math.max(1.5, X(b) - X(a)), height: 16, fill: r.policy === "sinks" && a === 0 && r.ranges.length > 1 ? "#D55E00" : "#0072B2", "data-range": `${a}-${b}` }));
    }
  });
  svg.append(s("text", { x: L, y: H - 4, "font-size": 10, fill: "#3d4555", text: "0" }),
    s("text", { x: W - 4, y: H - 4, "text-anchor": "end", "font-size": 10, fill: "#3d4555", text: fmtInt(t - 1) }));
  return svg;
}

function policiesFigure(report, state) {
  const total = report.kv_cache.tokens / report.config.batch;
  const box = h("div", { id: "kv-policies" });
  const field = (key, label, min, max) => h("label", { for: `kv-${key}` }, label,
    h("input", { id: `kv-${key}`, name: key, type: "number", min, max, step: 1, value: state[key], inputmode: "numeric" }));
  const controls = h("form", { class: "controls", "aria-label": "streaming policy sizes", onsubmit: (e) => e.preventDefault() },
    field("window", "window w (latest tokens kept)", 1, total), field("sinks", "sinks (first tokens kept)", 0, total),
    h("label", { for: "kv-t" }, `tokens generated so far (1 to ${fmtInt(total)})`,
      h("input", { id: "kv-t", name: "t", type: "range", min: 1, max: total, step: 1, value: Math.min(state.t ?? total, total) })));
  const out = h("div", { "aria-live": "polite" });
  const draw = () => {
    const w = Number(controls.elements.window.value), sk = Number(controls.elements.sinks.value), t = Number(controls.elements.t.value);
    if (!Number.isInteger(w) || w < 1 || !Number.isInteger(sk) || sk < 0) {
      out.replaceChildren(h("p", { class: "problems", role: "alert" }, "The window must be a whole number of at least 1 and the sinks a whole number of at least 0."));
      return;
    }
    Object.assign(state, { window: w, sinks: sk, t });
    const rows = policyRows(report, t, w, sk);
    const table = h("table", { id: "kv-policies-table", class: "compact" },
      h("caption", { class: "note" }, glossed("Memory of one layer's cache under each policy, B sequences (a streaming cache also keeps its keys before rotary, to turn them again as they move)")),
      h("thead", {}, h("tr", {}, h("th", {}, "policy"), h("th", { class: "num" }, "positions kept"), h("th", {}, "which"), h("th", { class: "num" }, "memory"))),
      h("tbody", {}, rows.map((r) => h("tr", { "data-policy": r.policy, "data-kept": String(r.kept), "data-bytes": String(r.bytes) },
        h("td", {}, r.name), h("td", { class: "num" }, fmtInt(r.kept)), h("td", {}, r.ranges.map(([a, b]) => (b - a === 1 ? `${a}` : `${a}–${b - 1}`)).join(", ")),
        h("td", { class: "num" }, fmtBytes(r.bytes))))));
    out.replaceChildren(figure(null, { name: "kv-policies", caption: "Full cache, window only, sinks + window (StreamingLLM, Xiao et al. 2023)", data: { t, window: w, sinks: sk, rows },
      fit: { max: BAR_WIDTH, draw: (width) => policyPicture(rows, t, width) }, extra: h("div", { class: "table-wrap" }, table) }));
  };
  controls.addEventListener("input", draw);
  draw();
  box.append(controls, out);
  return box;
}

// The section for one report: state keeps the reader's window, sinks and t across reports.
export function kvFigures(report, state) {
  const total = report.kv_cache.tokens / report.config.batch;
  if (state.window == null || state.window > total) state.window = Math.max(1, Math.min(state.preferredWindow ?? Math.floor(total / 4), total));
  if (state.sinks == null || state.sinks > total) state.sinks = Math.min(4, total);
  if (state.t == null || state.t > total) state.t = total;
  return h("section", { class: "kv-figures", id: "kv-figures", "aria-labelledby": "kv-figures-h" },
    h("h3", { id: "kv-figures-h" }, "The KV cache at these sizes"),
    h("p", { class: "note" }, ...glossed(`Generating, each layer keeps the keys and values of past tokens in its KV cache: ${fmtBytes(report.kv_cache.bytes_per_token)} per token here. Sharing K/V heads shrinks every position; a streaming policy keeps fewer positions.`), " Both are explained in ", h("a", { href: "#kv-cache" }, "§9, the KV cache"), "."),
    headsFigure(report), policiesFigure(report, state));
}
