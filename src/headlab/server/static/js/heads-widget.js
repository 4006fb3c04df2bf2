// Widget 2: what heads learn. One POST /api/heads per run answers every head's pattern, scores
// and label (headlab.heads.analyse on the chosen model); every view is drawn from that answer.
import { api, refusal, quoted } from "./api.js";
import { h, clear, fmtInt, missing } from "./dom.js";
import { heatmap, twoColumn, colourLegend, focusWindow, HEATMAP_WIDTH, TWO_COLUMN_WIDTH } from "./figures.js";
import { figure } from "./export.js";
import { headGrid } from "./headview.js";
import { typeSentence, syntaxSentence, signed } from "./sentences.js";
import { tokenNote } from "./tokens.js";
import { evidenceCard, circuitGraph, circuitNote, CIRCUIT_WIDTH } from "./evidence-card.js";
import { glossed } from "./glossary.js";
import { withProgress } from "./progress.js";
import { hostRuns, hostNote } from "./host.js";

export const HEAD_TYPES = [
  ["previous-token", "previous-token head"],
  ["positional", "positional (a fixed offset)"],
  ["current-token", "current-token (self) head"],
  ["induction", "induction head"],
  ["content", "content head"],
  ["syntactic", "syntactic head (by relation)"],
  ["rare-word", "rare-word head"],
  ["sink", "attention sink (first token)"],
  ["averaged", "a layer's heads averaged"],
];

function field(id, label, control, cls = null) {
  return h("label", { for: id, class: cls }, label, control);
}

// The form and the boxes the answer is drawn into.
function build(root) {
  const el = {
    model: h("select", { id: "heads-model", name: "model" }),
    // the types this host scores (a static site: those its exported graph gives)
    kind: h("select", { id: "heads-type", name: "type" }, HEAD_TYPES.filter(([v]) => hostRuns("head_types", v)).map(([v, t]) => h("option", { value: v }, t))),
    which: h("select", { id: "heads-which", name: "head" }),
    relation: h("select", { id: "heads-relation", name: "relation" }),
    input: h("select", { id: "heads-probe", name: "probe" }),  // filled from GET /api/probes
    syntaxLabels: h("input", { type: "checkbox", id: "heads-syntax-labels", name: "syntax_labels" }),
    evidence: h("input", { type: "checkbox", id: "heads-evidence", name: "evidence" }),
    text: h("textarea", { id: "heads-text", name: "text", rows: 3, spellcheck: "false" }),
    run: h("button", { type: "submit", id: "heads-run" }, "Run the model"),
    about: h("p", { class: "note", id: "heads-about" }),
    // a static site's one line on the models, inputs and types it leaves out, and why
    hostNote: h("p", { class: "note", id: "heads-host-note", hidden: !hostNote() }, hostNote()),
    stale: h("p", { class: "stale-note", id: "heads-stale", hidden: true }),
    status: h("p", { class: "note", id: "heads-status", role: "status", "aria-live": "polite" }),
    tokens: h("p", { class: "note", id: "heads-tokens", hidden: true }),
    view: h("div", { id: "heads-view" }),
    grid: h("div", { id: "heads-grid" }),
    card: h("div", { id: "heads-card" }),
    circuit: h("div", { id: "heads-circuit" }),
  };
  el.relationField = field("heads-relation", "relation", el.relation);
  el.relationField.hidden = true;
  const syntaxField = field("heads-syntax-labels", [el.syntaxLabels, "label heads by syntax too (may relabel other heads)"], null, "inline");
  const evidenceField = field("heads-evidence", [el.evidence, ...glossed("show the evidence for each label (baselines, ablations, compositions; the line below the form names each step as it runs and the time it should take)")], null, "inline");
  syntaxField.hidden = !hostRuns("heads_options", "syntax_labels");
  evidenceField.hidden = !hostRuns("heads_options", "evidence");
  el.form = h("form", { id: "heads-form", "aria-label": "head viewer" },
    h("div", { class: "controls flow" }, field("heads-model", "model", el.model), field("heads-type", "head type", el.kind), el.relationField,
      field("heads-which", "or any head (layer.head)", el.which), field("heads-probe", "run the model on", el.input), syntaxField, evidenceField),
    el.hostNote, el.about, field("heads-text", "text (a repeated phrase shows induction)", el.text), h("p", {}, el.run, " ", h("span", { class: "note" }, "Ctrl+Enter runs it too")));
  // everything drawn from one answer, marked as a whole when the input chosen is another
  el.results = h("div", { id: "heads-results" }, el.tokens, el.view, el.card, el.circuit, el.grid);
  root.append(h("div", { class: "widget-box" }, el.form, el.status, el.stale, el.results));
  return el;
}

