// A head's card (what backs its label) and the induction circuit, both drawn from the server's
// own answers: the `evidence` field of POST /api/heads (headlab.heads.evidence) and POST
// /api/circuit (headlab.heads.circuit). Every field is read defensively: a missing one is left
// out of the card, never shown as a made-up number.
import { h, s, showTip, hideTip } from "./dom.js";
import { FONT, titleLines, textWidth } from "./svg-text.js";
import dagre from "../vendor/dagre.esm.js";
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

// The circuit as a layered graph (dagre, vendored from web/package-lock.json: scripts/vendor_js.py):
// one rank per layer that holds a head, columns left to right where they fit the width, else
// rows top to bottom; every edge whose K-composition stands above its random floor, solid when
// ablating the feeder confirmed it, dashed when not. Edges run around the heads they do not
// join: through a layer they keep to the lane dagre left them between its heads, and between
// layers they bend only inside the gap, where no head is.
const R = 15;  // a head's ring
const BOX = 2 * R + 4;  // the square a head takes in the layout: its ring and the ring's stroke
const GAP = { min: 40, max: 160 };  // the room between two layers side by side
const ROW_GAP = 44;  // between two layers stacked as rows
const MARGIN = 8;
// (nodesep, edgesep) across the ranks, px: between two heads, and between two edges' lanes
const SPACINGS = [[14, 8], [10, 5], [6, 2]];

export function circuitGraph(circuit, { width = CIRCUIT_WIDTH, title = "" } = {}) {
  const W = Math.min(width, CIRCUIT_WIDTH);
  const nodes = [...(circuit.previous || []).map((n) => ({ ...n, kind: "previous" })), ...(circuit.induction || []).map((n) => ({ ...n, kind: "induction" }))];
  const known = new Set(nodes.map((n) => name(n.head)));
  const edges = (circuit.edges || []).filter((e) => e.above_baseline && known.has(name(e.from)) && known.has(name(e.to)) && e.from[0] < e.to[0]);
  const heading = title ? titleLines(title, 0, 14, W) : { els: [], bottom: -4 };
  const top = heading.bottom + 30;  // below the title, with room for the layers' names
  const plan = circuitLayout(nodes, edges, W);
  const H = top + plan.height * plan.scale + MARGIN;
  // width by how far the score stands above the floor: every drawn edge is above it
  const floor = Number(circuit.k_floor) || 0;
  const span = Math.max(1e-9, ...edges.map((e) => (Number(e.k_composition) || 0) - floor));
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, width: W, role: "img", class: "circuit-graph", id: circuit.live ? "live-circuit-graph" : "circuit-graph", "data-floor": circuit.k_floor, "data-layout": plan.rows ? "rows" : "columns", "font-family": FONT,
    "aria-label": title || `induction circuit: ${edges.length} edges above the random floor, ${edges.filter((e) => e.confirmed_by_ablation).length} confirmed by ablation` });
  svg.append(s("rect", { width: W, height: H, fill: "#ffffff" }), ...heading.els);
  // the layers' names at the page's own size, beside (rows) or above (columns) the graph
  const named = (layer, x, y, anchor, text) => s("text", { x, y, "text-anchor": anchor, "font-size": 11, fill: "#3d4555", "data-layer": layer, text });
  if (plan.rows) svg.append(s("text", { x: MARGIN, y: top - 10, "font-size": 11, fill: "#3d4555", text: "layer" }));
  for (const [layer, at] of plan.layers) {
    const spot = top + at * plan.scale;
    svg.append(plan.rows ? named(layer, MARGIN, spot + 4, "start", String(layer)) : named(layer, plan.left + at * plan.scale, top - 10, "middle", `layer ${layer}`));
  }
  // the graph in its own units, shrunk as a whole (rings and edges alike) only where even the
  // tightest spacing is wider than the figure; the heads' names are drawn larger by as much, so
  // that they read at 11 px still (a name of up to 4 characters stays inside its ring down to a
  // scale of about 3/4: SmolLM2's 14 heads on a phone's 390 px are drawn at 0.86)
  const graph = s("g", { transform: `translate(${plan.left} ${top})${plan.scale < 1 ? ` scale(${plan.scale.toFixed(4)})` : ""}` });
  const nameSize = Math.ceil(11000 / plan.scale) / 1000;  // rounded up: never under 11 px
  for (const e of edges) {
    const route = plan.routes.get(`${name(e.from)}-${name(e.to)}`);
    if (route) graph.append(edgePath(e, route, floor, span));
  }
  for (const n of nodes) {
    const [cx, cy] = plan.at.get(name(n.head));
    graph.append(s("g", { "data-node": name(n.head), "data-kind": n.kind },
      s("title", {}, `head ${name(n.head)}: ${n.kind === "previous" ? "previous-token" : "induction"} score ${num(n.score)}`),
      s("circle", { cx, cy, r: R, fill: "#ffffff", stroke: n.kind === "previous" ? "#E69F00" : "#009E73", "stroke-width": 3 }),
      s("text", { x: cx, y: cy + (4 * nameSize) / 11, "text-anchor": "middle", "font-size": nameSize, fill: "#1d2330", text: name(n.head) })));
  }
  svg.append(graph);
  return svg;
}

