// A head's card (what backs its label) and the induction circuit, both drawn from the server's
// own answers: the `evidence` field of POST /api/heads (headlab.heads.evidence) and POST
// /api/circuit (headlab.heads.circuit). Every field is read defensively: a missing one is left
// out of the card, never shown as a made-up number.
import { h, s, showTip, hideTip } from "./dom.js";
import { FONT, titleLines } from "./svg-text.js";
import { glossed } from "./glossary.js";

export const CIRCUIT_WIDTH = 640;  // the widest the circuit graph is drawn

// the score each label claims (headlab.heads.scores' names)
const CLAIMS = {
  "previous-token": "previous", "current-token": "self", positional: "positional", induction: "induction_active",
  content: "content", "rare-word": "rare_word", sink: "first_token", "duplicate-token": "duplicate",
};
const num = (v, d = 2) => (Number.isFinite(Number(v)) && v !== null ? Number(v).toFixed(d) : "—");
const signedNum = (v) => (Number(v) >= 0 ? `+${num(v)}` : num(v));
const name = (pair) => (Array.isArray(pair) ? `${pair[0]}.${pair[1]}` : "?");
const spread = (b) => (b ? `${num(b.mean)} ± ${num(b.sd)}` : "—");

// Why the evidence is thin, in words; "" when the label has both a margin and an effect.
export function thinness(row) {
  const reasons = [];
  const key = CLAIMS[row.label];
  const score = row.scores?.[key];
  const floor = row.baselines?.[key]?.random?.floor;
  if (!key) reasons.push("no type's score passed its threshold and its margin over random weights");
  else if (Number.isFinite(score) && Number.isFinite(floor) && score < 2 * floor) reasons.push(`its ${key.replace("_", "-")} score (${num(score)}) is less than twice what random weights reach (${num(floor)})`);
  const acts = row.ablation?.where_it_acts;
  const rise = measured(row.ablation, "where_it_acts");
  if (!row.ablation) reasons.push("it was not ablated (no causal test on this model)");
  else if (acts && Number(rise.value) <= Number(acts.layer_median)) reasons.push(`ablating it raises the loss no more than the median head of its layer (${signedNum(rise.value)} against ${signedNum(acts.layer_median)} nats)`);
  return reasons.length ? `The evidence is thin: ${reasons.join("; ")}.` : "";
}

function scoresTable(row) {
  const key = CLAIMS[row.label];
  const keys = Object.keys(row.scores || {}).filter((k) => !k.endsWith("_mul") && row.baselines?.[k]);
  keys.sort((a, b) => (a === key ? -1 : b === key ? 1 : 0));  // the claimed score first
  return h("div", { class: "table-wrap" }, h("table", { id: "evidence-scores" },
    h("caption", {}, `Head ${row.layer}.${row.head}'s scores beside their baselines`),
    h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "score"), h("th", { scope: "col" }, "this head"),
      h("th", { scope: "col" }, "random weights (mean ± sd)"), h("th", { scope: "col" }, ...glossed("shuffled tokens (mean ± sd)")))),
    h("tbody", {}, keys.map((k) => h("tr", { "data-score": k, class: k === key ? "claimed" : null },
      h("th", { scope: "row" }, k.replace("_", "-")), h("td", {}, num(row.scores[k])),
      h("td", {}, spread(row.baselines[k].random)), h("td", {}, spread(row.baselines[k].shuffled)))))));
}

// One of a head's loss rises ("later_copy", "where_it_acts") as headlab quotes it: the exact
// figure where the head was ablated exactly, else the estimate, saying which it is.
export function measured(a, key) {
  const est = a?.[key]?.loss_rise;
  const exact = a?.exact?.[key];
  if (Number.isFinite(exact)) return { value: exact, how: `measured (the first-order estimate: ${signedNum(est)})` };
  return { value: est, how: a?.method === "attribution" ? "a first-order estimate, not measured" : "measured" };
}

function ablationList(row) {
  const a = row.ablation;
  if (!a) return h("p", { class: "note" }, "Not ablated: the ablations run on causal models only.");
  const rise = (what, r, key) => r && h("li", { "data-rise": key }, ...glossed(`${what}: loss ${signedNum(measured(a, key).value)} nats, ${measured(a, key).how} (the median head of its layer ${signedNum(r.layer_median)})`));
  const feeds = (a.induction_scores || []).map((f) => h("li", { "data-feeds": name(f.head) }, `head ${name(f.head)}'s induction score: ${num(f.from)} → ${num(f.to)}`));
  return h("ul", { id: "evidence-ablation" },
    rise("on a later copy's tokens", a.later_copy, "later_copy"), rise(`on the rows where its type can act (${a.rows ?? "—"})`, a.where_it_acts, "where_it_acts"), feeds);
}

