// Draws an experiment's shipped results (GET /api/experiments/NAME). Each known experiment has its
// own view; anything else gets its headline numbers and every per-step history as line charts.
import { h, clear, fmtCompact, fmtBytes, fmtInt } from "./dom.js";
import { barChart, matrix, BAR_WIDTH } from "./bars.js";
import { figure } from "./export.js";
import { pruneNote, gqaNote } from "./stored-notes.js";
import { retrieval, sinks } from "./long-context.js";
import { chart, table, verdictList } from "./stored-parts.js";

const isNum = (v) => typeof v === "number" && Number.isFinite(v);
const pretty = (key) => String(key).replace(/_/g, " ");
const mean = (v) => (v && typeof v === "object" && "mean" in v ? v.mean : v);

// A {mean, std, values} spread over seeds as "0.812 ± 0.020 (3 seeds)".
function pm(v, digits = 3) {
  if (isNum(v)) return v.toFixed(digits);
  if (!v || !isNum(v.mean)) return "—";
  const n = Array.isArray(v.values) ? v.values.length : 0;
  return n > 1 ? `${v.mean.toFixed(digits)} ± ${(v.std ?? 0).toFixed(digits)}` : v.mean.toFixed(digits);
}

// A bar chart drawn to the width of its figure.
function bars(items, opts, { name, data }) {
  return figure(null, { name, caption: opts.title, data, fit: { max: BAR_WIDTH, draw: (width) => barChart(items, { ...opts, width }) } });
}

function seedsNote(r) {
  const n = Array.isArray(r.seeds) ? r.seeds.length : 1;  // a list of seeds or of per-seed summaries
  return `${r.quick ? "Quick run" : "Full run"}, ${n} seed${n > 1 ? "s" : ""}${isNum(r.wall_seconds) ? `, ${r.wall_seconds.toFixed(0)} s on this kind of CPU` : ""}.`;
}

const layers = (n) => `${n} layer${n === 1 ? "" : "s"}`;  // said in words: "1L" was never defined

function oneVsMany(name, r) {
  const rows = r.summary || [];
  const kinds = new Set(rows.map((row) => row.model));
  const legend = ["heads", "one", "wide"].every((k) => kinds.has(k))
    ? h("p", { class: "note keep" }, "heads: h heads of width d_model/h; one: a single head of width d_model (same parameters); wide: a single head wider than d_model (more parameters). The verb must agree in number with its subject; an attractor is a noun of the other number in between.")
    : null;
  const out = [legend, verdictList(r, "one-vs-many-verdict"), table("one-vs-many-table", ["model", "layers", "parameters", "accuracy, no attractor", "accuracy, attractor between"],
    rows.map((row) => [row.model, String(row.depth), fmtInt(row.params), pm(row.plain), pm(row.attractor)]))];
  const items = rows.flatMap((row) => [
    { label: `${row.model}, ${layers(row.depth)}, plain`, value: mean(row.plain), colour: "#0072B2" },
    { label: `${row.model}, ${layers(row.depth)}, attractor`, value: mean(row.attractor), colour: "#D55E00" },
  ]).filter((it) => isNum(it.value));
  if (items.length) {
    const title = "Held-out verb agreement accuracy (mean over seeds)";
    out.push(bars(items, { title, format: (v) => v.toFixed(3) }, { name: `${name}-accuracy`, data: rows }));
  }
  const ex = r.example;
  if (ex && Array.isArray(ex.attention)) {
    const readout = h("p", { class: "note", "aria-live": "polite" }, "Where each head looks from the verb slot, in one held-out sentence (hover for the weight):");
    const grid = h("div", { class: "matrices" });
    for (const a of ex.attention) {
      a.layers.forEach((weights, layer) => {
        const title = `${a.model}, ${a.depth} layer${a.depth > 1 ? "s" : ""}: layer ${layer}, from the verb slot`;
        const draw = (width) => matrix(weights, ex.tokens.slice(0, weights[0].length), weights.map((_, k) => `head ${k}`), { title, readout, width });
        grid.append(figure(null, { name: `${name}-${a.model}-${a.depth}-${layer}`, caption: title, data: { tokens: ex.tokens, weights }, fit: { max: 594, draw } }));
      });
    }
    out.push(readout, grid);
  }
  return out;
}

