// SVG figures drawn from API data: attention heatmaps, the two-column view, line charts. Each
// takes the width it may use, so that a phone gets the whole figure, not a scrolling crop.
import { viridis, viridisRGB, SERIES } from "./colour.js";
import { h, s, showTip, hideTip } from "./dom.js";
import { FONT, fitText, textWidth, titleLines } from "./svg-text.js";

const short = (t, k = 10) => (t.length > k ? `${t.slice(0, k - 1)}…` : t);

// A heatmap of one head's weights: rows are queries i, columns keys j. `readout` (optional) is an
// element that receives the exact weight under the pointer or the keyboard cursor. Labels are
// drawn at LABEL px, one per CELL px, so they never shrink or overlap: a long input shows a
// window of WINDOW × WINDOW cells (fewer where `room`, the px it may use, is narrower), and a
// map of the whole pattern in the top-left corner holds a box to drag (or the arrow keys) that
// moves it. Heatmaps of the same tokens move together.
const CELL = 16, LABEL = 12, WINDOW = 22, PAD = 84, MIN_WINDOW = 8;
export const HEATMAP_WIDTH = PAD + WINDOW * CELL + 4;  // the widest a heatmap is drawn

// `window` widens the window for a figure that must show a whole short pattern at once; `room`
// is the width in px the heatmap may take (HEATMAP_WIDTH when not given).
export function heatmap(weights, tokens, { title = "", small = false, readout = null, window: win = WINDOW, room = null } = {}) {
  if (small) return thumbnail(weights, title);
  const n = weights.length, m = weights[0]?.length ?? 0;
  // the whole pattern when it fits at LABEL px or more a cell (larger when short, up to 22 px),
  // else a window of CELL px cells: WINDOW of them, or as many as `room` holds
  const grid = Math.min(WINDOW * CELL, room ? Math.max(MIN_WINDOW * LABEL, room - PAD - 4) : Infinity);
  const big = Math.max(n, m, 1);
  const whole = big <= win && Math.floor(grid / big) >= LABEL;
  const cell = whole ? Math.min(22, Math.floor(grid / big)) : CELL;
  const k = whole ? big : Math.max(MIN_WINDOW, Math.min(win, Math.floor(grid / CELL)));
  const rows = Math.min(n, k), cols = Math.min(m, k);
  const windowed = n > rows || m > cols;
  const width = PAD + cols * cell + 4;
  const heading = title ? titleLines(title, 0, 13, width) : { els: [], bottom: 0 };
  const head = heading.bottom + 5 + (windowed ? 16 : 0);
  const top = head + PAD, height = top + rows * cell + 4;
  const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, width, height, role: "img", "aria-label": title || "attention pattern",
    "font-family": FONT, class: "heatmap readable", "shape-rendering": "crispEdges", "data-n": n });
  svg.append(s("rect", { width, height, fill: "#ffffff" }), ...heading.els);
  const hint = windowed ? s("text", { x: 0, y: heading.bottom + 17, "font-size": 11, fill: "#3d4555" }) : null;
  if (hint) svg.append(hint);
  const view = { weights, tokens, svg, cell, top, rows, cols, hint, readout, cells: [], rowLabels: [], colLabels: [], n, m, width };
  drawCells(view);
  drawBands(view);
  drawLabels(view);
  if (windowed) view.brush = drawMap(view, head);
  const shared = windowOf(tokens);
  shared.views.add(view);
  view.place = (i0, j0) => placeWindow(view, i0, j0);
  view.place(shared.i0, shared.j0);
  attachCursor(view);
  return svg;
}

// Heatmaps of one token list share where their window is.
const WINDOWS = new WeakMap();
function windowOf(tokens) {
  if (!WINDOWS.has(tokens)) WINDOWS.set(tokens, { i0: 0, j0: 0, views: new Set() });
  return WINDOWS.get(tokens);
}