export function initHeads(root, summaryEl) {
  const el = build(root);
  // shownFor: the input the drawn answer is of (inputKey); asked: the input of the run on its way
  const state = { attention: null, heads: null, layer: 0, head: 0, averaged: false, syntactic: null, pickedAs: "", wantSyntax: false, models: [], probes: [], maxChars: null, shownFor: null, asked: null };
  const readsText = () => state.probes.find((p) => p.name === el.input.value)?.takes_text ?? true;
  const draw = () => drawHead(el, state);
  const select = (layer, head, averaged, syntactic = null) => {
    Object.assign(state, { layer, head, averaged, syntactic });
    el.which.value = `${layer}.${head}`;
    draw();
  };
  // syntactic heads cost a parse of the evaluation text (once per model on the server): the
  // page asks for their scores from the first time the type is picked, in the same one answer
  // (the labels stay the same unless "label heads by syntax too" is ticked)
  const choose = () => {
    el.relationField.hidden = el.kind.value !== "syntactic";
    if (el.kind.value === "syntactic" && !state.wantSyntax) { state.wantSyntax = true; el.status.textContent = "Scoring syntactic heads on the evaluation text (the first time takes a while)…"; submit(); return; }
    state.pickedAs = el.kind.value;  // the head the type picks is shown where that type acts
    pickType(state, el.kind.value, select, el.status, el.relation.value);
  };
  const submit = runner(el, state, { readsText, choose, select, summaryEl });
  el.kind.addEventListener("change", choose);
  el.relation.addEventListener("change", choose);
  el.which.addEventListener("change", () => {
    const [l, k] = el.which.value.split(".").map(Number);
    state.pickedAs = "";
    if (el.kind.value === "averaged") { select(l, k, true); el.status.textContent = averagedStatus(state); return; }
    select(l, k, false);
  });
  el.form.addEventListener("submit", (e) => { e.preventDefault(); submit(); });
  el.text.addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); submit(); } });
  el.text.addEventListener("input", () => markStale(el, state, readsText));
  el.model.addEventListener("change", () => { describe(el, state); submit(); drawCircuit(el, state); });
  el.syntaxLabels.addEventListener("change", submit);
  el.evidence.addEventListener("change", () => { submit(); drawCircuit(el, state); });
  const showText = () => { el.text.disabled = !readsText(); el.text.parentElement.hidden = el.text.disabled; };
  el.input.addEventListener("change", () => { showText(); describe(el, state); submit(); });
  start(el, state, showText, submit);
  return { submit, state };
}

// The vocabularies (models, probes) and the text limit, asked for once; then the first run.
function start(el, state, showText, submit) {
  const probesLoaded = api("/api/probes").then((all) => {
    const rows = all.filter((p) => hostRuns("probes", p.name));  // a static site runs a few
    state.probes = rows;
    // a menu shows a probe's description up to its first parenthesis; the rest is its title
    clear(el.input, rows.map((p) => h("option", { value: p.name, title: p.description }, p.description.split(" (")[0])));
    el.input.value = rows.find((p) => p.takes_text)?.name ?? rows[0]?.name ?? "";  // start on the text box
    showText();
  });
  // the longest text the server takes: the schema's own maxLength (headlab serve --max-text-chars)
  api("/openapi.json").then((schema) => {
    const text = schema.components?.schemas?.HeadsRequest?.properties?.text;
    state.maxChars = (text?.anyOf || [text]).find((t) => Number.isInteger(t?.maxLength))?.maxLength ?? null;
  }).catch(() => {});
  Promise.all([loadModels(el, state), probesLoaded]).then(([ok]) => {
    describe(el, state);
    if (!ok) { clear(el.view, missing("No model is available to this server, so there are no patterns to show.")); return; }
    submit();
  }).catch((err) => { el.status.textContent = err.message; el.status.classList.add("error"); });
}

// "default: headlab's shipped model, …; run on the text you give": the menus show short names.
function describe(el, state) {
  const m = state.models.find((x) => x.name === el.model.value);
  const p = state.probes.find((x) => x.name === el.input.value);
  el.about.textContent = [m ? `${m.name}: ${m.description || "a model on this server"}` : "", p ? `run on ${p.description}` : ""].filter(Boolean).join("; ") + ".";
}

