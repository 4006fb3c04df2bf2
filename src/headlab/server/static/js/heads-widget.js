// Widget 2: what heads learn. One POST /api/heads per run answers every head's pattern, scores
// and label (headlab.heads.analyse on the chosen model); every view is drawn from that answer.
import { api } from "./api.js";
import { h, clear, debounce, missing } from "./dom.js";
import { heatmap, twoColumn, colourLegend } from "./figures.js";
import { figure } from "./export.js";

export const HEAD_TYPES = [
  ["previous-token", "previous-token head"],
  ["positional", "positional head"],
  ["induction", "induction head"],
  ["content", "content head"],
  ["averaged", "one averaged head (mean of a layer)"],
];

function field(id, label, control) {
  return h("label", { for: id }, label, control);
}

export function initHeads(root, summaryEl) {
  const model = h("select", { id: "heads-model", name: "model" });
  const kind = h("select", { id: "heads-type", name: "type" }, HEAD_TYPES.map(([v, t]) => h("option", { value: v }, t)));
  const which = h("select", { id: "heads-which", name: "head" });
  const input = h("select", { id: "heads-probe", name: "probe" },
    h("option", { value: "text" }, "the text below"),
    h("option", { value: "random-repeat" }, "random tokens, repeated 4 times"));
  const text = h("textarea", { id: "heads-text", name: "text", rows: 3, spellcheck: "false" });
  const run = h("button", { type: "submit", id: "heads-run" }, "Run the model");
  const form = h("form", { id: "heads-form", "aria-label": "head viewer" },
    h("div", { class: "controls" }, field("heads-model", "model", model), field("heads-type", "head type", kind), field("heads-which", "or any head (layer.head)", which), field("heads-probe", "run the model on", input)),
    field("heads-text", "text (a repeated phrase shows induction)", text), h("p", {}, run, " ", h("span", { class: "note" }, "Ctrl+Enter runs it too")));
  const status = h("p", { class: "note", id: "heads-status", role: "status", "aria-live": "polite" });
  const view = h("div", { id: "heads-view" });
  const grid = h("div", { id: "heads-grid" });
  root.append(h("div", { class: "widget-box" }, form, status, view, grid));

  const state = { attention: null, heads: null, layer: 0, head: 0, averaged: false };

  const draw = () => {
    const a = state.attention;
    if (!a) return;
    const { layer, head } = state;
    const label = labelOf(state, layer, head);
    const readout = h("p", { class: "note", id: "heads-readout", "aria-live": "polite" }, "Hover a cell, or focus the heatmap and use the arrow keys, to read the exact weight.");
    const chosenW = state.averaged ? a.averaged_weights[layer] : a.weights[layer][head];
    const chosenTitle = state.averaged ? `layer ${layer}, all ${a.n_heads} heads averaged` : `head ${layer}.${head}${label ? ` — ${label}` : ""}`;
    const left = figure(heatmap(chosenW, a.tokens, { title: chosenTitle, readout }), { name: `head-${layer}-${state.averaged ? "avg" : head}`, caption: chosenTitle, data: { model: a.model, tokens: a.tokens, layer, head: state.averaged ? null : head, weights: chosenW } });
    const avgTitle = `layer ${layer}: mean of its ${a.n_heads} heads`;
    const right = figure(heatmap(a.averaged_weights[layer], a.tokens, { title: avgTitle, readout }), { name: `head-${layer}-avg`, caption: avgTitle, data: { model: a.model, tokens: a.tokens, layer, weights: a.averaged_weights[layer] } });
    const arcTitle = `${chosenTitle}: query → key lines (weights ≥ 0.02)`;
    const arc = figure(twoColumn(chosenW, a.tokens, { title: arcTitle, readout }), { name: `lines-${layer}-${state.averaged ? "avg" : head}`, caption: arcTitle, data: { tokens: a.tokens, weights: chosenW }, scroll: true });
    clear(view, colourLegend(), readout, h("div", { class: "pair" }, left, right), arc);
    drawGrid();
  };

  const drawGrid = () => {
    const a = state.attention;
    const buttons = [];
    for (let l = 0; l < a.n_layers; l += 1) {
      for (let k = 0; k < a.n_heads; k += 1) {
        const label = labelOf(state, l, k);
        const active = !state.averaged && l === state.layer && k === state.head;
        buttons.push(h("button", {
          type: "button", "data-head": `${l}.${k}`, "aria-pressed": String(active),
          "aria-label": `head ${l}.${k}${label ? `, ${label}` : ""}`,
          onclick: () => select(l, k, false),
        }, heatmap(a.weights[l][k], a.tokens, { small: true }), `${l}.${k} ${label || ""}`));
      }
    }
    clear(grid, h("h3", {}, "All heads, with their labels"), h("div", { class: "grid-heads" }, buttons));
  };

  const select = (layer, head, averaged) => {
    Object.assign(state, { layer, head, averaged });
    which.value = `${layer}.${head}`;
    draw();
  };

  kind.addEventListener("change", () => pickType(state, kind.value, select, status));
  which.addEventListener("change", () => { const [l, k] = which.value.split(".").map(Number); kind.value = kind.value === "averaged" ? "previous-token" : kind.value; select(l, k, false); });
  let runs = 0;
  const submit = async () => {
    const mine = ++runs;  // a newer run (another model, new text) wins over a slower older one
    status.textContent = "Running the model…";
    try {
      // an empty box runs the built-in sentence with a repeat, which the answer then shows
      const random = input.value === "random-repeat";  // Olsson et al.'s probe: induction heads score highest
      const name = model.value || "default";
      const body = random ? { model: name, probe: "random-repeat" }
        : text.value.trim() ? { model: name, probe: "text", text: text.value } : { model: name, probe: "repeat" };
      const heads = await api("/api/heads", body);
      if (mine !== runs) return;
      const attention = heads;
      state.attention = attention;
      if (!random && !text.value.trim()) text.value = attention.text;
      state.heads = heads;
      clear(which, attention.weights.flatMap((heads_, l) => heads_.map((_, k) => h("option", { value: `${l}.${k}` }, `${l}.${k}${labelOf(state, l, k) ? ` ${labelOf(state, l, k)}` : ""}`))));
      status.textContent = `${attention.model}: ${attention.tokens.length} tokens, ${attention.n_layers} layers × ${attention.n_heads} heads.`;
      pickType(state, kind.value, select, status);
      summarise(summaryEl, state);
    } catch (err) {
      if (mine !== runs) return;
      status.textContent = err.message;
      status.classList.add("error");
      return;
    }
    status.classList.remove("error");
  };
  form.addEventListener("submit", (e) => { e.preventDefault(); submit(); });
  text.addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); submit(); } });
  model.addEventListener("change", submit);
  input.addEventListener("change", () => { text.disabled = input.value === "random-repeat"; text.parentElement.hidden = text.disabled; submit(); });
  loadModels(model, status).then((ok) => {
    if (!ok) { clear(view, missing("No model is available to this server, so there are no patterns to show.")); return; }
    submit();
  });
  return { submit, state };
}

