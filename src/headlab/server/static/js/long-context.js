// The two long-context results: retrieval heads (Wu et al. 2024) and attention sinks in a
// streaming cache (Xiao et al. 2023), drawn from their stored runs, and a live look at one needle.
import { h, clear } from "./dom.js";
import { barChart, matrix, BAR_WIDTH } from "./bars.js";
import { figure } from "./export.js";
import { api } from "./api.js";
import { hostRuns } from "./host.js";
import { chart, table, verdictList } from "./stored-parts.js";

const isNum = (v) => typeof v === "number" && Number.isFinite(v);
const avg = (v) => v.reduce((a, b) => a + b, 0) / v.length;
const keep = (el) => { el.classList.add("keep"); return el; };

// "stored run: `headlab experiment NAME --ship`" under a figure: what made it and how to remake it.
function remake(name, r) {
  const command = typeof r.command === "string" ? r.command : `headlab experiment ${name}`;
  return h("p", { class: "note", "data-remake": name }, "Stored run, made by ", h("code", {}, command), isNum(r.wall_seconds) ? ` (${(r.wall_seconds / 60).toFixed(0)} min on 2 CPU cores).` : ".");
}

function stored(name, r, box) {
  box.append(remake(name, r));
  return keep(box);
}

function histogram(name, r) {
  const flat = (r.scores || []).flat().filter(isNum);
  const width = 0.05, bins = Math.max(1, Math.ceil(Math.max(...flat, 0.1) / width));
  const counts = Array.from({ length: bins }, () => 0);
  flat.forEach((v) => { counts[Math.min(bins - 1, Math.floor(v / width))] += 1; });
  const items = counts.map((c, k) => ({ label: `${(k * width).toFixed(2)}–${((k + 1) * width).toFixed(2)}`, value: c, colour: k * width >= 0.1 ? "#D55E00" : "#0072B2" }));
  const title = `Retrieval score of each of the ${flat.length} heads (orange: at or above 0.1, the retrieval label)`;
  return stored(name, r, figure(null, { name: `${name}-histogram`, caption: title, data: r.scores, fit: { max: BAR_WIDTH, draw: (w) => barChart(items, { title, width: w, format: (v) => String(v) }) } }));
}

function accuracyVsK(name, r) {
  const rows = r.masking?.by_k || [];
  const draws = Math.max(0, ...rows.map((row) => row.random?.length || 0));
  const series = [  // no mask first, so the lines that may coincide with it are drawn over it
    { name: "no head masked", points: rows.map((row) => [row.k, r.masking.none]), colour: "#000000", dashed: true },
    { name: "top-k retrieval heads masked", points: rows.map((row) => [row.k, row.top]), colour: "#D55E00" },
    { name: `k random heads masked (mean of ${draws} draws)`, points: rows.map((row) => [row.k, avg(row.random)]), dashed: true, colour: "#0072B2" },
    ...Array.from({ length: draws }, (_, d) => ({ name: `random draw ${d + 1}`, points: rows.filter((row) => isNum(row.random?.[d])).map((row) => [row.k, row.random[d]]), dashed: true })),
  ];
  const m = r.masking;
  const title = `Needle accuracy with k heads masked (${m.probes} probes of ${(m.lengths || []).join(" and ")} tokens)`;
  return stored(name, r, chart(`${name}-accuracy`, series, { title, xLabel: "heads masked k", yLabel: "accuracy" }, m));
}

function heat(name, r) {
  const g = r.heat;
  const caption = `Unmasked accuracy by needle depth (rows) and context length in tokens (columns), ${(r.seeds || []).length} seeds each`;
  const rows = g.accuracy, cols = g.lengths.map(String), labels = g.depths.map((d) => `depth ${d}`);
  return stored(name, r, figure(null, { name: `${name}-heat`, caption, data: g, fit: { max: 594, draw: (w) => matrix(rows, cols, labels, { title: "Accuracy", width: w }) } }));
}

export function retrieval(name, r) {
  const verdict = verdictList(r, "retrieval-verdict");
  const out = [accuracyVsK(name, r), verdict && keep(verdict)];
  out.push(histogram(name, r), heat(name, r), keep(needleLive(r)));
  const top = (r.top_heads || []).map((t) => [`${t.layer}.${t.head}`, t.score.toFixed(3)]);
  out.push(h("p", { class: "note" }, "The 16 heads with the highest retrieval score (layer.head), the ones masked first:"), table("retrieval-top-heads", ["head", "score"], top));
  out.push(table("retrieval-masking", ["k", "top-k masked", "random draws", "random heads masked"],
    (r.masking?.by_k || []).map((row) => [String(row.k), row.top.toFixed(2), row.random.map((v) => v.toFixed(2)).join(", "), row.random_heads.map((d) => d.map((x) => x.join(".")).join(" ")).join(" | ")])));
  return out;
}

// --- a live look at one needle -----------------------------------------------------------------

