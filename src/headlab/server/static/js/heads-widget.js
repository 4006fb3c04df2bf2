// Widget 2: what heads learn. One POST /api/heads per run answers every head's pattern, scores
// and label (headlab.heads.analyse on the chosen model); every view is drawn from that answer.
import { api } from "./api.js";
import { h, clear, debounce, missing } from "./dom.js";
import { heatmap, twoColumn, colourLegend, focusWindow } from "./figures.js";
import { figure } from "./export.js";
import { headGrid } from "./headview.js";

export const HEAD_TYPES = [
  ["previous-token", "previous-token head"],
  ["positional", "positional head (a fixed offset other than 0 and ±1)"],
  ["current-token", "self / current-token head"],
  ["induction", "induction head"],
  ["content", "content head"],
  ["syntactic", "syntactic head (pick a relation)"],
  ["rare-word", "rare-word head"],
  ["sink", "attention sink (first token)"],
  ["averaged", "one averaged head (mean of a layer)"],
];

function field(id, label, control) {
  return h("label", { for: id }, label, control);
}

export function initHeads(root, summaryEl) {
  const model = h("select", { id: "heads-model", name: "model" });
  const kind = h("select", { id: "heads-type", name: "type" }, HEAD_TYPES.map(([v, t]) => h("option", { value: v }, t)));
  const which = h("select", { id: "heads-which", name: "head" });
  const relation = h("select", { id: "heads-relation", name: "relation" });
  const relationField = field("heads-relation", "relation", relation);
  relationField.hidden = true;
  // the probes are the server's (GET /api/probes: headlab.measure.PROBES), filled in once
  const input = h("select", { id: "heads-probe", name: "probe" });
  let probes = [];
  const readsText = () => probes.find((p) => p.name === input.value)?.takes_text ?? true;
  const text = h("textarea", { id: "heads-text", name: "text", rows: 3, spellcheck: "false" });
  const run = h("button", { type: "submit", id: "heads-run" }, "Run the model");
  const form = h("form", { id: "heads-form", "aria-label": "head viewer" },
    h("div", { class: "controls" }, field("heads-model", "model", model), field("heads-type", "head type", kind), relationField, field("heads-which", "or any head (layer.head)", which), field("heads-probe", "run the model on", input)),
    field("heads-text", "text (a repeated phrase shows induction)", text), h("p", {}, run, " ", h("span", { class: "note" }, "Ctrl+Enter runs it too")));
  const status = h("p", { class: "note", id: "heads-status", role: "status", "aria-live": "polite" });
  const view = h("div", { id: "heads-view" });
  const grid = h("div", { id: "heads-grid" });
  root.append(h("div", { class: "widget-box" }, form, status, view, grid));

  const state = { attention: null, heads: null, layer: 0, head: 0, averaged: false, syntactic: null, pickedAs: "" };

  const draw = () => {
    const a = state.attention;
    if (!a) return;
    const { layer, head } = state;
    const label = labelOf(state, layer, head);
    const readout = h("p", { class: "note", id: "heads-readout", "aria-live": "polite" }, "Hover a cell, or focus the heatmap and use the arrow keys, to read the exact weight.");
    const headW = a.weights[layer][head];
    // a long input shows a window of the pattern: put it where the chosen head acts
    const acts = !state.averaged && (label === "induction" || state.pickedAs === "induction") ? "induction" : "";
    focusWindow(state.averaged ? a.averaged_weights[layer] : headW, a.tokens, acts);
    const headTitle = `head ${layer}.${head}${label ? ` — ${label}` : ""}`;
    const avgLabel = a.averaged?.[layer]?.label;
    const avgTitle = `layer ${layer}, all ${a.n_heads} heads averaged${avgLabel ? ` — ${avgLabel}` : ""}`;
    const left = figure(heatmap(headW, a.tokens, { title: headTitle, readout }), { name: `head-${layer}-${head}`, caption: headTitle, data: { model: a.model, tokens: a.tokens, layer, head, weights: headW } });
    const right = figure(heatmap(a.averaged_weights[layer], a.tokens, { title: avgTitle, readout }), { name: `head-${layer}-avg`, caption: avgTitle, data: { model: a.model, tokens: a.tokens, layer, weights: a.averaged_weights[layer] } });
    // the averaged view puts the layer's mean first, the chosen head beside it
    const pair = state.averaged ? [right, left] : [left, right];
    const chosenW = state.averaged ? a.averaged_weights[layer] : headW;
    const chosenTitle = state.averaged ? avgTitle : headTitle;
    const arcTitle = `${chosenTitle}: query → key lines (weights ≥ 0.02)`;
    const arc = figure(twoColumn(chosenW, a.tokens, { title: arcTitle, readout }), { name: `lines-${layer}-${state.averaged ? "avg" : head}`, caption: arcTitle, data: { tokens: a.tokens, weights: chosenW }, scroll: true });
    const extra = state.syntactic ? syntaxFigures(a.syntax, layer, head, state.syntactic, readout) : [];
    clear(view, colourLegend(), readout, h("div", { class: "pair" }, ...pair), ...extra, arc);
    // the grid is drawn once per answer; a pick presses its button and opens its layer
    grid.querySelectorAll("button[data-head]").forEach((b) => b.setAttribute("aria-pressed", String(!state.averaged && b.dataset.head === `${layer}.${head}`)));
    const box = grid.querySelector(`details[data-layer="${layer}"]`);
    if (box) box.open = true;
  };

  const drawGrid = () => {
    const a = state.attention;
    const kv = a.n_kv_heads || a.n_heads;
    const shared = kv < a.n_heads
      ? h("p", { class: "note", id: "heads-kv-note" }, `${a.model} shares each key/value head among ${a.n_heads / kv} query heads (grouped-query attention): each layer's heads are grouped by the K/V head they read. `,
        h("button", { type: "button", class: "chip", id: "heads-to-shapes", onclick: () => showSizes(a.model) }, "this model's layer in the shape calculator"))
      : null;
    clear(grid, h("h3", {}, "All heads, with their labels"), shared, headGrid(a, {
      labelOf: (l, k) => labelOf(state, l, k),
      active: (l, k) => !state.averaged && l === state.layer && k === state.head,
      onSelect: (l, k) => { state.pickedAs = ""; select(l, k, false); },
      focus: [state.layer, state.head],
    }));
  };

  const select = (layer, head, averaged, syntactic = null) => {
    Object.assign(state, { layer, head, averaged, syntactic });
    which.value = `${layer}.${head}`;
    draw();
  };

  // syntactic heads cost a parse of the evaluation text (once per model on the server): the
  // page asks for them from the first time the type is picked, in the same one answer
  let wantSyntax = false;
  const choose = () => {
    relationField.hidden = kind.value !== "syntactic";
    if (kind.value === "syntactic" && !wantSyntax) { wantSyntax = true; status.textContent = "Scoring syntactic heads on the evaluation text (the first time takes a while)…"; submit(); return; }
    state.pickedAs = kind.value;  // the head the type picks is shown where that type acts
    pickType(state, kind.value, select, status, relation.value);
  };
  kind.addEventListener("change", choose);
  relation.addEventListener("change", choose);
  which.addEventListener("change", () => {
    const [l, k] = which.value.split(".").map(Number);
    state.pickedAs = "";
    if (kind.value === "averaged") { select(l, k, true); status.textContent = averagedStatus(state); return; }
    select(l, k, false);
  });
  let runs = 0;
  const submit = async () => {
    const mine = ++runs;  // a newer run (another model, new text) wins over a slower older one
    status.textContent = "Running the model…";
    try {
      // a probe that reads a text, with an empty box, is left to the server: it runs its
      // default (the built-in sentence with a repeat), which the answer then shows in the box
      const typed = readsText() && text.value.trim();
      const body = { model: model.value || "default" };
      if (!readsText() || typed) body.probe = input.value;
      if (typed) body.text = text.value;
      const heads = await api("/api/heads", wantSyntax ? { ...body, syntax: true } : body);
      if (mine !== runs) return;
      const attention = heads;
      state.attention = attention;
      if (readsText() && !text.value.trim()) text.value = attention.text;
      state.heads = heads;
      clear(which, attention.weights.flatMap((heads_, l) => heads_.map((_, k) => h("option", { value: `${l}.${k}` }, `${l}.${k}${labelOf(state, l, k) ? ` ${labelOf(state, l, k)}` : ""}`))));
      status.textContent = `${attention.model}: ${attention.tokens.length} tokens, ${attention.n_layers} layers × ${attention.n_heads} heads.`;
      fillRelations(relation, heads.syntax);
      drawGrid();
      choose();
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
  const showText = () => { text.disabled = !readsText(); text.parentElement.hidden = text.disabled; };
  input.addEventListener("change", () => { showText(); submit(); });
  const probesLoaded = api("/api/probes").then((rows) => {
    probes = rows;
    clear(input, rows.map((p) => h("option", { value: p.name, title: p.name }, p.description)));
    input.value = rows.find((p) => p.takes_text)?.name ?? rows[0]?.name ?? "";  // start on the text box
    showText();
  });
  Promise.all([loadModels(model, status), probesLoaded]).then(([ok]) => {
    if (!ok) { clear(view, missing("No model is available to this server, so there are no patterns to show.")); return; }
    submit();
  }).catch((err) => { status.textContent = err.message; status.classList.add("error"); });
  return { submit, state };
}

// The shape calculator (widget 1) loads the model's own sizes: its preset "model:NAME".
function showSizes(name) {
  const preset = document.getElementById("shapes-preset");
  if (!preset || ![...preset.options].some((o) => o.value === `model:${name}`)) return;
  preset.value = `model:${name}`;
  preset.dispatchEvent(new Event("change"));
  preset.scrollIntoView({ behavior: "smooth", block: "center" });
  preset.focus({ preventScroll: true });
}

// each answer's rows by "layer.head", built once per answer (SmolLM2 has 270 heads to look up)
const ROWS = new WeakMap();
function rowOf(state, layer, head) {
  const heads = state.heads?.heads;
  if (!heads) return undefined;
  if (!ROWS.has(heads)) ROWS.set(heads, new Map(heads.map((r) => [`${r.layer}.${r.head}`, r])));
  return ROWS.get(heads).get(`${layer}.${head}`);
}

function labelOf(state, layer, head) {
  const row = rowOf(state, layer, head);
  return row ? row.label : "";
}

const pct = (v) => `${(100 * Number(v)).toFixed(1)}%`;

function fillRelations(select, syntax) {
  const before = select.value;
  const rows = syntax?.relations || [];
  clear(select, rows.map((r) => h("option", { value: r.relation }, `${r.relation}: head ${r.layer}.${r.head}, ${pct(r.accuracy)} vs offset ${pct(r.baseline_accuracy)}`)));
  if (rows.some((r) => r.relation === before)) select.value = before;
}

function averagedStatus(state) {
  const a = state.attention;
  const avg = a.averaged?.[state.layer];
  return `Layer ${state.layer}'s averaged head (the mean of its ${a.n_heads} heads) is labelled ${avg ? avg.label : "—"}; beside it head ${state.layer}.${state.head} (${labelOf(state, state.layer, state.head) || "—"}). Pick another layer with the layer.head menu.`;
}

function sinkStatus(state) {
  const layers = state.heads?.sinks?.layers || [];
  const shares = layers.map((r) => `layer ${r.layer} ${Math.round(100 * r.share)}%`).join(", ");
  return shares ? ` Heads with more than ${state.heads.sinks.threshold} of their attention on the first token, per layer: ${shares}.` : "";
}

function pickType(state, type, select, status, relation) {
  if (!state.attention) return;
  if (type === "averaged") { select(state.layer, state.head, true); status.textContent = averagedStatus(state); return; }
  if (type === "syntactic") { pickSyntactic(state, select, status, relation); return; }
  const best = state.heads?.best?.[type];
  if (!best) {
    select(state.layer, state.head, false);
    status.textContent = type === "rare-word" ? "Rare-word heads are scored on a text (with wordfreq installed: pip install 'headlab[syntax]'); random tokens have no word frequencies." : `No ${type} score on this input.`;
    return;
  }
  select(best.layer, best.head, false);
  const score = Number(best.score).toFixed(3);
  const rest = rowOf(state, best.layer, best.head)?.rest;
  const resting = rest === null || rest === undefined ? "" : `; where it has nothing to do it rests on the first token (${Number(rest).toFixed(2)})`;
  status.textContent = best.labelled
    ? `Best ${type} head: ${best.layer}.${best.head} (score ${score}${resting}).`
    : `No head is labelled ${type} on this input; the highest ${type} score is head ${best.layer}.${best.head} (${score}${best.passes_threshold === false ? "; below the threshold for that label" : ""}), labelled ${best.label}.`;
  if (type === "sink") status.textContent += sinkStatus(state);
}

function pickSyntactic(state, select, status, relation) {
  const syntax = state.attention.syntax;
  const row = syntax?.relations?.find((r) => r.relation === relation) || syntax?.relations?.[0];
  if (!syntax?.available || !row) {
    select(state.layer, state.head, false);
    status.textContent = syntax?.note || "Syntactic heads are not available from this server.";
    return;
  }
  select(row.layer, row.head, false, row.relation);
  status.textContent = `Best ${row.relation} head on the evaluation text (${syntax.relations.length} relations, Clark et al. 2019): ${row.layer}.${row.head}, ${pct(row.accuracy)} of ${row.count} arcs (${row.direction}) against ${pct(row.baseline_accuracy)} for the best fixed offset (${row.baseline_offset > 0 ? "+" : ""}${row.baseline_offset}).${syntax.note ? ` ${syntax.note}` : ""}`;
}

// Word-level lines for a syntactic pick: the head's most attended word per word, and beside it
// the parser's arcs (dependent → head), both drawn from the one /api/heads answer in the page's
// two-column view (word on the left, the word it points to on the right).
function syntaxFigures(syntax, layer, head, relation, readout) {
  if (!syntax?.words?.length) return [];
  const W = syntax.words.length;
  const grid = () => Array.from({ length: W }, () => new Array(W).fill(0));
  const top = grid();
  syntax.links[layer][head].forEach((j, i) => { if (j >= 0) top[i][j] = 1; });
  const parsed = grid();
  for (const arc of syntax.arcs) parsed[arc.dependent][arc.head] = arc.relation === relation ? 1 : 0.35;
  const headTitle = `head ${layer}.${head}: each word's most attended word`;
  const parseTitle = `parser: each word's syntactic head (${relation} arcs dark)`;
  return [h("div", { class: "pair", id: "heads-syntax" },
    figure(twoColumn(top, syntax.words, { title: headTitle, readout, minWeight: 0.5 }), { name: `syntax-${layer}-${head}`, caption: headTitle, data: { words: syntax.words, links: syntax.links[layer][head] }, scroll: true }),
    figure(twoColumn(parsed, syntax.words, { title: parseTitle, readout, minWeight: 0.3 }), { name: "syntax-parse", caption: parseTitle, data: { words: syntax.words, arcs: syntax.arcs }, scroll: true }))];
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