// Place the shared window of heatmaps of `tokens` where a head's action is. An induction head
// acts on a repeat: query i attends to key j whose previous token equals token i (j - 1 < i),
// so the window goes where the head puts the most weight on such cells (the second copy's
// queries against the first copy's keys), not on the first copy, where it only rests. Any other
// head gets a window on the diagonal at the current rows, where previous-token, positional and
// self patterns show. Nothing moves when every token fits.
export function focusWindow(weights, tokens, kind) {
  const n = weights.length, m = weights[0]?.length ?? 0;
  const rows = Math.min(n, WINDOW), cols = Math.min(m, WINDOW);
  if (n <= rows && m <= cols) return;
  const shared = windowOf(tokens);
  let [i0, j0] = [shared.i0, Math.max(0, Math.min(m - cols, shared.i0))];
  if (kind === "induction") {
    // P[i][j]: the head's weight on induction cells of queries < i and keys < j
    const P = Array.from({ length: n + 1 }, () => new Float64Array(m + 1));
    for (let i = 0; i < n; i += 1) {
      for (let j = 0; j < m; j += 1) {
        const hit = j >= 1 && j <= i && tokens[j - 1] === tokens[i] ? weights[i][j] : 0;
        P[i + 1][j + 1] = hit + P[i][j + 1] + P[i + 1][j] - P[i][j];
      }
    }
    let best = 0;
    for (let a = 0; a + rows <= n; a += 1) {
      for (let b = 0; b + cols <= m; b += 1) {
        const v = P[a + rows][b + cols] - P[a][b + cols] - P[a + rows][b] + P[a][b];
        if (v > best + 1e-9) [best, i0, j0] = [v, a, b];
      }
    }
  }
  moveShared({ tokens }, i0, j0);
}

function moveShared(view, i0, j0) {
  const shared = windowOf(view.tokens);
  shared.i0 = i0;
  shared.j0 = j0;
  for (const other of shared.views) {
    if (other !== view && !other.svg.isConnected) shared.views.delete(other);
    else other.place(i0, j0);
  }
}

function drawCells(view) {
  const { svg, cell, top, rows, cols } = view;
  for (let r = 0; r < rows; r += 1) {
    for (let c = 0; c < cols; c += 1) {
      const rect = s("rect", { x: PAD + c * cell, y: top + r * cell, width: cell, height: cell, class: "hv-cell" });
      svg.append(rect);
      view.cells.push(rect);
    }
  }
}

// Translucent bands over the hovered row and column, and the cursor's outline.
function drawBands(view) {
  const { svg, cell, top, rows, cols } = view;
  view.rowBand = s("rect", { class: "hv-band", x: PAD, width: cols * cell, height: cell, fill: "#ffffff", "fill-opacity": 0.28, stroke: "#ff8c00", "stroke-width": 1, visibility: "hidden", "pointer-events": "none" });
  view.colBand = s("rect", { class: "hv-band", y: top, width: cell, height: rows * cell, fill: "#ffffff", "fill-opacity": 0.28, stroke: "#ff8c00", "stroke-width": 1, visibility: "hidden", "pointer-events": "none" });
  view.marker = s("rect", { class: "hv-band", width: cell, height: cell, fill: "none", stroke: "#ff8c00", "stroke-width": 2.5, visibility: "hidden", "pointer-events": "none" });
  svg.append(view.rowBand, view.colBand, view.marker);
}

function drawLabels(view) {
  const { svg, cell, top, rows, cols } = view;
  const mid = cell / 2 + LABEL / 3;
  for (let r = 0; r < rows; r += 1) {
    const t = s("text", { x: PAD - 5, y: top + r * cell + mid, "text-anchor": "end", "font-size": LABEL, fill: "#1d2330", class: "hv-tok hv-row" });
    svg.append(t);
    view.rowLabels.push(t);
  }
  for (let c = 0; c < cols; c += 1) {
    const x = PAD + c * cell + mid, y = top - 5;
    const t = s("text", { x, y, transform: `rotate(-90 ${x} ${y})`, "font-size": LABEL, fill: "#1d2330", class: "hv-tok hv-col" });
    svg.append(t);
    view.colLabels.push(t);
  }
}