function labelOf(state, layer, head) {
  const row = state.heads?.heads.find((r) => r.layer === layer && r.head === head);
  return row ? row.label : "";
}

function pickType(state, type, select, status) {
  if (!state.attention) return;
  if (type === "averaged") { select(state.layer, state.head, true); return; }
  const best = state.heads?.best?.[type];
  if (best) {
    select(best.layer, best.head, false);
    status.textContent = `Best ${type} head: ${best.layer}.${best.head} (score ${Number(best.score).toFixed(3)}${best.passes_threshold === false ? "; below the threshold for that label" : ""}).`;
  } else {
    select(state.layer, state.head, false);
  }
}

async function loadModels(select, status) {
  try {
    const models = await api("/api/models");
    const available = models.filter((m) => m.available);
    clear(select, available.map((m) => h("option", { value: m.name }, m.description ? `${m.name} — ${m.description}` : m.name)));
    if (available.some((m) => m.name === "default")) select.value = "default";
    const absent = models.filter((m) => !m.available);
    if (absent.length) status.textContent = `Not available here: ${absent.map((m) => `${m.name} (${m.reason})`).join("; ")}`;
    return available.length > 0;
  } catch (err) {
    status.textContent = err.message;
    return false;
  }
}

function summarise(el, state) {
  if (!el) return;
  if (!state.heads) { clear(el, missing("Head labels are not available from this server yet.")); return; }
  const counts = {};
  for (const r of state.heads.heads) counts[r.label] = (counts[r.label] || 0) + 1;
  const total = state.heads.heads.length;
  clear(el, h("p", { id: "label-counts" }, `On this input, ${state.heads.model}'s ${total} heads get these labels: `,
    Object.entries(counts).sort((a, b) => b[1] - a[1]).map(([k, v]) => `${k} ${v}`).join(", "),
    ". Change the text or the input above and watch how many labels move."));
}
