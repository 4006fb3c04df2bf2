// Every figure exports as SVG and PNG, and its data as JSON, without leaving the page.
import { h } from "./dom.js";

function download(blob, filename) {
  const url = URL.createObjectURL(blob);
  const a = h("a", { href: url, download: filename });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 2000);
}

function svgText(svg) {
  const copy = svg.cloneNode(true);
  copy.setAttribute("xmlns", "http://www.w3.org/2000/svg");
  const box = svg.viewBox.baseVal;
  if (box && box.width) {
    copy.setAttribute("width", box.width);
    copy.setAttribute("height", box.height);
  }
  return new XMLSerializer().serializeToString(copy);
}

export function exportSVG(svg, name) {
  download(new Blob([svgText(svg)], { type: "image/svg+xml" }), `${name}.svg`);
}

export function exportPNG(svg, name, scale = 2) {
  const box = svg.viewBox.baseVal;
  const image = new Image();
  const url = URL.createObjectURL(new Blob([svgText(svg)], { type: "image/svg+xml" }));
  image.onload = () => {
    const canvas = h("canvas", { width: box.width * scale, height: box.height * scale });
    const ctx = canvas.getContext("2d");
    ctx.fillStyle = "#ffffff";
    ctx.fillRect(0, 0, canvas.width, canvas.height);
    ctx.drawImage(image, 0, 0, canvas.width, canvas.height);
    URL.revokeObjectURL(url);
    canvas.toBlob((blob) => download(blob, `${name}.png`), "image/png");
  };
  image.src = url;
}

export function exportJSON(data, name) {
  download(new Blob([JSON.stringify(data, null, 1)], { type: "application/json" }), `${name}.json`);
}

// A <figure> with its caption and the three export buttons; `scroll` puts a tall svg in a box
// that scrolls up and down (keyboard-focusable, as the svg itself is) rather than shrinking it.
// `fit` = {max, draw(width) → svg} draws the figure to the width its box has (at most `max`
// px) and again whenever that width changes (a phone turned sideways): a chart shows all its
// data at any width, never a crop in a box that scrolls sideways. Then `svg` may be null.
export function figure(svg, { name, caption, data, extra, scroll = false, fit = null }) {
  let drawn = svg ?? fit.draw(fit.max);
  const label = (kind) => `Export ${caption ? `“${caption}”` : "figure"} as ${kind}`;
  const tools = h("div", { class: "figure-tools" },
    h("button", { type: "button", "aria-label": label("SVG"), "data-export": "svg", onclick: () => exportSVG(drawn, name) }, "SVG"),
    h("button", { type: "button", "aria-label": label("PNG"), "data-export": "png", onclick: () => exportPNG(drawn, name) }, "PNG"),
    h("button", { type: "button", "aria-label": label("JSON data"), "data-export": "json", onclick: () => exportJSON(data, name) }, "JSON"),
  );
  const body = scroll ? h("div", { class: "hv-scroll" }, drawn) : drawn;
  const box = h("figure", { "data-figure": name }, body, caption ? h("figcaption", {}, caption) : null, extra || null, tools);
  if (fit) {
    let width = svg ? null : fit.max;
    onWidth(scroll ? body : box, (room) => {
      const next = Math.min(fit.max, Math.floor(room));
      if (next === width) return;
      width = next;
      const again = fit.draw(width);
      drawn.replaceWith(again);
      drawn = again;
    });
  }
  return box;
}

// Call back with the content width of `el` each time it changes (never while it is not laid
// out, e.g. inside a closed <details>).
export function onWidth(el, callback) {
  if (typeof ResizeObserver === "undefined") return;
  new ResizeObserver((entries) => {
    const width = entries.at(-1).contentRect.width;
    if (width > 0) callback(width);
  }).observe(el);
}