function needleLive(r) {
  if (!hostRuns("routes", "retrieval/needle")) {  // a static site runs no needle: it says so
    return h("p", { class: "note", id: "needle-host-note" }, "Hiding a number in a long text and asking the model for it runs on the server: it needs `headlab serve`.");
  }
  const storedTop = new Set((r.top_heads || []).map((t) => `${t.layer}.${t.head}`));
  const depth = h("select", { id: "needle-depth" }, [0, 0.25, 0.5, 0.75, 1].map((d) => h("option", { value: String(d), selected: d === 0.5 ? "" : null }, String(d))));
  const seed = h("input", { id: "needle-seed", type: "number", min: "0", max: "2147483647", step: "1", value: "0" });
  const out = h("div", { id: "needle-result", "aria-live": "polite" });
  const run = h("button", { type: "button", id: "needle-run" }, "Hide a number and ask for it");
  // an answer is of the depth and seed it was run with: changing either takes it away, and an
  // answer still on its way for the old ones is not drawn
  let runs = 0;
  const forget = () => { runs += 1; clear(out); };
  depth.addEventListener("change", forget);
  seed.addEventListener("input", forget);
  run.addEventListener("click", async () => {
    const mine = ++runs;
    run.disabled = true;
    clear(out, h("p", { class: "note" }, "Running the model on one needle…"));
    try {
      const found = await api("/api/retrieval/needle", { depth: Number(depth.value), seed: Number(seed.value) });
      if (mine === runs) clear(out, ...needleAnswer(found, storedTop));
    } catch (err) {
      if (mine === runs) clear(out, h("p", { class: "error" }, `The needle did not run: ${err.message}`));
    } finally {
      run.disabled = false;
    }
  });
  return h("div", { class: "needle-live" },
    h("p", { class: "provenance", "data-provenance": "live" }, h("span", { class: "badge" }, "live"), " computed now by headlab: one needle, the model's answer, and the heads that copied it"),
    h("div", { class: "controls" }, h("label", { for: "needle-depth" }, "Needle depth "), depth, " ", h("label", { for: "needle-seed" }, "Seed "), seed, " ", run), out);
}

function needleAnswer(f, storedTop) {
  const verdict = f.answered ? "repeated the number whole" : "did not repeat the number";
  const rows = f.top_heads.map((t) => [`${t.layer}.${t.head}`, t.score.toFixed(3), storedTop.has(`${t.layer}.${t.head}`) ? "yes" : "no"]);
  return [
    h("p", { id: "needle-summary" }, `${f.model}, ${f.length} tokens, needle at depth ${f.depth}: “${f.needle}”. Asked “${f.question}”, it wrote “${f.generated}”: it ${verdict}. `,
      `${f.above_threshold} of ${f.heads} heads reach 0.1 on this one probe.`),
    rows.length ? table("needle-heads", ["head", "retrieval score here", "among the stored run's top 16"], rows)
      : h("p", { class: "note" }, "No head's most-attended token was the digit being written."),
  ];
}

// --- attention sinks and a streaming cache --------------------------------------------------

function perplexity(name, r, m) {
  const windows = [...new Set(m.runs.map((run) => run.window))].sort((a, b) => a - b);
  const sinks = [...new Set(m.runs.map((run) => run.sinks))].sort((a, b) => a - b);
  const series = sinks.map((s) => ({ name: s === 0 ? "window only" : `${s} sink${s > 1 ? "s" : ""} + window`, dashed: s === 0,
    points: m.runs.filter((run) => run.sinks === s).sort((a, b) => a.window - b.window).map((run) => [run.window, run.ppl]) }));
  series.push({ name: "full cache", colour: "#000000", dashed: true, points: windows.map((w) => [w, m.full_cache.ppl]) });
  const title = `${m.model}: perplexity over ${m.tokens} tokens of held-out text (its context: ${m.context}) by cache window`;
  return stored(name, r, chart(`${name}-${m.model}-ppl`, series, { title, xLabel: "window w (tokens kept besides the sinks)", yLabel: "perplexity", logX: true }, m));
}

function sinkShare(name, r, m) {
  const items = m.sink_share.map((row) => ({ label: `layer ${row.layer}`, value: row.share }));
  const title = `${m.model}: share of each layer's heads whose mean weight on the first token exceeds 0.3 (Gu et al.)`;
  return stored(name, r, figure(null, { name: `${name}-${m.model}-share`, caption: title, data: m.sink_share, fit: { max: BAR_WIDTH, draw: (w) => barChart(items, { title, width: w, format: (v) => v.toFixed(2) }) } }));
}

export function sinks(name, r) {
  const models = Array.isArray(r.models) ? r.models : [];
  const out = [];
  models.forEach((m) => out.push(perplexity(name, r, m)));
  const verdict = verdictList(r, "sinks-verdict");
  out.push(verdict && keep(verdict));
  models.forEach((m) => out.push(sinkShare(name, r, m)));
  for (const m of models) {
    out.push(table(`sinks-${m.model}-table`, ["sinks s", "window w", "perplexity", "after the window fills"],
      m.runs.map((run) => [String(run.sinks), String(run.window), run.ppl.toFixed(1), isNum(run.ppl_after_fill) ? run.ppl_after_fill.toFixed(1) : "—"])));
  }
  if (typeof r.text === "string") out.push(h("p", { class: "note" }, `Held-out text: ${r.text}.`));
  return out;
}