// The text box against the server's limit, in the page's words; "" when it may be sent.
function textProblem(text, maxChars) {
  const chars = [...text].length;  // the server counts characters, not UTF-16 units
  return maxChars && chars > maxChars ? `The text is ${fmtInt(chars)} characters; the limit is ${fmtInt(maxChars)}. Shorten it and run again.` : "";
}

// A text the server refused after all (its limit is not the one the page read): in words.
const refusedText = (err, text) => refusal(err, {
  text: (item) => textProblem(text, quoted(item)) || "The server could not read this text; try a shorter or plainer one.",
});

// The input as the controls state it, to tell whether the answer drawn is of it; `text` is the
// box's text, or the text a run on the empty box was given (the answer's).
function inputKey(el, readsText, text = el.text.value) {
  return JSON.stringify({ model: el.model.value || "default", probe: el.input.value, text: readsText() ? text : null,
    evidence: el.evidence.checked, syntaxLabels: el.syntaxLabels.checked });
}

// An answer drawn for another input than the controls now state is marked as such, with a line
// that says so, until the answer for this one replaces it (or a failed run takes it away).
function markStale(el, state, readsText) {
  const now = inputKey(el, readsText);
  const stale = state.shownFor !== null && state.shownFor !== now;
  el.results.classList.toggle("stale", stale);
  el.stale.hidden = !stale;
  el.stale.textContent = !stale ? ""
    : state.asked === now ? "The figures below are of the input run before; the model is running on this one."
    : "The figures below are of the input run before, not of this one: run the model to see it.";
}

// A run that failed leaves nothing of an earlier input under the controls: its figures, card,
// grid, head menu and label summary are taken away (the status line says what went wrong).
function forget(el, state, summaryEl) {
  Object.assign(state, { attention: null, heads: null, shownFor: null, asked: null });
  clear(el.view);
  clear(el.card);
  clear(el.grid);  // the switch-off panel, watching the grid, lets go of the answer too
  clear(el.which);
  el.tokens.hidden = true;
  el.results.classList.remove("stale");
  el.stale.hidden = true;
  summarise(summaryEl, state, "The head viewer's last run gave no answer (its message says why), so there are no labels to count.");
}

// The one request per run; a newer run (another model, new text) wins over a slower older one.
function runner(el, state, { readsText, choose, select, summaryEl }) {
  let runs = 0;
  const failed = (text) => {
    el.status.textContent = text;
    el.status.classList.add("error");
    forget(el, state, summaryEl);
  };
  return async () => {
    const mine = ++runs;
    const typed = readsText() && el.text.value.trim();
    const problem = typed ? textProblem(el.text.value, state.maxChars) : "";
    if (problem) { failed(problem); return; }
    state.asked = inputKey(el, readsText);
    const emptyBox = readsText() && !typed;  // the answer's text fills it: the key is of that text
    markStale(el, state, readsText);
    el.status.textContent = "Running the model…";
    try {
      // a probe that reads a text, with an empty box, is left to the server: it runs its
      // default (the built-in sentence with a repeat), which the answer then shows in the box
      const body = { model: el.model.value || "default" };
      if (!readsText() || typed) body.probe = el.input.value;
      if (typed) body.text = el.text.value;
      if (el.evidence.checked) body.evidence = true;
      if (el.syntaxLabels.checked) body.syntax_labels = true;
      else if (state.wantSyntax) body.syntax = true;
      // a long run (the evidence, a model's first floors) says each step and the time expected
      const progress = (text) => { if (mine === runs) el.status.textContent = text; };
      const heads = await withProgress((id) => api("/api/heads", id ? { ...body, progress_id: id } : body), progress);
      if (mine !== runs) return;
      const asked = emptyBox ? JSON.stringify({ ...JSON.parse(state.asked), text: heads.text }) : state.asked;
      show(el, state, heads, { readsText, choose, select, summaryEl });
      Object.assign(state, { shownFor: asked, asked: null });
      markStale(el, state, readsText);
    } catch (err) {
      if (mine !== runs) return;
      failed(refusedText(err, el.text.value));
      return;
    }
    el.status.classList.remove("error");
  };
}

function show(el, state, heads, { readsText, choose, select, summaryEl }) {
  Object.assign(state, { attention: heads, heads });
  if (readsText() && !el.text.value.trim()) el.text.value = heads.text;
  clear(el.which, heads.weights.flatMap((heads_, l) => heads_.map((_, k) => h("option", { value: `${l}.${k}` }, `${l}.${k}${labelOf(state, l, k) ? ` ${labelOf(state, l, k)}` : ""}`))));
  el.status.textContent = `${heads.model}: ${heads.tokens.length} tokens, ${heads.n_layers} layers × ${heads.n_heads} heads.`;
  const note = tokenNote(heads.model, heads.tokens);
  el.tokens.textContent = note;
  el.tokens.hidden = !note;
  fillRelations(el.relation, heads.syntax);
  drawGrid(el, state, select);
  choose();
  summarise(summaryEl, state);
}

