// Small helpers to build HTML and SVG elements without innerHTML, and to format numbers.

const SVG_NS = "http://www.w3.org/2000/svg";

function fill(el, attrs, children) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "text") el.textContent = value;
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export const h = (tag, attrs, ...children) => fill(document.createElement(tag), attrs, children);
export const s = (tag, attrs, ...children) => fill(document.createElementNS(SVG_NS, tag), attrs, children);

export function clear(el, ...children) {
  el.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined));
  return el;
}

export function fmtInt(x) {
  return Number(x).toLocaleString("en-US");
}

export function fmtCompact(x) {
  const v = Number(x);
  const units = [[1e15, "P"], [1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
  for (const [scale, unit] of units) if (Math.abs(v) >= scale) return `${(v / scale).toPrecision(3)} ${unit}`;
  return String(v);
}

export function fmtBytes(b) {
  const v = Number(b);
  const units = [[2 ** 50, "PiB"], [2 ** 40, "TiB"], [2 ** 30, "GiB"], [2 ** 20, "MiB"], [2 ** 10, "KiB"]];
  for (const [scale, unit] of units) if (v >= scale) return `${(v / scale).toPrecision(3)} ${unit}`;
  return `${v} B`;
}

export function debounce(fn, ms) {
  let timer;
  return (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
}

// One shared tooltip for every figure: hover or focus shows the exact value.
export function showTip(event, text) {
  const tip = document.getElementById("tooltip");
  if (!tip) return;
  tip.textContent = text;
  tip.hidden = false;
  const rect = event.target.getBoundingClientRect?.();
  const x = event.clientX ?? (rect ? rect.right : 0);
  const y = event.clientY ?? (rect ? rect.top : 0);
  tip.style.left = `${Math.min(x + 12, window.innerWidth - tip.offsetWidth - 4)}px`;
  tip.style.top = `${Math.max(y - 28, 4)}px`;
}

export function hideTip() {
  const tip = document.getElementById("tooltip");
  if (tip) tip.hidden = true;
}

export function missing(text) {
  return h("p", { class: "missing" }, text);
}