function compositionList(row) {
  const c = row.compositions || {};
  const item = (dir) => (p) => h("li", {}, ...glossed(`${(p.mode || "?").toUpperCase()}-composition ${dir} head ${name(p.head)}: ${num(p.score, 3)}${p.above_baseline ? " (above random matrices)" : " (not above random matrices)"}`));
  const items = [...(c.from || []).map(item("into")), ...(c.into || []).map(item("from"))];
  return items.length ? h("ul", { id: "evidence-compositions" }, items) : h("p", { class: "note" }, "No composition with a head of another layer.");
}

// The card of one head: `row` is one entry of evidence.heads; `mode` the ablation's mode.
export function evidenceCard(row) {
  if (!row) return h("p", { class: "missing", id: "evidence-card" }, "No evidence for this head in the answer.");
  const thin = thinness(row);
  return h("section", { class: "evidence-card", id: "evidence-card", "aria-label": `evidence for head ${row.layer}.${row.head}` },
    h("h3", {}, `What backs head ${row.layer}.${row.head}'s label: ${row.label}`),
    h("p", { id: "evidence-sentence" }, ...glossed(row.evidence || "No sentence in the answer.")),
    thin ? h("p", { class: "missing", id: "evidence-thin" }, ...glossed(thin)) : null,
    scoresTable(row),
    h("h4", {}, ...glossed(`Ablating it (${row.ablation?.mode ?? "—"} ablation)`)), ablationList(row),
    h("h4", {}, ...glossed("Its strongest compositions")), compositionList(row));
}

// Columns by layer, nodes stacked in each; every edge whose K-composition stands above its
// random floor, solid when ablating the feeder confirmed it, dashed when not.
export function circuitGraph(circuit, { width = CIRCUIT_WIDTH, title = "" } = {}) {
  const W = Math.min(width, CIRCUIT_WIDTH);
  const nodes = [...(circuit.previous || []).map((n) => ({ ...n, kind: "previous" })), ...(circuit.induction || []).map((n) => ({ ...n, kind: "induction" }))];
  const layers = [...new Set(nodes.map((n) => n.head[0]))].sort((a, b) => a - b);
  const heading = title ? titleLines(title, 0, 14, W) : { els: [], bottom: -4 };
  const top = heading.bottom + 30, r = 15, gap = 2 * r + 12;
  const perLayer = layers.map((l) => nodes.filter((n) => n.head[0] === l));
  const rows = Math.max(1, ...perLayer.map((p) => p.length));
  const H = top + rows * gap + 8;
  const x = (l) => (layers.length < 2 ? W / 2 : r + 40 + (layers.indexOf(l) * (W - 2 * r - 80)) / (layers.length - 1));
  const at = new Map();
  perLayer.forEach((p) => p.forEach((n, k) => at.set(name(n.head), [x(n.head[0]), top + (rows - p.length) * gap / 2 + k * gap + r])));
  const edges = (circuit.edges || []).filter((e) => e.above_baseline);
  // width by how far the score stands above the floor: every drawn edge is above it
  const floor = Number(circuit.k_floor) || 0;
  const span = Math.max(1e-9, ...edges.map((e) => (Number(e.k_composition) || 0) - floor));
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, width: W, role: "img", class: "circuit-graph", id: circuit.live ? "live-circuit-graph" : "circuit-graph", "data-floor": circuit.k_floor, "font-family": FONT,
    "aria-label": title || `induction circuit: ${edges.length} edges above the random floor, ${edges.filter((e) => e.confirmed_by_ablation).length} confirmed by ablation` });
  svg.append(s("rect", { width: W, height: H, fill: "#ffffff" }), ...heading.els);
  layers.forEach((l) => svg.append(s("text", { x: x(l), y: top - 10, "text-anchor": "middle", "font-size": 11, fill: "#3d4555", text: `layer ${l}` })));
  for (const e of edges) {
    const [a, b] = [at.get(name(e.from)), at.get(name(e.to))];
    if (a && b) svg.append(edgeLine(e, a, b, r, floor, span));
  }
  for (const n of nodes) {
    const [cx, cy] = at.get(name(n.head));
    svg.append(s("g", { "data-node": name(n.head), "data-kind": n.kind },
      s("title", {}, `head ${name(n.head)}: ${n.kind === "previous" ? "previous-token" : "induction"} score ${num(n.score)}`),
      s("circle", { cx, cy, r, fill: "#ffffff", stroke: n.kind === "previous" ? "#E69F00" : "#009E73", "stroke-width": 3 }),
      s("text", { x: cx, y: cy + 4, "text-anchor": "middle", "font-size": 11, fill: "#1d2330", text: name(n.head) })));
  }
  return svg;
}

