// Switch heads off and watch: the head viewer's input run twice, intact and with the heads picked
// here switched off together (POST /api/switch-off, headlab.heads.switch.switch_off), drawn side
// by side: the loss on the repeat, the induction scores, a head's pattern, each position's
// likeliest next token. The heads and their labels come from the head viewer's last answer.
import { api } from "./api.js";
import { h, clear, missing } from "./dom.js";
import { heatmap, colourLegend, HEATMAP_WIDTH } from "./figures.js";
import { figure } from "./export.js";
import { glossed } from "./glossary.js";
import { hostRuns } from "./host.js";

const SHOWN = 0.1;  // induction scores listed: a head at or above this in either run
const LISTED = 12;  // at most this many of them, the largest changes first

const MEANING = "Switching a head off (an ablation) runs the same text again with that head's output replaced, " +
  "everything else as it was. “Average” replaces it with the head's average output over the whole " +
  "text: the head still adds what it adds on average, but nothing about the token it is at. " +
  "“Zero” replaces it with zeros, as if the head were cut out.";

// The panel: what switching off means, the heads to pick, how, and where the two runs go.
function build(root) {
  const el = {
    picker: h("div", { id: "switch-heads", role: "group", "aria-label": "heads to switch off" }),
    mean: h("input", { type: "radio", name: "switch-mode", id: "switch-mode-mean", value: "mean", checked: true }),
    zero: h("input", { type: "radio", name: "switch-mode", id: "switch-mode-zero", value: "zero" }),
    previous: h("button", { type: "button", class: "chip", id: "switch-previous" }, "pick the previous-token heads"),
    none: h("button", { type: "button", class: "chip", id: "switch-clear" }, "pick none"),
    run: h("button", { type: "button", id: "switch-run" }, "Switch off and run"),
    status: h("p", { class: "note", id: "switch-status", role: "status", "aria-live": "polite" }),
    result: h("div", { id: "switch-result" }),
  };
  const how = h("fieldset", { id: "switch-mode" }, h("legend", {}, "replace each switched-off head's output with"),
    h("label", { for: "switch-mode-mean" }, el.mean, " its average over the text"), " ",
    h("label", { for: "switch-mode-zero" }, el.zero, " zeros"));
  root.append(h("div", { class: "widget-box", id: "switch-box" },
    h("h3", { id: "switch-h" }, "Switch heads off and watch"),
    h("p", { class: "note", id: "switch-meaning" }, ...glossed(MEANING)),
    h("p", { class: "note" }, "Pick heads below (the head viewer's labels beside them), then run: the loss on the repeat, the induction scores, a head's pattern and every next-token guess are shown for the intact model and with those heads off."),
    el.picker, h("p", { class: "chips" }, el.previous, el.none), how, h("p", {}, el.run), el.status, el.result));
  return el;
}

// viewer: the head viewer's state (initHeads), whose ``heads`` is its last /api/heads answer.
export function initSwitchOff(root, viewer) {
  if (!hostRuns("routes", "switch-off")) {  // a static site that cannot run it says so, once
    root.append(h("div", { class: "widget-box", id: "switch-box" }, h("h3", { id: "switch-h" }, "Switch heads off and watch"),
      h("p", { class: "note", id: "switch-host-note" }, "Switching heads off runs the model twice on the server: it needs `headlab serve`.")));
    return;
  }
  const el = build(root);
  const state = { picked: new Set(), answer: null, runs: 0 };
  const grid = document.getElementById("heads-grid");
  // each new answer of the head viewer (its grid drawn again) offers its heads here, and clears
  // a result drawn for another input; a run of the viewer that failed (its grid emptied) takes
  // the heads and the result away
  const fresh = () => (viewer.heads ? offer(el, state, viewer.heads) : letGo(el, state));
  if (grid) new MutationObserver(fresh).observe(grid, { childList: true });
  fresh();
  el.previous.addEventListener("click", () => {
    const a = viewer.heads;
    if (!a) return;
    state.picked = new Set(a.heads.filter((r) => r.label === "previous-token").map((r) => `${r.layer}.${r.head}`));
    if (!state.picked.size) el.status.textContent = `No head of ${a.model} is labelled previous-token on this input.`;
    press(el, state);
    // a folded layer holding a picked head opens, so that every head picked is in view
    el.picker.querySelectorAll("details.grid-layer").forEach((d) => {
      if (d.querySelector('button[aria-pressed="true"]')) d.open = true;
    });
  });
  el.none.addEventListener("click", () => { state.picked.clear(); press(el, state); });
  el.run.addEventListener("click", () => run(el, state, viewer.heads));
}