function headCount(name, r) {
  const rows = r.summary || [];
  const verdict = verdictList(r, "head-count-verdict");
  const keys = ["val_loss", "copy_loss", "fresh_loss"].filter((k) => rows.some((row) => isNum(mean(row[k]))));
  const series = keys.map((k) => ({ name: pretty(k), points: rows.map((row) => [row.h, mean(row[k])]) }));
  const out = [verdict];
  if (series.length) out.push(chart(`${name}-loss`, series, { title: "Validation loss against the number of heads (fixed d_model)", xLabel: "heads h", yLabel: "loss", logX: true }, rows));
  out.push(table("head-count-table", ["h", "d_k", ...keys.map(pretty)], rows.map((row) => [String(row.h), String(row.d_k), ...keys.map((k) => pm(row[k]))])));
  if (isNum(r.best_h)) out.push(h("p", {}, `Lowest validation loss at h = ${r.best_h}.`));
  const ref = r.reference;
  if (ref && Array.isArray(ref.rows)) {
    out.push(h("p", { class: "note" }, `Beside it, ${ref.paper}:`), table("head-count-reference", ref.columns, ref.rows.map((row) => row.map(String))));
  }
  return out;
}

function prune(name, r) {
  const out = [verdictList(r, "prune-verdict")];
  const pct = (v) => (v && isNum(v.mean) ? `${(100 * v.mean).toFixed(0)}%${v.values?.length > 1 ? ` ± ${(100 * v.std).toFixed(0)}` : ""}` : "—");
  const summary = Array.isArray(r.summary) ? r.summary : [];
  if (summary.length) {
    out.push(h("p", { class: "note" }, "Each cell: in order of importance / in random order (mean over seeds)."), table("prune-summary", ["model", "heads", "prunable, loss +1%", "prunable, loss +5%", "loss × at half pruned"],
      summary.map((row) => [row.model, String(row.heads ?? "—"),
        `${pct(row["prunable_1%_importance"])} / ${pct(row["prunable_1%_random_mean"])}`,
        `${pct(row["prunable_5%_importance"])} / ${pct(row["prunable_5%_random_mean"])}`,
        `${pm(row.half_pruned_rel_importance, 2)} / ${pm(row.half_pruned_rel_random_mean, 2)}`])));
  }
  const seen = new Set();
  for (const m of r.models || []) {
    if (seen.has(m.model)) continue;
    seen.add(m.model);
    const total = m.n_layers * m.n_heads;
    const curve = m.importance_curve?.losses || [];
    const removed = m.importance_curve?.removed || []; // heads gone at each loss (a large model is measured every few heads)
    const series = [{ name: "least important first", points: curve.map((v, k) => [removed[k] ?? k, v]) }];
    if (Array.isArray(m.random_mean_losses)) series.push({ name: "random order (mean)", points: m.random_mean_losses.map((v, k) => [removed[k] ?? k, v]), dashed: true });
    out.push(chart(`${name}-${m.model}`, series, { title: `${m.model}, seed ${m.seed ?? 0}: loss as heads are masked (${total} heads)`, xLabel: "heads pruned", yLabel: "loss" }, m, pruneNote(m)));
    if (Array.isArray(m.survivors) && m.survivors.length) {
      out.push(h("p", {}, "Pruned last (most important): ", m.survivors.map((sv) => `${sv.head} (${sv.label})`).join(", "), "."));
    }
  }
  for (const key of ["default_model", "minilm"]) if (typeof r[key] === "string") out.push(h("p", { class: "note" }, `${key === "minilm" ? "MiniLM" : "Shipped model"}: ${r[key]}`));
  if (r.reference) out.push(h("p", { class: "note" }, `Published: ${Object.values(r.reference).join("; ")}.`));
  return out;
}

function gqa(name, r) {
  const out = [verdictList(r, "gqa-verdict")];
  if (Array.isArray(r.kv_cache)) {
    out.push(table("gqa-kv-table", ["h_kv", "positions s", "cache held (measured)", "calculator", "smaller than MHA"],
      r.kv_cache.map((row) => [String(row.n_kv_heads), fmtInt(row.s), fmtBytes(row.measured), fmtBytes(row.calculator), `${Number(row.shrink_vs_mha).toFixed(1)}×`])));
  }
  if (Array.isArray(r.decode)) {
    const kvs = [...new Set(r.decode.map((row) => row.n_kv_heads))];
    const series = kvs.map((k) => ({ name: `h_kv = ${k}`, points: r.decode.filter((row) => row.n_kv_heads === k).map((row) => [row.context, row.ratio_vs_mha]) }));
    out.push(chart(`${name}-decode`, series, { title: "Decode speed with a KV cache, relative to MHA (same run)", xLabel: "context", yLabel: "tokens/s ÷ MHA's", logX: true }, r.decode, gqaNote(r)));
  }
  const q = r.quality;
  if (q && Array.isArray(q.by_kv)) {
    out.push(h("p", {}, `Quality (validation loss): MHA ${pm(q.mha)}; converted by mean-pooling K/V heads, then ${q.uptrain_steps} more steps (${Number((100 * q.uptrain_steps / q.steps).toPrecision(2))}% of ${q.steps}), against training with h_kv heads from scratch:`),
      table("gqa-quality-table", ["h_kv", "right after pooling", "after uptraining", "from scratch"], q.by_kv.map((row) => [String(row.n_kv_heads), pm(row.converted), pm(row.uptrained), pm(row.scratch)])));
  }
  return out;
}

