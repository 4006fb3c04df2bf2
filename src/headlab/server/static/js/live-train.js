// "Train it yourself": POST /api/live/induction starts a seeded run of the live recipe on the
// server and answers with server-sent events; the panel draws the losses, every head's scores and
// the patterns of the two heads that matter as they change, shades the phase change when the
// server detects it, and ends with the ablation verdict. The run stops if this page goes away.
// The knobs (seed, layers, heads, threads) and their ranges come from GET /api/live: the server
// states them once, validates requests against them, and the page builds its controls from that
// answer. The phase-change window is provisional while the run trains (a later evaluation can
// move it) and final only with the verdict; the run's last message (the server's sentence) says
// how long it took, on how many threads and why.
import { api } from "./api.js";
import { h, clear } from "./dom.js";
import { lineChart, heatmap, colourLegend, CHART_WIDTH } from "./figures.js";
import { figure, onWidth } from "./export.js";
import { circuitGraph, circuitNote, liveCircuit, CIRCUIT_WIDTH } from "./evidence-card.js";
import { glossed } from "./glossary.js";
import { hostRuns } from "./host.js";

// no "-0.00": a value that rounds to zero prints as 0
const fmt = (v, d = 3) => (Number.isFinite(v) ? (Math.abs(v) < 0.5 * 10 ** -d ? 0 : v).toFixed(d) : "—");
const DRAW_MS = 400;  // the live charts redraw at most this often

// One colour per thing across both live charts: the losses in black, green and purple; the
// induction heads of the last layer in blues, the previous-token heads of layer 0 in oranges
// (a shade per head), an ideal head in grey. No colour of one chart means another thing in the
// other (the phase-change window's shading is the one amber).
const LOSS_COLOURS = { train: "#000000", first: "#009E73", repeated: "#CC79A7" };
const IDEAL_COLOUR = "#9aa3b5";
const ramp = (hue, k, n) => `hsl(${hue}, 75%, ${Math.round(28 + (n > 1 ? (k / (n - 1)) * 36 : 0))}%)`;
const inductionColour = (k, n) => ramp(210, k, n);
const prevTokenColour = (k, n) => ramp(18, k, n);

function field(id, label, control) {
  return h("label", { for: id }, label, control);
}

// One control per knob the server offers: a number input for a range, a select for choices.
function knobControl(name, knob) {
  const id = `live-${name.replace(/^n_/, "")}`;  // live-seed, live-layers, live-heads, live-threads
  const control = knob.choices
    ? h("select", { id, name }, knob.choices.map((c) => h("option", { value: String(c.value), selected: c.value === knob.default }, c.text)))
    : h("input", { id, name, type: "number", min: knob.min, max: knob.max, step: 1, value: knob.default });
  control.title = knob.help;
  return [control, field(id, knob.label, control), knob];
}

// The value a control sends, typed as the server offered it ("auto" stays a string, 2 a number).
function knobValue(control, knob) {
  if (!knob.choices) return Number(control.value);
  const chosen = knob.choices.find((c) => String(c.value) === control.value);
  return chosen ? chosen.value : control.value;
}

// Server-sent events from a fetch() body: "event: NAME\ndata: JSON\n\n" frames.
async function* sseEvents(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let name = "message", data = null;
      for (const line of frame.split("\n")) {
        if (line.startsWith("event: ")) name = line.slice(7);
        else if (line.startsWith("data: ")) data = JSON.parse(line.slice(6));
      }
      if (data !== null) yield [name, data];
    }
  }
}

