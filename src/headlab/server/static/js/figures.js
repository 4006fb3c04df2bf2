// SVG figures drawn from API data: attention heatmaps, arcs, line and bar charts.
import { viridis, SERIES } from "./colour.js";
import { h, s, showTip, hideTip } from "./dom.js";

const FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, 'DejaVu Sans', sans-serif";
const short = (t, k = 10) => (t.length > k ? `${t.slice(0, k - 1)}…` : t);

// A heatmap of one head's weights: rows are queries i, columns keys j. `readout` (optional) is an
// element that receives the exact weight under the pointer or the keyboard cursor.
export function heatmap(weights, tokens, { title = "", small = false, readout = null } = {}) {
  const n = weights.length;
  const cell = small ? Math.max(2, Math.floor(96 / n)) : Math.max(6, Math.min(22, Math.floor(440 / n)));
  const pad = small ? 0 : 78;
  const top = small ? 0 : 78 + (title ? 18 : 0);
  const size = n * cell;
  const svg = s("svg", {
    viewBox: `0 0 ${pad + size + 4} ${top + size + 4}`, role: "img",
    "aria-label": title || "attention pattern", "font-family": FONT, class: "heatmap", "shape-rendering": "crispEdges",
    width: small ? null : pad + size + 4,
  });
  svg.append(s("rect", { width: pad + size + 4, height: top + size + 4, fill: "#ffffff" }));
  if (title && !small) svg.append(s("text", { x: 0, y: 13, "font-size": 13, "font-weight": 600, fill: "#1d2330", text: title }));
  const fontSize = Math.min(11, Math.max(6, cell - 2));
  for (let i = 0; i < n; i += 1) {
    const row = weights[i];
    for (let j = 0; j < n; j += 1) {
      svg.append(s("rect", { x: pad + j * cell, y: top + i * cell, width: cell, height: cell, fill: viridis(row[j]), "data-i": i, "data-j": j }));
    }
    if (!small) {
      svg.append(s("text", { x: pad - 4, y: top + i * cell + cell / 2 + fontSize / 3, "text-anchor": "end", "font-size": fontSize, fill: "#1d2330", text: short(tokens[i]) }));
      const x = pad + i * cell + cell / 2 + fontSize / 3;
      svg.append(s("text", { x, y: top - 4, transform: `rotate(-90 ${x} ${top - 4})`, "font-size": fontSize, fill: "#1d2330", text: short(tokens[i]) }));
    }
  }
  if (!small) attachCursor(svg, weights, tokens, { pad, top, cell, readout });
  return svg;
}

function describe(weights, tokens, i, j) {
  return `query ${i} “${tokens[i]}” → key ${j} “${tokens[j]}”: ${Number(weights[i][j]).toFixed(4)}`;
}

function attachCursor(svg, weights, tokens, { pad, top, cell, readout }) {
  const n = weights.length;
  const marker = s("rect", { width: cell, height: cell, fill: "none", stroke: "#ff8c00", "stroke-width": 2, visibility: "hidden" });
  svg.append(marker);
  let cursor = [n - 1, 0];
  const show = (i, j, event) => {
    cursor = [i, j];
    marker.setAttribute("x", pad + j * cell);
    marker.setAttribute("y", top + i * cell);
    marker.setAttribute("visibility", "visible");
    const text = describe(weights, tokens, i, j);
    if (readout) readout.textContent = text;
    if (event) showTip(event, text);
  };
  svg.addEventListener("mousemove", (e) => {
    const t = e.target;
    if (t.dataset && t.dataset.i !== undefined) show(Number(t.dataset.i), Number(t.dataset.j), e);
  });
  svg.addEventListener("mouseleave", hideTip);
  svg.setAttribute("tabindex", "0");
  svg.addEventListener("focus", () => show(...cursor));
  svg.addEventListener("blur", () => marker.setAttribute("visibility", "hidden"));
  svg.addEventListener("keydown", (e) => {
    const moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
    if (!moves[e.key]) return;
    e.preventDefault();
    const [di, dj] = moves[e.key];
    show(Math.min(n - 1, Math.max(0, cursor[0] + di)), Math.min(n - 1, Math.max(0, cursor[1] + dj)));
  });
}