// Show the window whose top-left cell is (query i0, key j0): recolour the cells, relabel the axes.
function placeWindow(view, i0, j0) {
  const { weights, tokens, rows, cols, n, m } = view;
  view.i0 = Math.max(0, Math.min(n - rows, i0));
  view.j0 = Math.max(0, Math.min(m - cols, j0));
  view.cells.forEach((rect, q) => {
    const i = view.i0 + Math.floor(q / cols), j = view.j0 + (q % cols);
    rect.setAttribute("fill", viridis(weights[i][j]));
    rect.dataset.i = i;
    rect.dataset.j = j;
  });
  view.rowLabels.forEach((t, r) => label(t, view.i0 + r, tokens));
  view.colLabels.forEach((t, c) => label(t, view.j0 + c, tokens));
  if (view.hint) view.hint.textContent = hintText(view, rows, cols);
  if (view.brush) view.brush.place(view.i0, view.j0);
}

// "queries 0–21, keys 0–21 of 63: drag the box, or use the arrow keys", as much as fits
function hintText(view, rows, cols) {
  const where = `queries ${view.i0}–${view.i0 + rows - 1}, keys ${view.j0}–${view.j0 + cols - 1} of ${view.n}`;
  const long = `${where}: drag the box, or use the arrow keys`;
  return textWidth(long, 11) <= view.width ? long : fitText(`${where}: drag the box`, view.width, 11);
}

function label(t, k, tokens) {
  t.textContent = short(tokens[k] ?? "");
  t.dataset.k = k;
  t.classList.remove("on");
}

// The whole pattern, small, in the corner above the row labels, with the window's box on it.
function drawMap(view, head) {
  const { svg, n, m, rows, cols } = view;
  const size = PAD - 12, x0 = 0, y0 = head + 4;
  const sx = size / m, sy = size / n;
  svg.append(s("image", { x: x0, y: y0, width: size, height: size, href: patternImage(view.weights), preserveAspectRatio: "none", class: "hv-map" }));
  const box = s("rect", { width: cols * sx, height: rows * sy, fill: "none", stroke: "#ff8c00", "stroke-width": 2, class: "hv-brush" });
  const hit = s("rect", { x: x0, y: y0, width: size, height: size, fill: "transparent", class: "hv-map-hit" });
  svg.append(s("rect", { x: x0, y: y0, width: size, height: size, fill: "none", stroke: "#5a6273" }), box, hit);
  let dragging = false;
  const centre = (e) => {
    const p = svgPoint(svg, e);
    moveShared(view, Math.round((p.y - y0) / sy - rows / 2), Math.round((p.x - x0) / sx - cols / 2));
  };
  hit.addEventListener("pointerdown", (e) => { dragging = true; hit.setPointerCapture?.(e.pointerId); centre(e); });
  hit.addEventListener("pointermove", (e) => { if (dragging) centre(e); });
  hit.addEventListener("pointerup", () => { dragging = false; });
  return { place: (i0, j0) => { box.setAttribute("x", x0 + j0 * sx); box.setAttribute("y", y0 + i0 * sy); } };
}

function svgPoint(svg, e) {
  const box = svg.getBoundingClientRect();
  const vb = svg.viewBox.baseVal;
  return { x: ((e.clientX - box.left) * vb.width) / box.width, y: ((e.clientY - box.top) * vb.height) / box.height };
}

// One pixel per weight, as a data: URL (a few hundred bytes instead of n² SVG rects).
function patternImage(weights) {
  const n = weights.length, m = weights[0]?.length ?? 0;
  const canvas = document.createElement("canvas");
  canvas.width = Math.max(m, 1);
  canvas.height = Math.max(n, 1);
  const ctx = canvas.getContext("2d");
  const img = ctx.createImageData(canvas.width, canvas.height);
  for (let i = 0; i < n; i += 1) {
    for (let j = 0; j < m; j += 1) {
      const [r, g, b] = viridisRGB(weights[i][j]);
      img.data.set([r, g, b, 255], 4 * (i * m + j));
    }
  }
  ctx.putImageData(img, 0, 0);
  return canvas.toDataURL("image/png");
}