// The chosen head beside its layer's average, and its query → key lines; every figure drawn to
// the width it is given.
function drawHead(el, state) {
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
  const heat = (weights, title, name, data) => figure(null, { name, caption: title, data,
    fit: { max: HEATMAP_WIDTH, draw: (room) => heatmap(weights, a.tokens, { title, readout, room }) } });
  const left = heat(headW, headTitle, `head-${layer}-${head}`, { model: a.model, tokens: a.tokens, layer, head, weights: headW });
  const right = heat(a.averaged_weights[layer], avgTitle, `head-${layer}-avg`, { model: a.model, tokens: a.tokens, layer, weights: a.averaged_weights[layer] });
  // the averaged view puts the layer's mean first, the chosen head beside it
  const pair = state.averaged ? [right, left] : [left, right];
  const chosenW = state.averaged ? a.averaged_weights[layer] : headW;
  const arcTitle = `${state.averaged ? avgTitle : headTitle}: query → key lines (weights ≥ 0.02)`;
  const arc = figure(null, { name: `lines-${layer}-${state.averaged ? "avg" : head}`, caption: arcTitle, data: { tokens: a.tokens, weights: chosenW }, scroll: true,
    fit: { max: TWO_COLUMN_WIDTH, draw: (width) => twoColumn(chosenW, a.tokens, { title: arcTitle, readout, width }) } });
  const extra = state.syntactic ? syntaxFigures(a.syntax, layer, head, state.syntactic, readout) : [];
  clear(el.view, colourLegend(), readout, h("div", { class: "pair" }, ...pair), ...extra, arc);
  drawCard(el, state);
  // the grid is drawn once per answer; a pick presses its button and opens its layer
  el.grid.querySelectorAll("button[data-head]").forEach((b) => b.setAttribute("aria-pressed", String(!state.averaged && b.dataset.head === `${layer}.${head}`)));
  const box = el.grid.querySelector(`details[data-layer="${layer}"]`);
  if (box) box.open = true;
}

// The chosen head's card, when the answer carries the evidence (the box ticked).
function drawCard(el, state) {
  const ev = state.heads?.evidence;
  if (!ev) { clear(el.card); return; }
  if (state.averaged) { clear(el.card, h("p", { class: "note", id: "evidence-card" }, "The evidence is measured per head: pick a head to see what backs its label.")); return; }
  clear(el.card, evidenceCard((ev.heads || []).find((r) => r.layer === state.layer && r.head === state.head)));
}

// The induction circuit of the chosen model (POST /api/circuit, on repeated random tokens),
// asked for when the evidence is shown; a newer request wins over an older one.
let circuitRuns = 0;
async function drawCircuit(el, state) {
  const mine = ++circuitRuns;
  if (!el.evidence.checked) { clear(el.circuit); return; }
  const model = el.model.value || "default";
  clear(el.circuit, h("p", { class: "note", role: "status" }, `Finding ${model}'s induction circuit on repeated random tokens…`));
  try {
    const c = await api("/api/circuit", { model });
    if (mine !== circuitRuns) return;
    const on = probeName(state, c.probe);
    const title = `${model}: the induction circuit${c.probe ? ` on ${on}` : ""} (previous-token → induction heads, K-composition)`;
    clear(el.circuit, h("h3", {}, "The induction circuit"), figure(null, { name: `circuit-${model}`, caption: title, data: c,
      fit: { max: CIRCUIT_WIDTH, draw: (width) => circuitGraph(c, { width }) } }),
      h("p", { class: "note", id: "circuit-note" }, ...glossed(circuitNote(c))),
      h("p", { class: "note", id: "circuit-probe" }, `The rings mark each head's job on ${c.probe ? on : "the circuit's probe"}${c.probe ? ", the circuit's own probe" : ""}; the grid of all heads labels them on the input the model was last run on (its heading names it), so a head can be an induction head here and something else there.`));
  } catch (err) {
    if (mine === circuitRuns) clear(el.circuit, missing(`The induction circuit could not be found: ${err.message}`));
  }
}