// The head viewer's heads as toggle buttons, layer by layer; a new input drops the last result.
function offer(el, state, a) {
  const same = state.answer && state.answer.model === a.model && state.answer.n_layers === a.n_layers;
  if (!same) state.picked.clear();
  state.answer = a;
  state.runs += 1;  // a run still on its way was for the old input
  clear(el.result);
  el.status.textContent = "";
  const label = (l, k) => a.heads.find((r) => r.layer === l && r.head === k)?.label || "";
  const layers = [];
  for (let l = 0; l < a.n_layers; l += 1) {
    const buttons = [];
    for (let k = 0; k < a.n_heads; k += 1) {
      const name = `${l}.${k}`;
      buttons.push(h("button", { type: "button", class: "chip", "data-off": name, "aria-pressed": "false",
        onclick: () => { state.picked.has(name) ? state.picked.delete(name) : state.picked.add(name); press(el, state); } },
      `${name} ${label(l, k)}`));
    }
    layers.push(h("details", { class: "grid-layer", "data-layer": String(l), open: a.n_layers <= 4 ? "" : null },
      h("summary", {}, `layer ${l}`), h("div", { class: "chips" }, buttons)));
  }
  clear(el.picker, layers);
  press(el, state);
  const runs = a.probe !== "needle";
  el.run.disabled = !runs;
  if (!runs) el.status.textContent = "Switching heads off runs on a text or the built-in probes: pick one of those above.";
}

// No answer in the head viewer (its last run failed): nothing to pick, nothing shown of before.
function letGo(el, state) {
  if (!state.answer) return;
  state.answer = null;
  state.picked.clear();
  state.runs += 1;  // a run still on its way was for that answer
  clear(el.picker);
  clear(el.result);
  el.run.disabled = true;
  el.status.textContent = "The head viewer has no answer to switch heads off in: run it on an input first.";
}

// Each head's button pressed or not, and each layer's line says how many of its heads are
// picked (a folded layer hides its buttons: a model of 30 layers folds all but none).
function press(el, state) {
  el.picker.querySelectorAll("button[data-off]").forEach((b) => b.setAttribute("aria-pressed", String(state.picked.has(b.dataset.off))));
  el.picker.querySelectorAll("details.grid-layer").forEach((d) => {
    const count = d.querySelectorAll('button[aria-pressed="true"]').length;
    const text = `layer ${d.dataset.layer}${count ? ` · ${count} picked` : ""}`;
    const summary = d.querySelector("summary");
    if (summary.textContent !== text) summary.textContent = text;
  });
}

async function run(el, state, a) {
  if (!a) return;
  if (!state.picked.size) { el.status.textContent = "Pick at least one head to switch off."; return; }
  const mine = ++state.runs;
  const off = [...state.picked].map((n) => n.split(".").map(Number)).sort((x, y) => x[0] - y[0] || x[1] - y[1]);
  const body = { model: a.model, off, mode: el.zero.checked ? "zero" : "mean", probe: a.probe };
  if (a.probe === "text") body.text = a.text;
  el.status.textContent = "Running the model twice…";
  try {
    const answer = await api("/api/switch-off", body);
    if (mine !== state.runs) return;
    el.status.textContent = "";
    draw(el, answer, a);
  } catch (err) {
    if (mine !== state.runs) return;
    el.status.textContent = err.message;
    clear(el.result, missing(`The heads could not be switched off: ${err.message}`));
  }
}

const headName = ([l, k]) => `${l}.${k}`;
const nats = (x) => x.toFixed(2);
const signed = (x) => `${x >= 0 ? "+" : "−"}${Math.abs(x).toFixed(2)}`;

function draw(el, s, a) {
  const offNames = s.off.map(headName).join(", ");
  const labelOf = (l, k) => a.heads.find((r) => r.layer === l && r.head === k)?.label || "";
  clear(el.result,
    h("p", { id: "switch-summary" }, `${s.model} on ${s.tokens.length} tokens, with ${offNames} switched off (${s.mode === "mean" ? "each replaced by its average over the text" : "each replaced by zeros"}):`),
    lossLines(s, offNames),
    inductionTable(s, labelOf),
    patterns(s, offNames, labelOf),
    predictions(s));
}

// The loss on the repeat and on every position, intact and switched off, and what rose.
function lossLines(s, offNames) {
  const line = (key, where) => {
    const v = s.loss[key];
    if (!v) return h("li", { "data-loss": key }, `${where}: this input repeats no token, so there is nothing for an induction head to copy.`);
    return h("li", { "data-loss": key }, `${where}: `, h("strong", { "data-run": "intact" }, nats(v.intact)), " nats intact → ",
      h("strong", { "data-run": "off" }, nats(v.off)), ` with ${offNames} off (`, h("span", { "data-run": "rise" }, signed(v.rise)), ")");
  };
  const rows = (key) => s.loss[key]?.rows ?? 0;
  const over = s.sequences > 1 ? h("p", { class: "note", id: "switch-sequences" }, `The losses are over all ${s.sequences} of the input's sequences; the tables below show the first.`) : null;
  return h("div", { id: "switch-loss" },
    h("ul", {}, line("repeat", `Loss on the repeat (the ${rows("repeat")} positions whose token appeared earlier, where copying what followed it helps)`),
      line("all", `Loss on every position (${rows("all")})`)), over,
    h("p", { class: "note" }, ...glossed("The loss is how surprised the model is by the real next token, in nats: lower is better; a rise means the model guesses worse without those heads.")));
}