// One edge between node centres `a` and `b` (radius r), its width by its score's margin over
// the floor (`span`: the widest margin), its colour and dash by what the ablation said.
function edgeLine(e, a, b, r, floor, span) {
  const ok = Boolean(e.confirmed_by_ablation);
  const untested = e.confirmed_by_ablation === null || e.confirmed_by_ablation === undefined;  // a live run ablates at its end
  const s_ = e.induction_score;
  const said = untested ? "not ablated yet" : `${ok ? "confirmed" : "not confirmed"} by ablation`;
  const text = `${name(e.from)} → ${name(e.to)}: K-composition ${num(e.k_composition, 3)} (floor ${num(floor, 3)}); ${said}${s_ ? ` (induction score ${num(s_.clean)} → ${num(s_.ablated)})` : ""}`;
  const line = s("line", { x1: a[0] + r, y1: a[1], x2: b[0] - r, y2: b[1], stroke: ok ? "#0072B2" : untested ? "#56B4E9" : "#D55E00", "stroke-width": (1.5 + 6.5 * Math.max(0, (Number(e.k_composition) || 0) - floor) / span).toFixed(2),
    "stroke-dasharray": ok ? null : "5 4", "data-edge": `${name(e.from)}-${name(e.to)}`, "data-k": e.k_composition, "data-confirmed": untested ? "untested" : String(ok) }, s("title", {}, text));
  line.addEventListener("mousemove", (ev) => showTip(ev, text));
  line.addEventListener("mouseleave", hideTip);
  return line;
}

// A live run's evaluation (`circuit`: server/live.py's circuit_scores; `record`: the eval's
// per-head scores) as circuitGraph's input: every layer-0 and last-layer head a node, every
// pair an edge; `verdict` (the run's end) confirms the edges from a feeder head (ablating it
// cost the in-context gain) into a head labelled induction. Untested (null) until then.
export function liveCircuit(circuit, record, verdict = null) {
  const last = circuit.to_layer;
  const k = circuit.k || [];
  const feeders = new Set((verdict?.feeder_heads || []).map((f) => f.head));
  const inductive = new Set(verdict?.induction_heads || []);
  const edges = k.flatMap((row, i) => row.map((score, j) => ({
    from: [0, i], to: [last, j], k_composition: score, above_baseline: circuit.floor !== null && score >= circuit.floor,
    confirmed_by_ablation: verdict ? feeders.has(`0.${i}`) && inductive.has(`${last}.${j}`) : null })));
  return {
    previous: k.map((_, i) => ({ head: [0, i], score: record?.prev_token?.[0]?.[i] })),
    induction: (k[0] || []).map((_, j) => ({ head: [last, j], score: record?.induction?.[last]?.[j] })),
    edges, k_floor: circuit.floor, live: true,
  };
}

// The sentence under the graph: what was drawn and what was not.
export function circuitNote(circuit) {
  const edges = circuit.edges || [];
  const above = edges.filter((e) => e.above_baseline);
  const confirmed = above.filter((e) => e.confirmed_by_ablation);
  if (!edges.length) return "No previous-token head precedes an induction head on this model: there is no circuit to draw.";
  if (circuit.live) {
    const tested = edges.some((e) => e.confirmed_by_ablation !== null);
    return `Every layer-0 head → last-layer head pair; ${above.length} of ${edges.length} with a K-composition above the random floor (${num(circuit.k_floor, 3)}) are drawn, wider the higher.${tested ? ` ${confirmed.length} confirmed by the run's ablation (solid: from a head whose ablation cost the in-context gain into a head labelled induction), the rest dashed.` : " Light dashed: not ablated yet (the run ablates its heads at the end)."} Orange rings: layer-0 heads (score: previous-token); green: last-layer heads (score: induction).`;
  }
  return `${edges.length} previous-token → induction pairs; ${above.length} with a K-composition above the random floor (${num(circuit.k_floor, 3)}), drawn with width by their score; ${confirmed.length} of them confirmed by ablation (solid: ablating the previous-token head takes the induction head's score to at most half), the rest dashed. Orange rings: previous-token heads; green: induction heads.`;
}