function evals(history) {
  const rows = (Array.isArray(history) ? history : []).filter((row) => isNum(row.step));
  return rows.some((row) => row.kind) ? rows.filter((row) => row.kind === "eval") : rows;
}

function fact(value, label, key) {
  return h("div", { class: "fact", "data-key": key }, h("b", {}, value), h("span", {}, label));
}

const num3 = (v) => (isNum(v) ? (Number.isInteger(v) ? fmtInt(v) : v.toFixed(3)) : "—");

function induction(name, r) {
  const out = [];
  const list = (v) => (Array.isArray(v) ? v.join(", ") || "none" : "—");
  out.push(h("div", { class: "facts" },
    fact(num3(r.phase_change_step), `step of the phase change${isNum(r.phase_change_seconds) ? ` (${r.phase_change_seconds.toFixed(0)} s of training)` : ""}`, "phase_change_step"),
    fact(list(r.induction_heads), `induction heads (best score ${num3(r.final_induction_score)}${isNum(r.induction_ceiling) ? ` of at most ${num3(r.induction_ceiling)}` : ""})`, "induction_heads"),
    fact(list(r.prev_token_heads), "previous-token heads in the 2-layer model", "prev_token_heads"),
    fact(num3(r.control_max_induction_score), "1-layer control: its best induction score ever", "control_max_induction_score")));
  if (typeof r.verdict?.text === "string") out.push(h("p", { id: "induction-verdict", class: r.verdict.circuit ? "verdict" : null }, r.verdict.text));
  if (isNum(r.clean_repeated_loss) && isNum(r.ablate_feeders_repeated_loss)) {
    const feeders = (r.feeder_heads || []).map((f) => `${f.head} (previous-token score ${num3(f.prev_token_score)})`).join(", ");
    out.push(h("p", { id: "induction-ablation-summary" }, `Loss on the repeated half: ${num3(r.clean_repeated_loss)} (first half: ${num3(r.unrepeated_loss)}). `,
      `Masking the layer-0 head(s) that feed the induction head, ${feeders || "—"}, brings it to ${num3(r.ablate_feeders_repeated_loss)}; `,
      `masking the other layer-0 heads instead: ${num3(r.ablate_others_repeated_loss)}.`));
  }
  const rows = evals(r.history);
  const control = evals(r.control_history);
  const window = phaseWindow(r);
  if (rows.length > 1) {
    const line = (src, key, label, dashed = false) => ({ name: label, dashed, points: src.filter((row) => isNum(row[key])).map((row) => [row.step, row[key]]) });
    const losses = [line(rows, "first_copy_loss", "first copy"), line(rows, "repeated_loss", "repeated copy")];
    if (control.length > 1) losses.push(line(control, "repeated_loss", "repeated copy, 1-layer control", true));
    out.push(chart(`${name}-losses`, losses.filter((sr) => sr.points.length), { title: "Loss on repeated random tokens during training (phase change shaded)", xLabel: "step", yLabel: "loss (nats)", shade: window }, rows));
    const perHead = (key, layer, label) => {
      const first = rows.find((row) => Array.isArray(row[key]))?.[key]?.[layer] || [];
      return first.map((_, hd) => ({ name: `${label} ${layer}.${hd}`, points: rows.filter((row) => Array.isArray(row[key])).map((row) => [row.step, row[key][layer][hd]]) }));
    };
    const scores = [...perHead("induction", 1, "induction"), ...perHead("prev_token", 0, "previous-token")].slice(0, 16);
    if (scores.length) out.push(chart(`${name}-scores`, scores, { title: "Layer-1 induction scores and layer-0 previous-token scores per head", xLabel: "step", yLabel: "score", shade: window }, rows));
  }
  const ablation = r.ablation && typeof r.ablation === "object" ? Object.entries(r.ablation).filter(([, v]) => isNum(v)) : [];
  if (ablation.length) {
    const title = "Loss on the repeated copy with one head masked";
    out.push(bars(ablation.map(([k, v]) => ({ label: `head ${k}`, value: v })), { title, format: (v) => v.toFixed(3) }, { name: `${name}-ablation`, data: r.ablation }));
  }
  if (r.phase_change_consistency && Array.isArray(r.seeds) && r.seeds.length > 1) {
    out.push(h("p", {}, `Over ${r.seeds.length} seeds the phase change came at step ${pm(r.phase_change_consistency, 0)} (range ${r.phase_change_consistency.min}–${r.phase_change_consistency.max}).`));
  }
  return out;
}