// The all-heads grid's thumbnails: the pattern as one image.
function thumbnail(weights, title) {
  const svg = s("svg", { viewBox: "0 0 96 96", role: "img", "aria-label": title || "attention pattern", class: "heatmap thumb" });
  svg.append(s("image", { width: 96, height: 96, href: patternImage(weights), preserveAspectRatio: "none", class: "hv-map" }));
  return svg;
}

function describe(weights, tokens, i, j) {
  return `query ${i} “${tokens[i]}” → key ${j} “${tokens[j]}”: ${Number(weights[i][j]).toFixed(4)}`;
}

// Hover or keyboard: the cell's row and column light up, their tokens turn bold, and the readout
// names both tokens and the weight. A token label lights its row and its column.
function attachCursor(view) {
  const { svg, weights, tokens, readout, rows, cols } = view;
  let cursor = [view.i0 + rows - 1, view.j0];
  const show = (i, j, event, text) => {
    cursor = [i, j];
    highlight(view, i, j);
    const line = text || describe(weights, tokens, i, j);
    if (readout) readout.textContent = line;
    if (event) showTip(event, line);
  };
  svg.addEventListener("mousemove", (e) => {
    const d = e.target.dataset || {};
    if (d.i !== undefined) show(Number(d.i), Number(d.j), e);
    else if (d.k !== undefined) show(Number(d.k), Number(d.k), e, tokenLine(weights, tokens, Number(d.k)));
  });
  svg.addEventListener("mouseleave", () => { hideTip(); highlight(view, null, null); });
  svg.setAttribute("tabindex", "0");
  svg.addEventListener("focus", () => {
    const inside = cursor[0] >= view.i0 && cursor[0] < view.i0 + rows && cursor[1] >= view.j0 && cursor[1] < view.j0 + cols;
    show(...(inside ? cursor : [view.i0 + rows - 1, view.j0]));  // the brush may have moved the window
  });
  svg.addEventListener("blur", () => highlight(view, null, null));
  svg.addEventListener("keydown", (e) => {
    const step = e.shiftKey ? 8 : 1;
    const moves = { ArrowUp: [-step, 0], ArrowDown: [step, 0], ArrowLeft: [0, -step], ArrowRight: [0, step] };
    if (!moves[e.key]) return;
    e.preventDefault();
    const i = Math.min(view.n - 1, Math.max(0, cursor[0] + moves[e.key][0]));
    const j = Math.min(view.m - 1, Math.max(0, cursor[1] + moves[e.key][1]));
    follow(view, i, j);
    show(i, j);
  });
}

// Keep the keyboard cursor inside the window, moving the window (and its twins) when it leaves.
function follow(view, i, j) {
  const i0 = i < view.i0 ? i : i >= view.i0 + view.rows ? i - view.rows + 1 : view.i0;
  const j0 = j < view.j0 ? j : j >= view.j0 + view.cols ? j - view.cols + 1 : view.j0;
  if (i0 !== view.i0 || j0 !== view.j0) moveShared(view, i0, j0);
}

function tokenLine(weights, tokens, k) {
  const row = weights[k] || [];
  const best = row.reduce((b, w, j) => (w > row[b] ? j : b), 0);
  return `token ${k} “${tokens[k]}”: its row is where it looks (most at ${best} “${tokens[best]}”, ${Number(row[best] ?? 0).toFixed(4)}); its column is who looks at it`;
}

function highlight(view, i, j) {
  const { cell, top, rows, cols } = view;
  const r = i === null ? -1 : i - view.i0, c = j === null ? -1 : j - view.j0;
  const rowOn = r >= 0 && r < rows, colOn = c >= 0 && c < cols;
  view.rowBand.setAttribute("y", top + r * cell);
  view.rowBand.setAttribute("visibility", rowOn ? "visible" : "hidden");
  view.colBand.setAttribute("x", PAD + c * cell);
  view.colBand.setAttribute("visibility", colOn ? "visible" : "hidden");
  view.marker.setAttribute("x", PAD + c * cell);
  view.marker.setAttribute("y", top + r * cell);
  view.marker.setAttribute("visibility", rowOn && colOn ? "visible" : "hidden");
  view.rowLabels.forEach((t, k) => t.classList.toggle("on", k === r));
  view.colLabels.forEach((t, k) => t.classList.toggle("on", k === c));
}