// Each head's induction score in both runs, where either is at least SHOWN, largest change first.
function inductionTable(s, labelOf) {
  const rows = [];
  s.intact.induction.forEach((row, l) => row.forEach((was, k) => {
    const now = s.switched_off.induction[l][k];
    if (Math.max(was, now) >= SHOWN) rows.push({ l, k, was, now });
  }));
  rows.sort((x, y) => Math.abs(y.now - y.was) - Math.abs(x.now - x.was) || x.l - y.l || x.k - y.k);
  if (!rows.length) return h("p", { class: "note", id: "switch-induction" }, `No head has an induction score of ${SHOWN} or more in either run.`);
  return h("div", { class: "table-wrap", tabindex: "0", role: "region", "aria-label": "induction scores, intact and switched off" }, h("table", { id: "switch-induction" },
    h("caption", { class: "note" }, "Induction scores: the share of a head's attention on the token after an earlier copy of the current one"),
    h("thead", {}, h("tr", {}, h("th", {}, "head"), h("th", {}, "label"), h("th", { class: "num" }, "intact"), h("th", { class: "num" }, "switched off"))),
    h("tbody", {}, rows.slice(0, LISTED).map((r) => h("tr", { "data-head": `${r.l}.${r.k}` }, h("td", {}, `${r.l}.${r.k}`), h("td", {}, labelOf(r.l, r.k)),
      h("td", { class: "num" }, r.was.toFixed(2)), h("td", { class: "num" }, r.now.toFixed(2)))))));
}

// How far a head's pattern moved: the mean over queries of the weight that moved between keys.
function moved(s, l, k) {
  const a = s.intact.weights[l][k], b = s.switched_off.weights[l][k];
  let total = 0;
  a.forEach((row, i) => row.forEach((w, j) => { total += Math.abs(w - b[i][j]); }));
  return total / (2 * a.length);
}

// One head's pattern intact beside switched off, any head; first the induction head whose
// pattern moved most (what a previous-token head feeds), else the head that moved most.
function patterns(s, offNames, labelOf) {
  const choices = [];
  s.intact.weights.forEach((row, l) => row.forEach((_, k) => choices.push({ l, k, moved: moved(s, l, k) })));
  const largest = (list) => list.reduce((x, y) => (y.moved > x.moved ? y : x), list[0]);
  const most = largest(choices.filter((c) => labelOf(c.l, c.k) === "induction")) ?? largest(choices);
  const pick = h("select", { id: "switch-head" }, choices.map((c) => h("option", { value: `${c.l}.${c.k}` }, `${c.l}.${c.k} ${labelOf(c.l, c.k)} (moved ${c.moved.toFixed(2)})`)));
  pick.value = `${most.l}.${most.k}`;
  const box = h("div", { id: "switch-patterns" });
  const show = () => {
    const [l, k] = pick.value.split(".").map(Number);
    const heat = (w, title, name) => figure(null, { name, caption: title, data: { model: s.model, tokens: s.tokens, layer: l, head: k, off: s.off, weights: w },
      fit: { max: HEATMAP_WIDTH, draw: (room) => heatmap(w, s.tokens, { title, room }) } });
    clear(box, h("div", { class: "pair" },
      heat(s.intact.weights[l][k], `head ${l}.${k}, intact`, `switch-${l}-${k}-intact`),
      heat(s.switched_off.weights[l][k], `head ${l}.${k}, with ${offNames} off`, `switch-${l}-${k}-off`)));
  };
  pick.addEventListener("change", show);
  show();
  return h("div", {}, h("h4", {}, "A head's pattern, intact and switched off"),
    h("p", { class: "controls flow" }, h("label", { for: "switch-head" }, "head (how much of each query's weight moved)", pick)),
    colourLegend(), box);
}

// Each position's likeliest next token in both runs; a changed guess is in bold.
function predictions(s) {
  const top = (run, i) => run.predictions[i][0];
  const quoted = (t) => `"${t}"`;  // the token as the head viewer labels it, spaces seen
  const cell = (p) => `${quoted(p.token)} ${p.p.toFixed(2)}`;
  const rows = s.tokens.map((t, i) => {
    const was = top(s.intact, i), now = top(s.switched_off, i);
    const changed = was.id !== now.id;
    return h("tr", { "data-pos": String(i), "data-changed": changed ? "true" : null },
      h("td", { class: "num" }, String(i)), h("td", {}, quoted(t)), h("td", {}, i + 1 < s.tokens.length ? quoted(s.tokens[i + 1]) : "—"),
      h("td", {}, cell(was)), h("td", {}, changed ? h("strong", {}, cell(now)) : cell(now)));
  });
  const changed = rows.filter((r) => r.dataset.changed).length;
  return h("details", { class: "more", id: "switch-predictions", open: "" },
    h("summary", {}, `The likeliest next token at each position (${changed} of ${rows.length} changed, in bold)`),
    h("div", { class: "table-wrap", tabindex: "0", role: "region", "aria-label": "next-token guesses, intact and switched off" }, h("table", {},
      h("thead", {}, h("tr", {}, h("th", { class: "num" }, "#"), h("th", {}, "token"), h("th", {}, "next in the text"), h("th", {}, "intact guess (probability)"), h("th", {}, "switched off"))),
      h("tbody", {}, rows))));
}