// --- anything else: headline numbers and per-step histories ----------------------------------

function headline(results) {
  const facts = Object.entries(results).filter(([k, v]) => k !== "quick" && (isNum(v) || typeof v === "string"
    || (Array.isArray(v) && v.length <= 8 && v.every((x) => isNum(x) || typeof x === "string"))));
  if (!facts.length) return null;
  return h("div", { class: "facts" }, facts.slice(0, 12).map(([k, v]) => h("div", { class: "fact", "data-key": k },
    h("b", {}, Array.isArray(v) ? v.join(", ") : isNum(v) && !Number.isInteger(v) ? v.toPrecision(3) : isNum(v) ? fmtCompact(v) : String(v)), h("span", {}, pretty(k)))));
}

function historyKey(rows) {
  if (!Array.isArray(rows) || rows.length < 2 || typeof rows[0] !== "object" || rows[0] === null) return null;
  return ["step", "steps", "tokens"].find((k) => rows.every((row) => isNum(row[k]))) || null;
}

function phaseWindow(results) {
  const w = results.phase_change?.window || results.phase_change_window;
  if (Array.isArray(w) && w.length === 2 && w.every(isNum)) return w;
  if (w && isNum(w.start) && isNum(w.end)) return [w.start, w.end];
  return null;
}

function generic(name, results, path = []) {
  const out = path.length ? [] : [headline(results)];
  for (const [key, value] of Object.entries(results)) {
    const x = historyKey(value);
    if (x) {
      const fields = Object.keys(value[0]).filter((k) => k !== x && value.some((row) => isNum(row[k])));
      const groups = [fields.filter((k) => /loss/.test(k)), fields.filter((k) => !/loss/.test(k))].filter((g) => g.length);
      groups.forEach((group, gi) => {
        const title = `${pretty([...path, key].join(" "))}${groups.length > 1 ? (/loss/.test(group[0]) ? " (losses)" : " (scores)") : ""}`;
        const series = group.slice(0, 8).map((k) => ({ name: pretty(k), points: value.map((row) => [row[x], row[k]]) }));
        out.push(chart(`${name}-${key}-${gi}`, series, { title, xLabel: pretty(x), yLabel: /loss/.test(group[0]) ? "loss" : "value", shade: phaseWindow(results) }, value));
      });
    } else if (value && typeof value === "object" && !Array.isArray(value) && path.length < 2) {
      out.push(...generic(name, value, [...path, key]));
    }
  }
  return out;
}

const VIEWS = { "one-vs-many": oneVsMany, "head-count": headCount, prune, gqa, induction, retrieval, sinks };

export function renderExperiment(el, name, results) {
  const view = VIEWS[name] || generic;
  let parts;
  try {
    parts = view(name, results);
  } catch (err) {
    parts = [h("p", { class: "error" }, `These results have a shape this page does not know (${err.message}); the raw numbers follow.`), ...generic(name, results)];
  }
  const shown = parts.flat().filter(Boolean);
  const lead = shown.find((p) => p.tagName === "FIGURE") || null;  // the section's one figure
  const keep = shown.filter((p) => p.classList?.contains("keep"));  // what the figure needs to be read
  const rest = shown.filter((p) => p !== lead && !keep.includes(p));
  clear(el, stored(name, results), lead, keep,
    h("details", { class: "more", "data-more": name }, h("summary", {}, "The numbers behind it: verdicts, tables, seeds and thresholds"),
      h("p", { class: "note" }, `From headlab experiment ${name}. ${seedsNote(results)}`), rest));
}

// "stored run of `headlab experiment NAME`, N seeds, DATE": what made the figure, in plain words.
function stored(name, r) {
  const n = Array.isArray(r.seeds) ? r.seeds.length : 1;
  const date = typeof r.date === "string" ? r.date : "date not recorded";
  return h("p", { class: "provenance", "data-provenance": "stored" }, h("span", { class: "badge" }, "stored"),
    " stored run of ", h("code", {}, `headlab experiment ${name}${r.quick ? " --quick" : ""}`), `, ${n} seed${n > 1 ? "s" : ""}, ${date}`);
}
