// Text in SVG figures, measured before it is drawn: a figure drawn to the width it is given
// wraps a long title and shortens a long label so that nothing runs past its edge. Widths are
// measured in the figures' own font by a canvas (no layout needed, the svg need not be attached).
import { s } from "./dom.js";

export const FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, 'DejaVu Sans', sans-serif";
export const MONO = "ui-monospace, 'DejaVu Sans Mono', Menlo, Consolas, monospace";

let context = null;

// The width in px of `text` drawn at `size` px, `weight`, in `family`.
export function textWidth(text, size, weight = 400, family = FONT) {
  context ??= document.createElement("canvas").getContext("2d");
  context.font = `${weight} ${size}px ${family}`;
  return context.measureText(String(text)).width;
}

// `text` cut to at most `width` px, its end replaced by "…" where it was cut.
export function fitText(text, width, size, weight = 400, family = FONT) {
  const str = String(text);
  if (textWidth(str, size, weight, family) <= width) return str;
  let keep = str.length - 1;
  while (keep > 1 && textWidth(`${str.slice(0, keep)}…`, size, weight, family) > width) keep -= 1;
  return `${str.slice(0, keep)}…`;
}

// `text` broken at spaces into lines of at most `width` px (a word longer than a line is cut).
export function wrapText(text, width, size, weight = 400, family = FONT) {
  const lines = [];
  let line = "";
  for (const word of String(text).split(" ")) {
    const next = line ? `${line} ${word}` : word;
    if (!line || textWidth(next, size, weight, family) <= width) line = next;
    else { lines.push(line); line = word; }
  }
  lines.push(line);
  return lines.map((l) => fitText(l, width, size, weight, family));
}

// A title wrapped to `width` as one <text> per line, its first baseline at y; returns the
// elements and the y below the last line.
export function titleLines(text, x, y, width, { size = 13, weight = 600, fill = "#1d2330", cls = null } = {}) {
  const lines = wrapText(text, width, size, weight);
  const step = Math.round(size * 1.3);
  const els = lines.map((line, k) => s("text", { x, y: y + k * step, "font-size": size, "font-weight": weight, fill, class: cls, text: line }));
  return { els, bottom: y + (lines.length - 1) * step };
}
