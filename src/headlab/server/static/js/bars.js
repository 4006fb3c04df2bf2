// Bar charts and weight matrices from API data, each drawn to the width it may take.
import { viridis } from "./colour.js";
import { s, showTip, hideTip } from "./dom.js";
import { FONT, fitText, textWidth, titleLines } from "./svg-text.js";

export const BAR_WIDTH = 640;  // the widest a bar chart is drawn
const short = (t, k = 10) => (t.length > k ? `${t.slice(0, k - 1)}…` : t);

// Horizontal bars: items = [{label, value, colour?}]. The label column is as wide as its
// longest label (at most 150 px, less on a narrow screen), the value column as its longest value.
export function barChart(items, { title = "", format = (v) => String(v), colour = "#0072B2", width = BAR_WIDTH } = {}) {
  const W = Math.min(width, BAR_WIDTH), rowH = 22;
  const values = items.map((it) => format(it.value));
  const R = Math.ceil(Math.max(0, ...values.map((v) => textWidth(v, 11)))) + 10;
  const L = Math.ceil(Math.min(150, W * 0.42, Math.max(0, ...items.map((it) => textWidth(it.label, 11))) + 10));
  const heading = title ? titleLines(title, 0, 16, W) : { els: [], bottom: -4 };
  const T = heading.bottom + 10, H = T + items.length * rowH + 8;
  const max = Math.max(...items.map((it) => Math.abs(it.value)), 1e-12);
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, width: W, role: "img", "aria-label": title || "bar chart", "font-family": FONT });
  svg.append(s("rect", { width: W, height: H, fill: "#ffffff" }), ...heading.els);
  items.forEach((it, k) => {
    const y = T + k * rowH;
    const w = Math.max(1, (Math.abs(it.value) / max) * (W - L - R));
    svg.append(s("text", { x: L - 6, y: y + 15, "text-anchor": "end", "font-size": 11, fill: "#1d2330", text: fitText(it.label, L - 8, 11) }));
    svg.append(s("rect", { x: L, y: y + 3, width: w, height: rowH - 7, fill: it.colour || colour }));
    svg.append(s("text", { x: L + w + 4, y: y + 15, "font-size": 11, fill: "#1d2330", text: values[k] }));
  });
  return svg;
}

// A rows × columns matrix of weights (e.g. each head's attention from one query to every token),
// its cells as large as `width` allows (8 to 24 px).
export function matrix(rows, colLabels, rowLabels, { title = "", readout = null, width = null } = {}) {
  const nr = rows.length, nc = colLabels.length;
  const L = 70;
  const cell = Math.max(8, Math.min(24, Math.floor(((width ?? 594) - L - 4) / nc)));
  const W = L + nc * cell + 4;
  const heading = title ? titleLines(title, 0, 13, W) : { els: [], bottom: -5 };
  const T = 70 + heading.bottom + 5, H = T + nr * cell + 4;
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, width: W, role: "img", "aria-label": title || "weights", "font-family": FONT, "shape-rendering": "crispEdges" });
  svg.append(s("rect", { width: W, height: H, fill: "#ffffff" }), ...heading.els);
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
