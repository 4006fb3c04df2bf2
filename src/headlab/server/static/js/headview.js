// The head view away from the page (notebook outputs, the offline file): one head's pattern beside
// its layer's mean, the two-column view, and the grid of every head with its label, all drawn from
// one HeadReport dict that headlab.show embeds. Nothing here talks to a server.
import { h, clear } from "./dom.js";
import { heatmap, twoColumn, colourLegend } from "./figures.js";

// One button per head (layer-major): its pattern as a thumbnail and its label; the page's head
// widget and the standalone view both draw their grid with it. a: {n_layers, n_heads, weights,
// tokens}; labelOf(l, k) → label; active(l, k) → pressed?; onSelect(l, k); title(l, k) → tooltip.
export function headButtons(a, { labelOf, active, onSelect, title = () => null }) {
  const buttons = [];
  for (let l = 0; l < a.n_layers; l += 1) {
    for (let k = 0; k < a.n_heads; k += 1) {
      const label = labelOf(l, k);
      buttons.push(h("button", {
        type: "button", "data-head": `${l}.${k}`, "aria-pressed": String(active(l, k)),
        "aria-label": `head ${l}.${k}${label ? `, ${label}` : ""}`, title: title(l, k),
        onclick: () => onSelect(l, k),
      }, heatmap(a.weights[l][k], a.tokens, { small: true }), `${l}.${k} ${label || ""}`));
    }
  }
  return buttons;
}

const scoreLine = (row) => Object.entries(row.scores || {}).map(([k, v]) => `${k.replace(/_/g, " ")} ${Number(v).toFixed(2)}`).join(" · ");

// data: {model, probe, tokens, n_layers, n_heads, heads: [{layer, head, label, scores}], weights
// (L, h, n, n), averaged_weights (L, n, n)}. grid: show every head; detail: show the chosen one.
export function mountHeadView(root, data, { grid = true, detail = true, uid = "hv" } = {}) {
  const rows = new Map(data.heads.map((r) => [`${r.layer}.${r.head}`, r]));
  const state = { layer: 0, head: 0 };
  // open on the best induction head if one passes its threshold, else the best previous-token head
  const best = data.best?.induction?.passes_threshold ? data.best.induction : data.best?.["previous-token"];
  if (best) Object.assign(state, { layer: best.layer, head: best.head });
  const choose = h("select", { id: `${uid}-head` }, data.heads.map((r) => h("option", { value: `${r.layer}.${r.head}` }, `${r.layer}.${r.head} ${r.label}`)));
  const readout = h("p", { class: "hv-readout", id: `${uid}-readout`, "aria-live": "polite" }, "Hover a cell or a token, or focus a figure and use the arrow keys, to read the exact weight.");
  const about = h("p", { class: "hv-about", id: `${uid}-about` });
  const view = h("div", { class: "hv-detail" });
  const gridBox = h("div", { class: "hv-grid", role: "group", "aria-label": "every head, with its label" });
  root.append(
    h("p", { class: "hv-title" }, `${data.model ? `${data.model}: ` : ""}${data.tokens.length} tokens (${data.probe} probe), ${data.n_layers} layers × ${data.n_heads} heads`),
    detail ? h("p", { class: "hv-controls" }, h("label", { for: `${uid}-head` }, "head (layer.head and its label) "), choose) : null,
    about, readout, detail ? view : null, grid ? gridBox : null);
  const draw = () => {
    const { layer, head } = state;
    const row = rows.get(`${layer}.${head}`) || {};
    choose.value = `${layer}.${head}`;
    about.textContent = `head ${layer}.${head}: ${row.label || "?"}${row.scores ? ` — ${scoreLine(row)}` : ""}`;
    gridBox.querySelectorAll("button").forEach((b) => b.setAttribute("aria-pressed", String(b.dataset.head === `${layer}.${head}`)));
    if (!detail) return;
    const w = data.weights[layer][head];
    const title = `head ${layer}.${head} — ${row.label || ""}`;
    clear(view, colourLegend(),
      h("div", { class: "hv-pair" },
        heatmap(w, data.tokens, { title, readout }),
        heatmap(data.averaged_weights[layer], data.tokens, { title: `layer ${layer}: mean of its ${data.n_heads} heads`, readout })),
      h("div", { class: "hv-scroll" }, twoColumn(w, data.tokens, { title: `${title}: query → key lines (weights ≥ 0.02)`, readout })));
  };
  const select = (layer, head) => { Object.assign(state, { layer, head }); draw(); };
  choose.addEventListener("change", () => select(...choose.value.split(".").map(Number)));
  if (grid) {
    const row = (l, k) => rows.get(`${l}.${k}`) || {};
    gridBox.append(...headButtons(data, { labelOf: (l, k) => row(l, k).label || "", active: () => false,
      onSelect: select, title: (l, k) => scoreLine(row(l, k)) }));
  }
  draw();
  return { select, state };
}
