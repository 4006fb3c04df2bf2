// The layer, drawn: one multi-head attention layer as an SVG, from a ShapeReport (POST /api/shapes
// or headlab.shapes.trace_shapes(...).to_dict()). X → W_Q, W_K, W_V → h heads (one colour each;
// under GQA one key/value box spans the query heads that share it) → scores → softmax → A·V →
// concatenate → W_O → added to the residual stream. Every row carries its live shape; stepping
// through it highlights one stage, its rows of the shape table and the lines of code that run it.
// Drawn to the width it is given: 880 px side by side (text left, picture right); narrower, each
// row's text wraps above its picture, so that a phone shows every label whole.
import { h, s, clear } from "./dom.js";
import { SERIES } from "./colour.js";
import { onWidth } from "./export.js";
import { FONT, MONO, fitText, textWidth, wrapText } from "./svg-text.js";

const W = 880, G0 = 360, GW = 510, MAX_LANES = 8, NARROW_G0 = 34;
const FORWARD = "headlab.attention.MultiHeadAttention.forward";
const ATTENTION = "headlab.attention.attention";
const BLOCK = "headlab.model.Block.forward";

// Each step: the ShapeReport stages it shows, and the code that runs it: [function, first line, last line].
export const STEPS = [
  { key: "x", title: "Input X: n tokens, d_model numbers each", stages: ["x"], code: [FORWARD, /_check_input\(x\)/, /record\("x"/] },
  { key: "project", title: "Project: Q = X·W_Q, K = X·W_K, V = X·W_V", stages: ["q_proj", "k_proj", "v_proj"], code: [FORWARD, /# 1\)/, /record\("q_proj"/] },
  { key: "split", title: "Split the width into heads", stages: ["q", "k", "v", "k_all", "v_all", "k_rep", "v_rep"], code: [FORWARD, /# 2\)/, /record\("q", q\)/] },
  { key: "scores", title: "Scores: each query · each key / √d_k", stages: ["scores"], code: [ATTENTION, /# 1\)/, /record\("scores"/] },
  { key: "softmax", title: "Softmax: each row becomes weights", stages: ["weights"], code: [ATTENTION, /# 2\)/, /record\("weights"/] },
  { key: "av", title: "A·V: weighted average of the values", stages: ["head_out"], code: [ATTENTION, /# 3\)/, /return out/] },
  { key: "concat", title: "Concatenate the heads side by side", stages: ["merged"], code: [FORWARD, /# 4\)/, /merge_heads\(out\)/] },
  { key: "wo", title: "W_O mixes the heads back to d_model", stages: ["out"], code: [FORWARD, /self\.W_O\(merged\)/, /record\("merged"/] },
  { key: "residual", title: "Added to the residual stream: x + Y", stages: [], code: [BLOCK, /x = self\.norm_attn\(x \+ a\)/, /record\("resid_mid"/] },
];

const headColour = (i) => SERIES[i % SERIES.length];
const DARK_TEXT = new Set([4, 5, 7]);  // orange, sky blue, yellow: dark text reads on them
const shapeOf = (st) => `(${st.shape.join(", ")})`;

// Which query heads get a lane: whole key/value groups while they fit, else the first heads.
export function lanes(hq, hkv) {
  const g = hq / hkv;
  const shown = hq <= MAX_LANES ? hq : g <= MAX_LANES ? Math.floor(MAX_LANES / g) * g : MAX_LANES - 1;
  return { heads: Array.from({ length: shown }, (_, i) => i), hidden: hq - shown, g };
}

function text(x, y, str, { size = 12, weight = null, mono = false, anchor = null, fill = "#1d2330", cls = "dg-label" } = {}) {
  return s("text", { x, y, "font-size": size, "font-weight": weight, "font-family": mono ? MONO : FONT, "text-anchor": anchor, fill, class: cls, text: str });
}

// A row's text within `room` px: its title wrapped, each shape line whole or broken after "=".
function rowLines(step, lines, room) {
  const title = wrapText(step.title, room, 13, 600);
  const shapes = lines.flatMap((line) => {
    if (textWidth(line, 12, 400, MONO) <= room) return [line];
    const [lhs, rhs] = line.split(" = ");
    return [`${lhs} =`, `  ${rhs}`].map((part) => fitText(part, room, 12, 400, MONO));
  });
  return { title, shapes, height: 20 * title.length + 16 * shapes.length + 4 };
}

// The text of a row: its number and title, then one line per stage shape.
function rowText(k, text_, y) {
  const g = s("g", {});
  g.append(text(14, y + 15, `${k + 1}`, { size: 13, weight: 700, cls: "dg-label dg-num" }));
  text_.title.forEach((line, m) => g.append(text(34, y + 15 + 18 * m, line, { size: 13, weight: 600 })));
  const top = y + 15 + 18 * (text_.title.length - 1);
  text_.shapes.forEach((line, m) => g.append(text(34, top + 18 + 16 * m, line, { mono: true, fill: "#3d4555" })));
  return g;
}

function stageLines(step, byName) {
  const named = { q_proj: "Q", k_proj: "K", v_proj: "V", q: "Q", k: "K", v: "V", k_all: "K+cache", v_all: "V+cache" };
  if (step.key === "residual") return [`B×n×d_model = ${shapeOf(byName.out)}`];
  const stages = step.stages.map((n) => byName[n]).filter((st) => st && !st.name.endsWith("_rep"));
  return stages.map((st) => `${named[st.name] ? `${named[st.name]}: ` : ""}${st.symbolic} = ${shapeOf(st)}`);
}

// x positions of the lanes (one per drawn query head, plus "…" for the hidden ones) in the
// picture that starts at x0 and is w wide.
function laneGeometry(plan, x0, w) {
  const count = plan.heads.length + (plan.hidden ? 1 : 0);
  const width = w / count;
  return { width, x: (i) => x0 + i * width, count, x0, w };
}

function bar(geo, y, width, height, fill, label) {
  const g = s("g", {});
  g.append(s("rect", { x: geo.x0, y, width, height, rx: 3, fill, stroke: "#5a6273", "stroke-width": 0.8 }));
  if (label && width > textWidth(label, 11) + 12) g.append(text(geo.x0 + 6, y + height / 2 + 4, label, { size: 11, fill: "#1d2330" }));
  return g;
}

// A bar cut into the drawn heads' colours: Q before the split, the heads after concatenation.
function striped(y, height, plan, geo, opacity) {
  const g = s("g", {});
  plan.heads.forEach((i) => g.append(s("rect", { x: geo.x(i), y, width: geo.width, height, fill: headColour(i), "fill-opacity": opacity })));
  if (plan.hidden) g.append(s("rect", { x: geo.x(plan.heads.length), y, width: geo.width, height, fill: "#c9ced8" }));
  g.append(s("rect", { x: geo.x0, y, width: geo.w, height, rx: 3, fill: "none", stroke: "#5a6273", "stroke-width": 0.8 }));
  return g;
}

// The lane that stands for the heads not drawn.
function more(plan, geo, y) {
  if (!plan.hidden) return null;
  return text(geo.x(plan.heads.length) + geo.width / 2, y, `+${plan.hidden}`, { size: 12, anchor: "middle", weight: 700, cls: "dg-label dg-more" });
}

// The split row: one coloured box per query head, one key/value box per group of query heads it
// serves (a group cut short by the "+N" lane stretches over it).
function splitGraphic(y, plan, geo) {
  const g = s("g", {});
  plan.heads.forEach((i) => {
    g.append(s("rect", { x: geo.x(i) + 3, y, width: geo.width - 6, height: 18, rx: 3, fill: headColour(i), "data-head": i }));
    if (geo.width > 34) g.append(text(geo.x(i) + geo.width / 2, y + 13, `Q${i}`, { size: 11, anchor: "middle", fill: DARK_TEXT.has(i % SERIES.length) ? "#1d2330" : "#ffffff" }));
  });
  const more_ = more(plan, geo, y + 13);
  if (more_) g.append(more_);
  const groups = Math.ceil(plan.heads.length / plan.g);
  for (let j = 0; j < groups; j += 1) {
    const first = j * plan.g;
    const cut = first + plan.g > plan.heads.length;
    const last = cut ? geo.count - 1 : first + plan.g - 1;
    const x = geo.x(first) + 3, width = geo.x(last) + geo.width - 3 - x;
    for (const [m, name] of [[0, "K"], [1, "V"]]) {
      const yy = y + 24 + m * 24;
      const own = plan.g === 1;  // MHA: each key/value head belongs to one query head
      g.append(s("rect", { x, y: yy, width, height: 18, rx: 3, fill: own ? headColour(first) : "#e8ebf1", "fill-opacity": own ? 0.55 : 1,
        stroke: own ? headColour(first) : "#3d4555", "stroke-width": own ? 1 : 1.5, class: `dg-kv dg-${name.toLowerCase()}`, "data-kv-head": j, "data-serves": plan.g }));
      const long = `${name}${j}, shared by ${plan.g} heads`;
      const label = !own && width > long.length * 6.4 + 8 ? long : `${name}${j}`;
      if (width > label.length * 6.4 + 6) g.append(text(x + width / 2, yy + 13, label, { size: 11, anchor: "middle" }));
    }
  }
  return g;
}

function glyphRow(y, plan, geo, size, draw) {
  const g = s("g", {});
  plan.heads.forEach((i) => {
    const side = Math.min(size, geo.width - 10);
    g.append(draw(i, geo.x(i) + (geo.width - side) / 2, y, side));
  });
  const more_ = more(plan, geo, y + 16);
  if (more_) g.append(more_);
  return g;
}

// A stylised pattern: a lower triangle (causal) or a full square, heavier on the diagonal.
function patternGlyph(i, x, y, side, weights) {
  const g = s("g", { "data-head": i });
  const cells = 5, cell = side / cells;
  for (let r = 0; r < cells; r += 1) {
    for (let col = 0; col <= r; col += 1) {
      const w = weights ? (col === r ? 0.9 : col === r - 1 ? 0.5 : 0.18) : 0.45;
      g.append(s("rect", { x: x + col * cell, y: y + r * cell, width: cell, height: cell, fill: headColour(i), "fill-opacity": w }));
    }
  }
  g.append(s("rect", { x, y, width: side, height: side, fill: "none", stroke: headColour(i), "stroke-width": 1.2 }));
  return g;
}

const ROW_HEIGHT = { x: 46, project: 70, split: 78, scores: 52, softmax: 52, av: 46, concat: 46, wo: 46, residual: 46 };

function rowGraphic(step, y, plan, geo, c) {
  const GW_ = geo.w, kvWidth = GW_ * (c.n_kv_heads / c.n_heads);
  switch (step.key) {
    case "x": return bar(geo, y + 8, GW_, 20, "#dfe3ea", "X");
    case "project": {
      const g = s("g", {});
      g.append(striped(y + 4, 16, plan, geo, 0.35), bar(geo, y + 24, kvWidth, 16, "#e8ebf1", "K"), bar(geo, y + 44, kvWidth, 16, "#e8ebf1", "V"));
      return g;
    }
    case "split": return splitGraphic(y + 2, plan, geo);
    case "scores": return glyphRow(y + 6, plan, geo, 38, (i, x, yy, side) => patternGlyph(i, x, yy, side, false));
    case "softmax": return glyphRow(y + 6, plan, geo, 38, (i, x, yy, side) => patternGlyph(i, x, yy, side, true));
    case "av": return glyphRow(y + 8, plan, geo, 1e9, (i, x, yy, side) => s("rect", { x, y: yy, width: side, height: 22, rx: 3, fill: headColour(i), "fill-opacity": 0.8, "data-head": i }));
    case "concat": return striped(y + 8, 22, plan, geo, 0.85);
    case "wo": return bar(geo, y + 8, GW_, 22, "#b9c3d6", "Y = Concat · W_O");
    default: return bar(geo, y + 8, GW_, 22, "#dfe3ea", "x ← x + Y");
  }
}

// The whole figure for one report, `width` px wide; returns the svg and each step's row band.
// At W px and more the text sits left of the picture; narrower, above it.
function draw(report, width = W) {
  const c = report.config;
  const byName = Object.fromEntries(report.stages.map((st) => [st.name, st]));
  const plan = lanes(c.n_heads, c.n_kv_heads);
  const wide = width >= W, full = wide ? W : width;
  const geo = wide ? laneGeometry(plan, G0, GW) : laneGeometry(plan, NARROW_G0, full - NARROW_G0 - 8);
  const rows = [];
  let y = 8;
  const body = s("g", {});
  STEPS.forEach((step, k) => {
    const text_ = rowLines(step, stageLines(step, byName), (wide ? G0 - 12 : full) - 34 - 6);
    const above = wide ? 0 : text_.height + 4;  // the picture's top, under the text when narrow
    const height = wide ? Math.max(ROW_HEIGHT[step.key], text_.height) : above + ROW_HEIGHT[step.key];
    const band = s("rect", { x: 2, y, width: full - 4, height: height - 4, rx: 6, fill: "transparent", class: "dg-band", "data-step": k });
    const row = s("g", { class: "dg-row", "data-step": step.key }, band, rowText(k, text_, y), rowGraphic(step, y + 4 + above, plan, geo, c));
    if (k < STEPS.length - 1) row.append(s("path", { d: `M ${geo.x0 - 12} ${y + height - 14} l 0 10 l -4 -5 m 4 5 l 4 -5`, stroke: "#9aa3b5", fill: "none", "aria-hidden": "true" }));
    body.append(row);
    rows.push({ band, row, y, height });
    y += height;
  });
  const svg = s("svg", { viewBox: `0 0 ${full} ${y + 4}`, width: full, class: "layer-diagram readable", role: "img", "font-family": FONT,
    "aria-label": `One ${c.kind} attention layer: d_model ${c.d_model}, ${c.n_heads} query heads, ${c.n_kv_heads} key/value heads, n ${c.seq_len}, B ${c.batch}` });
  svg.append(s("rect", { width: full, height: y + 4, fill: "#ffffff" }), body);
  return { svg, rows };
}

// The lines a step's code covers: from the first line matching `from` to the next matching `to`.
export function codeSpan(source, from, to) {
  const lines = source.split("\n");
  const start = lines.findIndex((l) => from.test(l));
  if (start < 0) return null;
  const end = lines.findIndex((l, k) => k >= start && to.test(l));
  return [start, end < 0 ? start : end];
}

function codePanel(fetchCode, prefix) {
  const where = h("p", { class: "note dg-where", id: `${prefix}-code-where` });
  const pre = h("pre", { class: "dg-code", id: `${prefix}-code`, tabindex: "0", role: "region", "aria-label": "the code of this step" });
  const panel = h("div", { class: "dg-code-panel" }, where, pre);
  let seq = 0;
  const show = async (step) => {
    const mine = ++seq;
    const [name, from, to] = step.code;
    let code;
    try { code = await fetchCode(name); } catch { code = null; }
    if (mine !== seq) return;
    if (!code) { panel.hidden = true; return; }
    panel.hidden = false;
    const span = codeSpan(code.source, from, to) || [-1, -2];
    const lines = code.source.replace(/\n$/, "").split("\n").map((line, k) => h("span", { class: k >= span[0] && k <= span[1] ? "dg-line hl" : "dg-line", "data-line": code.line + k }, `${String(code.line + k).padStart(4)}  ${line}\n`));
    clear(pre, lines);
    where.textContent = `${name.replace(/^headlab\./, "")} in ${code.path}, lines ${code.line + span[0]}–${code.line + span[1]}`;
    const first = pre.querySelector(".hl");
    if (first) pre.scrollTop = Math.max(0, first.offsetTop - pre.offsetTop - 24);
  };
  return { panel, show };
}

// The diagram with its step controls. fetchCode(name) → {path, line, source} or rejects; onStep(stages)
// lets the shape widget mark its table rows. Call update(report) with every new valid report.
// `prefix` starts every id, so several diagrams can share a document (notebook outputs).
export function layerDiagram({ fetchCode = null, onStep = () => {}, prefix = "layer" } = {}) {
  const holder = h("div", { class: "dg-figure" });
  const label = h("p", { class: "dg-step", id: `${prefix}-step`, "aria-live": "polite" });
  const back = h("button", { type: "button", id: `${prefix}-back`, "aria-label": "previous step" }, "◀ Back");
  const next = h("button", { type: "button", id: `${prefix}-next`, "aria-label": "next step" }, "Next ▶");
  const code = fetchCode ? codePanel(fetchCode, prefix) : null;
  const root = h("div", { class: "layer", id: `${prefix}-diagram` }, h("div", { class: "dg-controls" }, back, next, label), holder, code ? code.panel : null);
  const state = { step: 0, drawn: null, report: null };
  const go = (k) => {
    state.step = Math.max(0, Math.min(STEPS.length - 1, k));
    const step = STEPS[state.step];
    label.textContent = `Step ${state.step + 1} of ${STEPS.length}: ${step.title}`;
    back.disabled = state.step === 0;
    next.disabled = state.step === STEPS.length - 1;
    state.drawn?.rows.forEach((r, k2) => r.row.classList.toggle("current", k2 === state.step));
    onStep(step.stages, step);
    if (code) code.show(step);
  };
  back.addEventListener("click", () => go(state.step - 1));
  next.addEventListener("click", () => go(state.step + 1));
  holder.addEventListener("keydown", (e) => {
    const moves = { ArrowDown: 1, ArrowRight: 1, ArrowUp: -1, ArrowLeft: -1, Home: -99, End: 99 };
    if (!(e.key in moves)) return;
    e.preventDefault();
    go(state.step + moves[e.key]);
  });
  // drawn to the holder's width (at most W), and again when that width changes
  const update = (report) => {
    state.report = report;
    state.width = Math.min(W, Math.floor(holder.clientWidth) || W);
    state.drawn = draw(report, state.width);
    state.drawn.rows.forEach((r, k) => r.row.addEventListener("click", () => go(k)));
    const svg = state.drawn.svg;
    svg.setAttribute("tabindex", "0");
    svg.setAttribute("aria-describedby", `${prefix}-step`);
    const focused = holder.contains(document.activeElement);
    clear(holder, svg);
    if (focused) svg.focus({ preventScroll: true });
    go(state.step);
  };
  onWidth(holder, (width) => { if (state.report && Math.min(W, Math.floor(width)) !== state.width) update(state.report); });
  return { root, update, go, state };
}