// BertViz's view: queries on the left, keys on the right, one line per weight (its opacity and
// width follow the weight). Hover or arrow to a token to see only its lines; Escape shows all.
const ROW = 20, SIDE = 170, VALUE = 30;
export const TWO_COLUMN_WIDTH = 640;  // the widest the two-column view is drawn

// `width`: the px it may take; a narrow view keeps every token, each label cut to its column.
export function twoColumn(weights, tokens, { title = "", minWeight = 0.02, readout = null, width = TWO_COLUMN_WIDTH } = {}) {
  const n = weights.length, m = weights[0]?.length ?? 0;
  const W = Math.min(width, TWO_COLUMN_WIDTH), side = Math.min(SIDE, Math.floor(W * 0.34));
  const heading = title ? titleLines(title, 0, 14, W) : { els: [], bottom: -4 };
  const top = heading.bottom + 30, height = top + Math.max(n, m) * ROW + 6;
  const svg = s("svg", { viewBox: `0 0 ${W} ${height}`, width: W, height, role: "img", "aria-label": title || "attention lines", "font-family": FONT, class: "two-column readable", tabindex: "0" });
  svg.append(s("rect", { width: W, height, fill: "#ffffff" }), ...heading.els);
  svg.append(s("text", { x: side - 6, y: top - 10, "text-anchor": "end", "font-size": 12, fill: "#3d4555", text: fitText("query (looks)", side - 6, 12) }),
    s("text", { x: W - side + 6, y: top - 10, "font-size": 12, fill: "#3d4555", text: fitText("key (looked at)", side - 6, 12) }));
  const y = (k) => top + k * ROW + ROW / 2;
  const lines = s("g", { class: "hv-lines" });
  const byQuery = Array.from({ length: n }, () => []), byKey = Array.from({ length: m }, () => []);
  for (let i = 0; i < n; i += 1) {
    for (let j = 0; j < m; j += 1) {
      const w = Number(weights[i][j]);
      if (!(w >= minWeight)) continue;
      const line = s("line", { x1: side, y1: y(i), x2: W - side, y2: y(j), stroke: "#0072B2", "stroke-opacity": (0.1 + 0.9 * w).toFixed(3), "stroke-width": (0.6 + 3.4 * w).toFixed(2), class: "hv-line", "data-i": i, "data-j": j });
      lines.append(line);
      byQuery[i].push(line);
      byKey[j].push(line);
    }
  }
  svg.append(lines);
  const label = (t, room, max) => fitText(short(t, max), room, LABEL);
  const left = tokens.slice(0, n).map((t, k) => s("text", { x: side - 6, y: y(k) + LABEL / 3, "text-anchor": "end", "font-size": LABEL, fill: "#1d2330", class: "hv-tok hv-left", "data-k": k, text: label(t, side - 8, 18) }));
  const right = tokens.slice(0, m).map((t, k) => s("text", { x: W - side + 6, y: y(k) + LABEL / 3, "font-size": LABEL, fill: "#1d2330", class: "hv-tok hv-right", "data-k": k, text: label(t, side - 10 - VALUE, 14) }));
  const values = tokens.slice(0, m).map((_, k) => s("text", { x: W - 4, y: y(k) + LABEL / 3, "text-anchor": "end", "font-size": 11, fill: "#3d4555", class: "hv-value" }));
  svg.append(...left, ...right, ...values);
  attachTwoColumn({ svg, weights, tokens, readout, left, right, values, byQuery, byKey, n });
  return svg;
}