// Where dagre puts each head and each edge, for a figure `W` px wide, in the graph's own units
// from its top left corner: {at: name → [x, y], routes: "a-b" → the edge's path data, layers:
// [layer, x (columns) or y (rows)], height, rows, left (where the graph starts on the figure),
// scale (≤ 1)}. The ranks are fixed to the layers (a ranker of our own), so a head's place
// along the graph says its layer whatever the edges are.
function circuitLayout(nodes, edges, W) {
  const layers = [...new Set(nodes.map((n) => n.head[0]))].sort((a, b) => a - b);
  const n = layers.length;
  const room = n > 1 ? (W - 2 * MARGIN - n * BOX) / (n - 1) : GAP.max;
  const rows = room < GAP.min;  // columns too narrow for edges to be followed: stack the layers
  const label = rows ? Math.max(...layers.map((l) => textWidth(String(l), 11)), textWidth("layer", 11)) + 10 : 0;
  const across = W - 2 * MARGIN - label;  // the room across the ranks
  // the roomiest spacing whose drawing fits across; the tightest, shrunk, where none does
  let plan;
  for (const [nodesep, edgesep] of SPACINGS) {
    plan = dagreLayout(nodes, edges, layers, { rows, ranksep: rows ? ROW_GAP : Math.min(room, GAP.max), nodesep, edgesep });
    if (plan.wide <= across) break;
  }
  const scale = Math.min(1, across / Math.max(plan.wide, 1));
  const [lo, hi] = plan.bounds;
  const place = ([p, q]) => (rows ? [q - lo[1], p - lo[0]] : [p - lo[0], q - lo[1]]);
  return {
    at: new Map([...plan.centre].map(([k, v]) => [k, place(v)])),
    routes: new Map([...plan.lanes].map(([k, stops]) => [k, pathData(stops.map(place), rows)])),
    layers: layers.map((l, i) => [l, plan.along[i] - lo[0]]),
    height: rows ? hi[0] - lo[0] : hi[1] - lo[1],
    rows, scale, left: MARGIN + label + (across - plan.wide * scale) / 2,
  };
}