// Arcs from each query down to the keys it attends to; width and opacity follow the weight.
export function arcs(weights, tokens, { title = "", minWeight = 0.05, readout = null } = {}) {
  const n = weights.length;
  const step = Math.max(14, Math.min(40, Math.floor(620 / n)));
  const width = n * step + 60;  // room for the last rotated label
  let reach = 1;
  for (let i = 0; i < n; i += 1) for (let j = 0; j < n; j += 1) if (weights[i][j] >= minWeight && i !== j) reach = Math.max(reach, Math.abs(i - j));
  const base = 16 + Math.min((reach * step) / 2, 200);
  const svg = s("svg", { viewBox: `0 0 ${width} ${base + 70}`, width, role: "img", "aria-label": title || "attention arcs", "font-family": FONT });
  svg.append(s("rect", { width, height: base + 70, fill: "#ffffff" }));
  const x = (k) => 10 + k * step + step / 2;
  for (let i = 0; i < n; i += 1) {
    for (let j = 0; j < n; j += 1) {
      const w = weights[i][j];
      if (w < minWeight || i === j) continue;
      const [a, b] = [x(Math.min(i, j)), x(Math.max(i, j))];
      const r = (b - a) / 2;
      const path = s("path", {
        d: `M ${x(i)} ${base} A ${r} ${Math.min(r, base - 10)} 0 0 ${i > j ? 0 : 1} ${x(j)} ${base}`,
        fill: "none", stroke: viridis(0.15 + 0.7 * w), "stroke-width": (0.5 + 4 * w).toFixed(2), "stroke-opacity": (0.25 + 0.75 * w).toFixed(2),
      });
      const text = describe(weights, tokens, i, j);
      path.addEventListener("mousemove", (e) => { showTip(e, text); if (readout) readout.textContent = text; });
      path.addEventListener("mouseleave", hideTip);
      svg.append(path);
    }
  }
  const fontSize = Math.min(12, step - 3);
  tokens.forEach((t, k) => {
    svg.append(s("circle", { cx: x(k), cy: base, r: 2.5, fill: "#1d2330" }));
    svg.append(s("text", { x: x(k), y: base + 12, transform: `rotate(50 ${x(k)} ${base + 12})`, "font-size": fontSize, fill: "#1d2330", text: short(t) }));
  });
  return svg;
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
// (optional window).
// Legend entries are buttons that hide or show their series; hovering reads out the nearest point.
export function lineChart(series, { title = "", xLabel = "", yLabel = "", shade = null, logX = false, readout = null } = {}) {
  const W = 640, H = 300, L = 56, R = 12, T = title ? 26 : 10, B = 42;
  const tx = (v) => (logX ? Math.log2(Math.max(v, 1e-12)) : v);
  const all = series.flatMap((sr) => sr.points).filter((p) => Number.isFinite(p[1]));
  const xs = all.map((p) => tx(p[0])), ys = all.map((p) => p[1]);
  const [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  let [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
  const px = (v) => L + ((tx(v) - x0) / (x1 - x0 || 1)) * (W - L - R);
  const py = (v) => T + (1 - (v - y0) / (y1 - y0)) * (H - T - B);
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, width: W, role: "img", "aria-label": title || "chart", "font-family": FONT });
  svg.append(s("rect", { width: W, height: H, fill: "#ffffff" }));
  if (title) svg.append(s("text", { x: L, y: 16, "font-size": 13, "font-weight": 600, fill: "#1d2330", text: title }));
  if (shade) svg.append(s("rect", { x: px(shade[0]), y: T, width: Math.max(2, px(shade[1]) - px(shade[0])), height: H - T - B, fill: "#E69F00", "fill-opacity": 0.18 }));
  for (const v of niceTicks(y0, y1)) {
    svg.append(s("line", { x1: L, x2: W - R, y1: py(v), y2: py(v), stroke: "#e3e6ec" }));
    svg.append(s("text", { x: L - 6, y: py(v) + 4, "text-anchor": "end", "font-size": 11, fill: "#5a6273", text: String(v) }));
  }
  const xticks = logX ? [...new Set(all.map((p) => p[0]))].sort((a, b) => a - b) : niceTicks(x0, x1);
  for (const v of xticks) svg.append(s("text", { x: px(v), y: H - B + 16, "text-anchor": "middle", "font-size": 11, fill: "#5a6273", text: String(v) }));
  svg.append(s("text", { x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle", "font-size": 12, fill: "#1d2330", text: xLabel }));
  svg.append(s("text", { x: 12, y: (T + H - B) / 2, transform: `rotate(-90 12 ${(T + H - B) / 2})`, "text-anchor": "middle", "font-size": 12, fill: "#1d2330", text: yLabel }));
  const groups = series.map((sr, k) => {
    const pts = sr.points.filter((p) => Number.isFinite(p[1]));
    const g = s("g", { "data-series": sr.name });
    const colour = sr.colour || SERIES[k % SERIES.length];
    g.append(s("polyline", { points: pts.map((p) => `${px(p[0]).toFixed(1)},${py(p[1]).toFixed(1)}`).join(" "), fill: "none", stroke: colour, "stroke-width": 2, "stroke-dasharray": sr.dashed ? "5 3" : null }));
    if (pts.length <= 40) pts.forEach((p) => g.append(s("circle", { cx: px(p[0]), cy: py(p[1]), r: 2.5, fill: colour })));
    svg.append(g);
    return g;
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
  const legend = h("div", { class: "chips", role: "group", "aria-label": "series shown" },
    series.map((sr, k) => h("button", {
      type: "button", class: "chip series", "aria-pressed": "true",
      onclick: (e) => {
        const on = e.currentTarget.getAttribute("aria-pressed") !== "true";
        e.currentTarget.setAttribute("aria-pressed", String(on));
        groups[k].setAttribute("visibility", on ? "visible" : "hidden");
      },
    }, h("span", { "aria-hidden": "true", class: "swatch" }, "■ "), sr.name)));
  legend.querySelectorAll(".swatch").forEach((el, k) => { el.style.color = series[k].colour || SERIES[k % SERIES.length]; });
  return { svg, legend };
}

// Horizontal bars: items = [{label, value, note}].
export function barChart(items, { title = "", format = (v) => String(v), colour = "#0072B2" } = {}) {
  const W = 640, L = 150, R = 90, rowH = 22, T = title ? 26 : 6;
  const H = T + items.length * rowH + 8;
  const max = Math.max(...items.map((it) => Math.abs(it.value)), 1e-12);
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, width: W, role: "img", "aria-label": title || "bar chart", "font-family": FONT });
  svg.append(s("rect", { width: W, height: H, fill: "#ffffff" }));
  if (title) svg.append(s("text", { x: 0, y: 16, "font-size": 13, "font-weight": 600, fill: "#1d2330", text: title }));
  items.forEach((it, k) => {
    const y = T + k * rowH;
    const w = Math.max(1, (Math.abs(it.value) / max) * (W - L - R));
    svg.append(s("text", { x: L - 6, y: y + 15, "text-anchor": "end", "font-size": 11, fill: "#1d2330", text: it.label }));
    svg.append(s("rect", { x: L, y: y + 3, width: w, height: rowH - 7, fill: it.colour || colour }));
    svg.append(s("text", { x: L + w + 4, y: y + 15, "font-size": 11, fill: "#1d2330", text: format(it.value) }));
  });
  return svg;
}

// A rows × columns matrix of weights (e.g. each head's attention from one query to every token).
export function matrix(rows, colLabels, rowLabels, { title = "", readout = null } = {}) {
  const nr = rows.length, nc = colLabels.length;
  const cell = Math.max(8, Math.min(24, Math.floor(520 / nc)));
  const L = 70, T = 70 + (title ? 18 : 0);
  const svg = s("svg", { viewBox: `0 0 ${L + nc * cell + 4} ${T + nr * cell + 4}`, width: L + nc * cell + 4, role: "img", "aria-label": title || "weights", "font-family": FONT, "shape-rendering": "crispEdges" });
  svg.append(s("rect", { width: L + nc * cell + 4, height: T + nr * cell + 4, fill: "#ffffff" }));
  if (title) svg.append(s("text", { x: 0, y: 13, "font-size": 13, "font-weight": 600, fill: "#1d2330", text: title }));
  const fontSize = Math.min(11, cell - 2);
  rows.forEach((row, i) => {
    svg.append(s("text", { x: L - 4, y: T + i * cell + cell / 2 + 4, "text-anchor": "end", "font-size": 11, fill: "#1d2330", text: rowLabels[i] }));
    row.forEach((w, j) => {
      const rect = s("rect", { x: L + j * cell, y: T + i * cell, width: cell, height: cell, fill: viridis(w) });
      const text = `${rowLabels[i]} → “${colLabels[j]}”: ${Number(w).toFixed(4)}`;
      rect.addEventListener("mousemove", (e) => { showTip(e, text); if (readout) readout.textContent = text; });
      rect.addEventListener("mouseleave", hideTip);
      svg.append(rect);
    });
  });
  colLabels.forEach((t, j) => {
    const x = L + j * cell + cell / 2 + fontSize / 3;
    svg.append(s("text", { x, y: T - 4, transform: `rotate(-90 ${x} ${T - 4})`, "font-size": fontSize, fill: "#1d2330", text: short(t) }));
  });
  return svg;
}