export async function initLiveTrain(root) {
  if (!hostRuns("routes", "live/induction")) {  // a static site trains nothing: it says so, once
    clear(root, h("p", { class: "note", id: "live-host-note" }, "Training a fresh model while you watch needs `headlab serve`, which trains it on your machine; this static site shows the stored run above."));
    return;
  }
  let knobs, auto;
  try {
    ({ knobs, auto } = await api("/api/live"));
  } catch (err) {
    clear(root, h("p", { class: "error" }, `Could not load the live panel: ${err.message}`));
    return;
  }
  const controls = Object.fromEntries(Object.entries(knobs).map(([name, knob]) => [name, knobControl(name, knob)]));
  if (controls.threads && auto) {  // what auto would pick now, beside the picker
    controls.threads[0].title = `${knobs.threads.help}. Now: ${auto.threads} (${auto.threads_why}).`;
  }
  const train = h("button", { type: "submit", id: "live-train" }, "Train");
  const cancel = h("button", { type: "button", id: "live-cancel", disabled: true }, "Cancel");
  const form = h("form", { id: "live-form", "aria-label": "train an induction model", novalidate: true },
    h("div", { class: "controls flow" }, Object.values(controls).map(([, label]) => label)),
    h("p", {}, train, " ", cancel));
  const status = h("p", { class: "note", id: "live-status", role: "status", "aria-live": "polite" }, "Press Train: the server trains a fresh model while you watch.");
  const phase = h("p", { id: "live-phase", class: "verdict", hidden: true });
  const losses = h("div", { id: "live-losses", class: "live-chart" });
  const scores = h("div", { id: "live-scores", class: "live-chart" });
  const patterns = h("div", { id: "live-patterns" });
  const circuitBox = h("div", { id: "live-circuit" });
  const verdict = h("div", { id: "live-verdict", "aria-live": "polite" });
  const stale = h("p", { class: "stale-note", id: "live-stale", hidden: true });
  const results = h("div", { id: "live-results" }, phase, losses, scores, patterns, circuitBox, verdict);
  root.append(h("div", { class: "widget-box" }, form, status, stale, results));

  let state = null;
  let pending = false;
  let drawnAt = 0;
  // the charts are drawn to the panel's width (at most CHART_WIDTH), so that their text keeps
  // its size on a phone rather than shrinking with a wider drawing; again when the width changes
  let chartWidth = CHART_WIDTH;
  onWidth(losses, (room) => {
    const next = Math.min(CHART_WIDTH, Math.floor(room));
    if (next === chartWidth) return;
    chartWidth = next;
    if (state) { state.drawn.evals = -1; draw(state); }
  });

  // the knobs a run was started with; a run drawn under knobs changed since is marked as such
  const knobValues = () => JSON.stringify(Object.entries(controls).map(([name, [control, , knob]]) => [name, knobValue(control, knob)]));
  const markStale = () => {
    const changed = Boolean(state?.evals.length) && state.knobs !== knobValues();
    results.classList.toggle("stale", changed);
    stale.hidden = !changed;
    stale.textContent = changed ? `The charts below are of run ${state.runId}, trained with the settings it was started with, not the ones above: press Train to train with these.` : "";
  };
  form.addEventListener("input", markStale);
  form.addEventListener("change", markStale);

  // evaluations redraw, at most one drawing per DRAW_MS: the browser shares the CPU with the
  // server's training run (on two cores, redrawing every chart on every event cost the run 2-3 s)
  const redraw = () => {
    if (pending) return;
    pending = true;
    const wait = Math.max(0, DRAW_MS - (performance.now() - drawnAt));
    setTimeout(() => requestAnimationFrame(() => { pending = false; drawnAt = performance.now(); draw(state); }), wait);
  };

  const draw = (st) => {
    if (!st || !st.evals.length) return;
    const shade = st.phase?.found ? st.phase.window : null;
    const line = (key, name, colour, dashed = false) => ({ name, colour, dashed, points: st.evals.map((e) => [e.step, e[key]]) });
    const lossSeries = [
      { name: "training loss", colour: LOSS_COLOURS.train, points: st.steps },
      line("first_copy_loss", "first copy", LOSS_COLOURS.first),
      line("repeated_loss", "repeated copy", LOSS_COLOURS.repeated, true),
    ].filter((sr) => sr.points.length);
    const l = lineChart(lossSeries, { title: "Loss on a probe's first and repeated copy", xLabel: "step", yLabel: "loss (nats)", shade, width: chartWidth });
    clear(losses, l.svg, l.legend);
    losses.dataset.step = String(st.evals.at(-1).step);
    losses.dataset.points = String(st.evals.length);
    // the server trains on the same machine: redraw the scores and the patterns only when an
    // evaluation brought new ones (a step event changes the training loss alone)
    if (st.drawn.evals !== st.evals.length || st.drawn.phase !== shade?.join()) drawScores(st, shade);
    if (st.patterns && st.drawn.patternStep !== st.patternStep) drawPatterns(st);
    if (st.circuit && st.drawn.circuit !== st.circuit) drawCircuit(st);
    showPhase(st);
  };

  // The window as the detector sees it so far: each evaluation can still move it, so it is
  // marked provisional until the verdict, which states the final one (or that none was found).
  const showPhase = (st) => {
    if (!st.phase?.found && !st.final) return;
    phase.hidden = false;
    phase.dataset.state = st.final ? "final" : st.stopped ? "unfinished" : "provisional";
    if (!st.phase?.found) {
      phase.textContent = "No phase change found in this run (final).";
      return;
    }
    // seconds of training (the server's clock) to the evaluation that ends the window
    const end = st.evals.find((r) => r.step === st.phase.window[1]);
    const when = end && Number.isFinite(end.wall) ? `, over ${end.wall.toFixed(1)} s after training started` : "";
    const steps = `steps ${st.phase.window[0]}–${st.phase.window[1]} (steepest at step ${st.phase.step})${when}`;
    phase.textContent = st.final ? `Phase change (final): ${steps}.`
      : st.stopped ? `Phase change so far: ${steps}; the run stopped before its end, so this window is not final.`
      : `Phase change so far: ${steps}; may still move until the run ends.`;
  };

  const drawScores = (st, shade) => {
    st.drawn.evals = st.evals.length;
    st.drawn.phase = shade?.join();
    const last = st.evals.at(-1).induction.length - 1;
    const perHead = (key, layer, label, colour) => st.evals[0][key][layer].map((_, k, all) => ({
      name: `${label} ${layer}.${k}`, dashed: key === "prev_token", colour: colour(k, all.length),
      points: st.evals.map((e) => [e.step, e[key][layer][k]]),
    }));
    const headSeries = [...perHead("induction", last, "induction", inductionColour), ...perHead("prev_token", 0, "previous-token", prevTokenColour)];
    headSeries.push({ name: "ideal induction head", dashed: true, colour: IDEAL_COLOUR, points: st.evals.map((e) => [e.step, st.ceiling]) });
    const sc = lineChart(headSeries, { title: `Induction score of layer ${last}'s heads, previous-token score of layer 0's`, xLabel: "step", yLabel: "score", shade, width: chartWidth });
    clear(scores, sc.svg, sc.legend);
    scores.dataset.points = String(st.evals.length);
  };

  const drawPatterns = (st) => {
    st.drawn.patternStep = st.patternStep;
    const tokens = st.tokens.map(String);
    const { induction, prev_token: prev } = st.patterns;
    // on a narrow screen each pattern gets the panel's width (the pair stacks); else its own size
    const room = patterns.clientWidth && patterns.clientWidth < 520 ? patterns.clientWidth : null;
    clear(patterns, colourLegend(), h("div", { class: "pair" },
      // the whole context at once: the copy and its source are both in view
      heatmap(induction.weights, tokens, { title: `best induction head ${induction.head}, step ${st.patternStep}`, window: tokens.length, room }),
      heatmap(prev.weights, tokens, { title: `best previous-token head ${prev.head}, step ${st.patternStep}`, window: tokens.length, room })));
  };

  // The induction circuit as the weights have it at the last evaluation (K-composition of
  // layer 0's heads into the last layer's), confirmed at the end by the run's ablations.
  const drawCircuit = (st) => {
    st.drawn.circuit = st.circuit;
    const c = liveCircuit(st.circuit, st.circuit.record, st.verdict);
    const title = `the induction circuit at step ${st.circuit.record.step} (K-composition, layer 0 → layer ${st.circuit.to_layer})`;
    clear(circuitBox, figure(null, { name: "live-circuit", caption: title, data: c,
      fit: { max: CIRCUIT_WIDTH, draw: (width) => circuitGraph(c, { width }) } }), h("p", { class: "note", id: "live-circuit-note" }, ...glossed(circuitNote(c))));
    circuitBox.dataset.step = String(st.circuit.record.step);
  };

  const finish = (text, error = false) => {
    status.textContent = text;
    status.classList.toggle("error", error);
    train.disabled = false;
    cancel.disabled = true;
    root.dataset.state = "idle";
  };

  const showVerdict = (v) => {
    const final = v.final;
    const rows = final.induction.flatMap((layer, l) => layer.map((ind, k) => h("tr", { "data-head": `${l}.${k}` },
      h("td", {}, `${l}.${k}`), h("td", { class: "num" }, fmt(ind)), h("td", { class: "num" }, fmt(final.prev_token[l][k])),
      h("td", { class: "num" }, fmt(v.ablation_effect[`${l}.${k}`], 2)))));
    const table = h("div", { class: "table-wrap" }, h("table", { id: "live-final" },
      h("caption", { class: "note" }, `Final scores (ideal induction head: ${fmt(v.induction_ceiling)}); ablation: share of the in-context gain lost when the head is masked`),
      h("thead", {}, h("tr", {}, h("th", {}, "head"), h("th", { class: "num" }, "induction"), h("th", { class: "num" }, "previous-token"), h("th", { class: "num" }, "ablation"))),
      h("tbody", {}, rows)));
    clear(verdict, h("p", { id: "live-verdict-text", class: v.verdict.circuit ? "verdict" : null }, v.verdict.text), table);
    verdict.dataset.final = JSON.stringify({ induction: final.induction, prev_token: final.prev_token, phase_change: v.phase_change, seconds: v.phase_change_seconds });
  };

  const handle = (name, e) => {
    if (name === "run") {
      state.runId = e.run_id;
      root.dataset.run = e.run_id;
      root.dataset.threads = String(e.threads);
      const unit = e.threads === 1 ? "thread" : "threads";
      status.textContent = `Run ${e.run_id}: ${e.n_layers} layer(s), ${e.n_heads} heads, seed ${e.seed}, ${e.recipe.steps} steps on the server, on ${e.threads} torch ${unit} (${e.threads_why})…`;
    } else if (name === "start") {
      state.tokens = e.tokens;
      state.ceiling = e.ceiling;
      state.total = e.total;
    } else if (name === "step") {
      state.steps.push([e.step, e.loss]);
      status.textContent = `Run ${state.runId}: step ${e.step} of ${state.total}, training loss ${fmt(e.loss)}`;  // drawn with the next evaluation
    } else if (name === "eval") {
      state.evals.push(e);
      state.phase = e.phase_change;
      if (e.patterns) { state.patterns = e.patterns; state.patternStep = e.step; }
      if (e.circuit?.k?.length) state.circuit = { ...e.circuit, record: e };
      redraw();
    } else if (name === "verdict") {
      state.phase = e.phase_change;
      state.final = true;
      state.verdict = e;
      if (state.circuit) state.circuit = { ...state.circuit };  // redrawn with the ablations' answer
      draw(state);
      showPhase(state);
      showVerdict(e);
    } else if (name === "done") {
      finish(e.text || `Run ${state.runId} finished: ${state.total} steps.`);
    } else if (name === "stopped") {
      state.stopped = true;  // a window seen so far is no result
      showPhase(state);
      finish(e.text || `Run ${state.runId} stopped: ${e.reason}.`);
    } else if (name === "error") {
      finish(`Run ${state.runId} failed: ${e.detail}`, true);
    }
  };

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    state = { runId: null, steps: [], evals: [], phase: null, final: false, stopped: false, patterns: null, tokens: [], ceiling: null, total: 0,
      drawn: { evals: 0, phase: undefined, patternStep: null, circuit: null }, circuit: null, verdict: null };
    clear(losses); clear(scores); clear(patterns); clear(circuitBox); clear(verdict);
    const body = Object.fromEntries(Object.entries(controls).map(([name, [control, , knob]]) => [name, knobValue(control, knob)]));
    state.knobs = knobValues();
    markStale();
    phase.hidden = true;
    delete phase.dataset.state;
    train.disabled = true;
    root.dataset.state = "running";
    status.classList.remove("error");
    status.textContent = "Starting…";
    let response;
    try {
      response = await fetch("/api/live/induction", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
    } catch (err) {
      finish(`The server does not answer (${err.message}).`, true);
      return;
    }
    if (!response.ok) {
      let detail = response.statusText;
      try { detail = (await response.json()).detail; } catch { /* keep the status text */ }
      finish(`Not started: ${detail}`, true);
      return;
    }
    cancel.disabled = false;
    try {
      for await (const [name, data] of sseEvents(response)) handle(name, data);
      if (root.dataset.state === "running") finish(`Run ${state.runId} ended without a result.`, true);
    } catch (err) {
      finish(`The stream broke off (${err.message}).`, true);
    }
  });

  cancel.addEventListener("click", async () => {
    if (!state?.runId) return;
    cancel.disabled = true;
    try {
      await api(`/api/live/runs/${state.runId}`, undefined, "DELETE");
    } catch (err) {
      status.textContent = `Cancel failed: ${err.message}`;
    }
  });
}
