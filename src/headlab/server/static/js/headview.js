// The head view away from the page (notebook outputs, the offline file): one head's pattern beside
// its layer's mean, the two-column view, and the grid of every head with its label, all drawn from
// one HeadReport dict that headlab.show embeds. Nothing here talks to a server.
import { h, clear } from "./dom.js";
import { heatmap, twoColumn, colourLegend, focusWindow } from "./figures.js";

// The grid of every head, layer by layer. a: {n_layers, n_heads, n_kv_heads, weights, tokens};
// labelOf(l, k) → label; active(l, k) → pressed?; onSelect(l, k); title(l, k) → tooltip;
// focus: [layer, head] whose layer opens first. Each layer is a <details> whose summary counts
// its labels; inside it the query heads are grouped by the key/value head they share (GQA:
// query head k reads K/V head floor(k / (h / h_kv))). Labels come first; a head's pattern is
// drawn as a thumbnail once its layer is opened (SmolLM2's 270 heads at 64 tokens would be a
// million cells drawn at once). Small models (≤ 4 layers) open every layer.
export function headGrid(a, { labelOf, active, onSelect, title = () => null, focus = null }) {
  const kv = a.n_kv_heads || a.n_heads;
  const per = a.n_heads / kv;
  const small = a.n_layers <= 4;
  const layers = [];
  for (let l = 0; l < a.n_layers; l += 1) {
    const counts = {};
    for (let k = 0; k < a.n_heads; k += 1) { const lab = labelOf(l, k) || "?"; counts[lab] = (counts[lab] || 0) + 1; }
    const tally = Object.entries(counts).sort((x, y) => y[1] - x[1]).map(([lab, c]) => `${lab} ${c}`).join(", ");
    const groups = [];
    const buttons = [];
    for (let g = 0; g < kv; g += 1) {
      const mine = [];
      for (let k = g * per; k < (g + 1) * per; k += 1) {
        const label = labelOf(l, k);
        const b = h("button", {
          type: "button", "data-head": `${l}.${k}`, "data-kv": String(g), "aria-pressed": String(active(l, k)),
          "aria-label": `head ${l}.${k}${label ? `, ${label}` : ""}${kv < a.n_heads ? `, shares K/V head ${g}` : ""}`,
          title: title(l, k), onclick: () => onSelect(l, k),
        }, h("span", { class: "head-name" }, `${l}.${k} ${label || ""}`));
        mine.push(b);
        buttons.push([b, k]);
      }
      groups.push(kv < a.n_heads
        ? h("div", { class: "kv-group", role: "group", "aria-label": `layer ${l}: query heads ${g * per}–${(g + 1) * per - 1} share K/V head ${g}` },
          h("span", { class: "kv-tag" }, `K/V head ${g}`), h("div", { class: "kv-heads" }, mine))
        : mine);
    }
    const open = small || (focus ? focus[0] === l : l === 0);
    // a model with a sliding window (Gemma 2/3, Mistral): each layer says local or global
    const kind = a.window != null && a.layer_kinds ? a.layer_kinds[l] : null;
    const kindTag = kind ? h("span", { class: `layer-kind layer-${kind}`, "data-kind": kind },
      kind === "local" ? `local: window ${a.window}` : "global: every key") : null;
    const box = h("details", { class: "grid-layer", "data-layer": String(l), "data-kind": kind, open: open ? "" : null },
      h("summary", {}, `layer ${l}: `, kindTag, kindTag ? " " : null, h("span", { class: "note" }, tally)),
      h("div", { class: kv < a.n_heads ? "grid-kv" : "grid-heads" }, groups.flat()));
    // patterns on demand: a layer's thumbnails are drawn the first time it is open
    let drawn = false;
    const draw = () => {
      if (drawn || !box.open) return;
      drawn = true;
      for (const [b, k] of buttons) b.prepend(heatmap(a.weights[l][k], a.tokens, { small: true }));
    };
    box.addEventListener("toggle", draw);
    draw();
    layers.push(box);
  }
  const all = (open) => () => layers.forEach((d) => { d.open = open; });
  const locals = a.window != null && a.layer_kinds ? a.layer_kinds.filter((k) => k === "local").length : 0;
  const windowed = locals ? `; ${locals} local layers (a ${a.window}-key window), ${a.n_layers - locals} global` : "";
  const tools = small ? null : h("p", { class: "grid-tools" },
    `${a.n_layers} layers × ${a.n_heads} heads${kv < a.n_heads ? `, ${per} query heads per K/V head` : ""}${windowed}: open a layer to draw its patterns. `,
    h("button", { type: "button", class: "chip", onclick: all(true) }, "open every layer"), " ",
    h("button", { type: "button", class: "chip", onclick: all(false) }, "close every layer"));
  return [tools, ...layers];
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
    gridBox.querySelectorAll("button[data-head]").forEach((b) => b.setAttribute("aria-pressed", String(b.dataset.head === `${layer}.${head}`)));
    const open = gridBox.querySelector(`details[data-layer="${layer}"]`);
    if (open) open.open = true;
    if (!detail) return;
    const w = data.weights[layer][head];
    focusWindow(w, data.tokens, row.label === "induction" ? "induction" : "");  // where it acts
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
    gridBox.append(...headGrid(data, { labelOf: (l, k) => row(l, k).label || "", active: () => false,
      onSelect: select, title: (l, k) => scoreLine(row(l, k)), focus: [state.layer, state.head] }).filter(Boolean));
  }
  draw();
  return { select, state };
}