function attachTwoColumn(v) {
  const { svg, weights, tokens, readout, left, right, values, byQuery, byKey } = v;
  let on = [];
  let query = null;
  const select = (side, k) => {
    on.forEach((el) => el.classList.remove("on"));
    values.forEach((t) => { t.textContent = ""; });
    svg.classList.toggle("hv-selected", side !== null);
    if (side === null) { on = []; if (readout) readout.textContent = "Hover a token (or focus here and use ↑ ↓) to see only its lines."; return; }
    const lines = side === "query" ? byQuery[k] : byKey[k];
    const ends = lines.map((l) => (side === "query" ? right : left)[Number(l.dataset[side === "query" ? "j" : "i"])]);
    on = [...lines, ...ends, (side === "query" ? left : right)[k]];
    on.forEach((el) => el.classList.add("on"));
    if (side === "query") lines.forEach((l) => { values[Number(l.dataset.j)].textContent = Number(weights[k][Number(l.dataset.j)]).toFixed(2); });
    if (readout) readout.textContent = side === "query" ? tokenLine(weights, tokens, k) : `key ${k} “${tokens[k]}”: looked at by ${lines.length} quer${lines.length === 1 ? "y" : "ies"} with weight ≥ 0.02`;
  };
  for (const [side, labels] of [["query", left], ["key", right]]) {
    labels.forEach((t, k) => {
      t.addEventListener("mouseenter", () => { query = side === "query" ? k : query; select(side, k); });
    });
  }
  svg.addEventListener("mouseleave", () => { query = null; select(null); });
  svg.addEventListener("keydown", (e) => {
    const moves = { ArrowDown: 1, ArrowUp: -1 };
    if (e.key === "Escape") { query = null; select(null); return; }
    if (!(e.key in moves)) return;
    e.preventDefault();
    query = Math.max(0, Math.min(v.n - 1, (query ?? -moves[e.key]) + moves[e.key]));
    select("query", query);
    left[query].scrollIntoView?.({ block: "nearest" });
  });
}

export function colourLegend() {
  const svg = s("svg", { viewBox: "0 0 160 14", width: 160, height: 14, "aria-hidden": "true" });
  for (let k = 0; k < 32; k += 1) svg.append(s("rect", { x: k * 5, y: 0, width: 5, height: 14, fill: viridis(k / 31) }));
  return h("div", { class: "legend" }, "weight 0", svg, "1");
}

function niceTicks(lo, hi, count = 6) {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / count;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((v) => v >= raw) || raw;
  const ticks = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + 1e-12; v += step) ticks.push(+v.toPrecision(12));
  return ticks;
}

// A line chart: series = [{name, points: [[x, y], ...], dashed?, colour?}]; shade = [x0, x1]
// (optional window). Drawn `width` px wide (640 unless given); `draw(width)` draws it again at
// another width (figure() does, to fit the room it is given), keeping which series are shown.
// Legend entries are buttons that hide or show their series; hovering reads out the nearest point.
export const CHART_WIDTH = 640;

export function lineChart(series, opts = {}) {
  const shown = series.map(() => true);
  let current = null;
  const draw = (width = opts.width ?? CHART_WIDTH) => {
    current = drawLines(series, shown, { ...opts, width });
    return current;
  };
  const svg = draw();
  const legend = h("div", { class: "chips", role: "group", "aria-label": "series shown" },
    series.map((sr, k) => h("button", {
      type: "button", class: "chip series", "aria-pressed": "true",
      onclick: (e) => {
        shown[k] = e.currentTarget.getAttribute("aria-pressed") !== "true";
        e.currentTarget.setAttribute("aria-pressed", String(shown[k]));
        current.querySelector(`g[data-index="${k}"]`)?.setAttribute("visibility", shown[k] ? "visible" : "hidden");
      },
    }, h("span", { "aria-hidden": "true", class: "swatch" }, "■ "), sr.name)));
  legend.querySelectorAll(".swatch").forEach((el, k) => { el.style.color = series[k].colour || SERIES[k % SERIES.length]; });
  return { svg, legend, draw };
}

const tickText = (v) => String(v);