// dagre's layout in the graph's own frame, (along the ranks, across them): each head's centre,
// each edge's stops (out of the feeder's far side, into the reader's near side; through each
// layer between them straight along the lane dagre kept free there, its dummy node), each
// layer's place along, the bounds of it all and its extent across.
function dagreLayout(nodes, edges, layers, { rows, ranksep, nodesep, edgesep }) {
  const g = new dagre.graphlib.Graph();
  const rank = new Map(nodes.map((x) => [name(x.head), layers.indexOf(x.head[0])]));
  // dagre doubles every rank (a rank between two for edge labels): a layer is every other one;
  // dagre's own root (which joins the graph up) goes before them all
  g.setGraph({ rankdir: rows ? "TB" : "LR", ranksep, nodesep, edgesep,
    ranker: (inner) => inner.nodes().forEach((v) => { inner.node(v).rank = rank.has(v) ? 2 * rank.get(v) : -1; }) });
  g.setDefaultEdgeLabel(() => ({}));
  for (const x of nodes) g.setNode(name(x.head), { width: BOX, height: BOX });
  for (const e of edges) g.setEdge(name(e.from), name(e.to));
  dagre.layout(g);
  const flip = ({ x, y }) => (rows ? [y, x] : [x, y]);
  const centre = new Map(nodes.map((x) => [name(x.head), flip(g.node(name(x.head)))]));
  const along = layers.map((_, i) => centre.get([...rank].find(([, r]) => r === i)[0])[0]);
  // two layers (a live run's graph, redrawn at each evaluation): no edge can pass a head, so
  // the heads keep their own order in each layer and stay put from one drawing to the next
  if (layers.length <= 2) {
    for (const i of layers.keys()) {
      const here = nodes.filter((x) => rank.get(name(x.head)) === i).sort((a, b) => a.head[1] - b.head[1]).map((x) => centre.get(name(x.head)));
      const spots = here.map((c) => c[1]).sort((a, b) => a - b);
      here.forEach((c, j) => { c[1] = spots[j]; });
    }
  }
  const lanes = new Map();
  for (const e of edges) {
    const [a, b] = [centre.get(name(e.from)), centre.get(name(e.to))];
    const stops = [[a[0] + BOX / 2, a[1]]];
    for (const [p, q] of g.edge(name(e.from), name(e.to)).points.slice(1, -1).map(flip)) {
      if (along.some((x) => Math.abs(x - p) < 0.5)) stops.push([p - BOX / 2, q], [p + BOX / 2, q]);
    }
    stops.push([b[0] - BOX / 2, b[1]]);
    lanes.set(`${name(e.from)}-${name(e.to)}`, stops);
  }
  const corners = [...centre.values()].flatMap(([p, q]) => [[p - BOX / 2, q - BOX / 2], [p + BOX / 2, q + BOX / 2]]);
  const points = corners.length ? corners.concat(...lanes.values()) : [[0, 0]];  // no head: an empty graph
  const lo = [Math.min(...points.map((p) => p[0])), Math.min(...points.map((p) => p[1]))];
  const hi = [Math.max(...points.map((p) => p[0])), Math.max(...points.map((p) => p[1]))];
  return { centre, lanes, along, bounds: [lo, hi], wide: rows ? hi[1] - lo[1] : hi[0] - lo[0] };
}

// Path data through `stops` (pairs: out of a gap, then through a layer): a curve across each gap
// whose tangents lie along the graph at both ends (so it never leaves the gap), a straight line
// through each layer.
function pathData(stops, rows) {
  let d = `M${fmt(stops[0])}`;
  for (let i = 1; i < stops.length; i++) {
    const [p, q] = [stops[i - 1], stops[i]];
    if (i % 2 === 0) { d += ` L${fmt(q)}`; continue; }  // through a layer
    const mid = rows ? (p[1] + q[1]) / 2 : (p[0] + q[0]) / 2;
    const [c1, c2] = rows ? [[p[0], mid], [q[0], mid]] : [[mid, p[1]], [mid, q[1]]];
    d += ` C${fmt(c1)} ${fmt(c2)} ${fmt(q)}`;
  }
  return d;
}
const fmt = ([x, y]) => `${x.toFixed(1)},${y.toFixed(1)}`;

// One edge along the path data `d`, its width by its score's margin over the floor (`span`: the
// widest margin), its colour and dash by what the ablation said.
function edgePath(e, d, floor, span) {
  const ok = Boolean(e.confirmed_by_ablation);
  const untested = e.confirmed_by_ablation === null || e.confirmed_by_ablation === undefined;  // a live run ablates at its end
  const s_ = e.induction_score;
  const said = untested ? "not ablated yet" : `${ok ? "confirmed" : "not confirmed"} by ablation`;
  const text = `${name(e.from)} → ${name(e.to)}: K-composition ${num(e.k_composition, 3)} (floor ${num(floor, 3)}); ${said}${s_ ? ` (induction score ${num(s_.clean)} → ${num(s_.ablated)})` : ""}`;
  const path = s("path", { d, fill: "none", stroke: ok ? "#0072B2" : untested ? "#56B4E9" : "#D55E00", "stroke-width": (1.5 + 6.5 * Math.max(0, (Number(e.k_composition) || 0) - floor) / span).toFixed(2),
    "stroke-dasharray": ok ? null : "5 4", "data-edge": `${name(e.from)}-${name(e.to)}`, "data-k": e.k_composition, "data-confirmed": untested ? "untested" : String(ok) }, s("title", {}, text));
  path.addEventListener("mousemove", (ev) => showTip(ev, text));
  path.addEventListener("mouseleave", hideTip);
  return path;
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