function drawGrid(el, state, select) {
  const a = state.attention;
  const kv = a.n_kv_heads || a.n_heads;
  const shared = kv < a.n_heads
    ? h("p", { class: "note", id: "heads-kv-note" }, kv === 1
      ? `${a.model}'s ${a.n_heads} query heads all read one key/value head (multi-query attention): each layer's heads form one group. `
      : `${a.model} shares each key/value head among ${a.n_heads / kv} query heads (grouped-query attention): each layer's heads are grouped by the K/V head they read. `,
      a.window != null ? `Layers marked local see only the last ${a.window} keys (a sliding window); global layers see every key. ` : null,
      h("button", { type: "button", class: "chip", id: "heads-to-shapes", onclick: () => showSizes(a.model) }, "this model's layer in the shape calculator"))
    : null;
  clear(el.grid, h("h3", { id: "heads-grid-title" }, `All heads, with their labels on ${probeName(state, a.probe)}`), shared, headGrid(a, {
    labelOf: (l, k) => labelOf(state, l, k),
    active: (l, k) => !state.averaged && l === state.layer && k === state.head,
    onSelect: (l, k) => { state.pickedAs = ""; select(l, k, false); },
    focus: [state.layer, state.head],
  }));
}

// A probe as the menu names it ("random tokens, repeated 4 times"), else its own name.
function probeName(state, probe) {
  const p = state?.probes?.find((x) => x.name === probe);
  return p ? p.description.split(" (")[0] : probe || "this input";
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
  clear(select, rows.map((r) => h("option", { value: r.relation, title: `${r.relation}: head ${r.layer}.${r.head}, ${pct(r.accuracy)} of its arcs; the best fixed offset, ${pct(r.baseline_accuracy)}` },
    `${r.relation}${r.meaning ? ` (${r.meaning})` : ""}: ${r.layer}.${r.head}, ${pct(r.accuracy)} (offset ${signed(r.baseline_offset)}: ${pct(r.baseline_accuracy)})`)));
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
    status.textContent = type === "rare-word" ? "Rare-word heads are scored on a text (with wordfreq installed: pip install -e '.[syntax]' in the checkout); random tokens have no word frequencies." : `No ${type} score on this input.`;
    return;
  }
  select(best.layer, best.head, false);
  status.textContent = typeSentence(state.heads, type, best, rowOf(state, best.layer, best.head));
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
  status.textContent = syntaxSentence(syntax, row, state.heads.thresholds?.syntactic ?? 0.1, Boolean(state.heads.syntax_labels));
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
  const lines = (weights, title, name, minWeight, data) => figure(null, { name, caption: title, data, scroll: true,
    fit: { max: TWO_COLUMN_WIDTH, draw: (width) => twoColumn(weights, syntax.words, { title, readout, minWeight, width }) } });
  const headTitle = `head ${layer}.${head}: each word's most attended word`;
  const parseTitle = `parser: each word's syntactic head (${relation} arcs dark)`;
  return [h("div", { class: "pair", id: "heads-syntax" },
    lines(top, headTitle, `syntax-${layer}-${head}`, 0.5, { words: syntax.words, links: syntax.links[layer][head] }),
    lines(parsed, parseTitle, "syntax-parse", 0.3, { words: syntax.words, arcs: syntax.arcs }))];
}

async function loadModels(el, state) {
  try {
    // a static site runs only the models its manifest lists (the line under the menus says so)
    const models = (await api("/api/models")).filter((m) => hostRuns("models", m.name));
    const available = models.filter((m) => m.available);
    state.models = available;
    // the menu names the model; its description is the line under the menus
    clear(el.model, available.map((m) => h("option", { value: m.name, title: m.description || m.name }, m.name)));
    if (available.some((m) => m.name === "default")) el.model.value = "default";
    const absent = models.filter((m) => !m.available);
    if (absent.length) el.status.textContent = `Not available here: ${absent.map((m) => `${m.name} (${m.reason})`).join("; ")}`;
    return available.length > 0;
  } catch (err) {
    el.status.textContent = err.message;
    return false;
  }
}

function summarise(el, state, why = "Head labels are not available from this server yet.") {
  if (!el) return;
  if (!state.heads) { clear(el, missing(why)); return; }
  const counts = {};
  for (const r of state.heads.heads) counts[r.label] = (counts[r.label] || 0) + 1;
  const total = state.heads.heads.length;
  clear(el, h("p", { id: "label-counts" }, `On this input, ${state.heads.model}'s ${total} heads get these labels: `,
    Object.entries(counts).sort((a, b) => b[1] - a[1]).map(([k, v]) => `${k} ${v}`).join(", "),
    ". Change the text or the input above and watch how many labels move."));
}