// The svg of lineChart at one width: the right margin holds half the last x label, the title
// wraps, and linear x ticks are spaced so that their labels never meet.
function drawLines(series, shown, { title = "", xLabel = "", yLabel = "", shade = null, logX = false, readout = null, width }) {
  const W = width, L = 56;
  const tx = (v) => (logX ? Math.log2(Math.max(v, 1e-12)) : v);
  const all = series.flatMap((sr) => sr.points).filter((p) => Number.isFinite(p[1]));
  const xs = all.map((p) => tx(p[0])), ys = all.map((p) => p[1]);
  const [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  let [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
  const xticks = logX ? [...new Set(all.map((p) => p[0]))].sort((a, b) => a - b) : niceTicks(x0, x1, Math.max(2, Math.min(6, Math.floor((W - L) / 70))));
  const R = Math.max(12, Math.ceil(textWidth(tickText(xticks.at(-1) ?? ""), 11) / 2) + 4);
  const heading = title ? titleLines(title, L, 16, W - L) : { els: [], bottom: 0 };
  const T = title ? heading.bottom + 10 : 10, B = 42, H = T + (W < 480 ? 200 : 232) + B;
  const px = (v) => L + ((tx(v) - x0) / (x1 - x0 || 1)) * (W - L - R);
  const py = (v) => T + (1 - (v - y0) / (y1 - y0)) * (H - T - B);
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, width: W, role: "img", "aria-label": title || "chart", "font-family": FONT });
  svg.append(s("rect", { width: W, height: H, fill: "#ffffff" }), ...heading.els);
  if (shade) svg.append(s("rect", { x: px(shade[0]), y: T, width: Math.max(2, px(shade[1]) - px(shade[0])), height: H - T - B, fill: "#E69F00", "fill-opacity": 0.18 }));
  for (const v of niceTicks(y0, y1, W < 480 ? 4 : 6)) {
    svg.append(s("line", { x1: L, x2: W - R, y1: py(v), y2: py(v), stroke: "#e3e6ec" }));
    svg.append(s("text", { x: L - 6, y: py(v) + 4, "text-anchor": "end", "font-size": 11, fill: "#5a6273", text: tickText(v) }));
  }
  for (const v of xticks) svg.append(s("text", { x: px(v), y: H - B + 16, "text-anchor": "middle", "font-size": 11, fill: "#5a6273", class: "x-tick", text: tickText(v) }));
  svg.append(s("text", { x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle", "font-size": 12, fill: "#1d2330", text: xLabel }));
  svg.append(s("text", { x: 12, y: (T + H - B) / 2, transform: `rotate(-90 12 ${(T + H - B) / 2})`, "text-anchor": "middle", "font-size": 12, fill: "#1d2330", text: yLabel }));
  series.forEach((sr, k) => {
    const pts = sr.points.filter((p) => Number.isFinite(p[1]));
    const g = s("g", { "data-series": sr.name, "data-index": k, visibility: shown[k] ? "visible" : "hidden" });
    const colour = sr.colour || SERIES[k % SERIES.length];
    g.append(s("polyline", { points: pts.map((p) => `${px(p[0]).toFixed(1)},${py(p[1]).toFixed(1)}`).join(" "), fill: "none", stroke: colour, "stroke-width": 2, "stroke-dasharray": sr.dashed ? "5 3" : null }));
    if (pts.length <= 40) pts.forEach((p) => g.append(s("circle", { cx: px(p[0]), cy: py(p[1]), r: 2.5, fill: colour })));
    svg.append(g);
  });
  const guide = s("line", { y1: T, y2: H - B, stroke: "#9aa3b5", visibility: "hidden" });
  svg.append(guide);
  svg.addEventListener("mousemove", (e) => {
    const box = svg.getBoundingClientRect();
    const xv = x0 + ((e.clientX - box.left) * (W / box.width) - L) / (W - L - R) * (x1 - x0);
    const parts = series.map((sr) => {
      const p = sr.points.reduce((best, q) => (Math.abs(tx(q[0]) - xv) < Math.abs(tx(best[0]) - xv) ? q : best), sr.points[0]);
      return [p[0], `${sr.name} ${Number(p[1]).toPrecision(4)}`];
    });
    if (!parts.length) return;
    guide.setAttribute("x1", px(parts[0][0])); guide.setAttribute("x2", px(parts[0][0]));
    guide.setAttribute("visibility", "visible");
    const text = `${xLabel || "x"} ${parts[0][0]}: ${parts.map((p) => p[1]).join(", ")}`;
    showTip(e, text);
    if (readout) readout.textContent = text;
  });
  svg.addEventListener("mouseleave", () => { hideTip(); guide.setAttribute("visibility", "hidden"); });
  return svg;
}
