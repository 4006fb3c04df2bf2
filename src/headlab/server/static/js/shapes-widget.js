// Widget 1: the shape and parameter calculator. Every value shown is the ShapeReport that
// POST /api/shapes returns from tracing the real layer.
import { api, refusal, quoted } from "./api.js";
import { h, clear, debounce, fmtInt, fmtBytes, fmtCompact } from "./dom.js";
import { glossed } from "./glossary.js";
import { barChart, BAR_WIDTH } from "./bars.js";
import { figure } from "./export.js";
import { layerDiagram } from "./layer-diagram.js";
import { kvFigures } from "./kv-figures.js";
import { hostIsStatic, hostRuns } from "./host.js";

const FIELDS = [
  ["d_model", "d_model (width)", 512],
  ["n_heads", "h (query heads)", 8],
  ["n_kv_heads", "h_kv (key/value heads; empty = h)", ""],
  ["seq_len", "n (tokens)", 10],
  ["batch", "B (batch)", 2],
  ["cache_len", "tokens already cached", 0],
  ["d_k", "d_k (head width; empty = d_model / h)", ""],
];
const OPTIONAL = new Set(["n_kv_heads", "d_k"]);  // an empty box: the server's default
const KV_FIELDS = new Set(["cache_len"]);  // asked in the KV cache's fold, not beside the layer's sizes
// the ranges and dtypes are the server's (GET /api/shapes/limits), set once they arrive
function numberInput(key, label, value) {
  return h("label", { for: `shapes-${key}` }, label,
    h("input", { id: `shapes-${key}`, name: key, type: "number", step: 1, value, inputmode: "numeric" }));
}

function applyLimits(form, limits) {
  if (!limits?.sizes) return;
  for (const [key] of FIELDS) {
    const range = limits.sizes[key];
    if (range) Object.assign(form.elements[key], { min: range[0], max: range[1] });
  }
  clear(form.elements.dtype, limits.dtypes.map((d) => h("option", { value: d }, d)));
}

// What a size must be, in the page's words: "h (query heads) must be a whole number from 1
// to 65,536", from the limits the server serves (GET /api/shapes/limits).
function sizeRule(key, limits) {
  const label = FIELDS.find(([k]) => k === key)[1];
  const range = limits?.sizes?.[key];
  const within = range ? ` from ${fmtInt(range[0])} to ${fmtInt(range[1])}` : "";
  return `${label} must be ${OPTIONAL.has(key) ? "empty or " : ""}a whole number${within}`;
}

// The request body, or the first size that is not valid, said in words: nothing the server
// would refuse is sent (a cleared box is not 0).
function readForm(form, limits) {
  const body = {};
  for (const [key] of FIELDS) {
    const raw = form.elements[key].value.trim();
    if (raw === "" && OPTIONAL.has(key)) continue;
    const v = Number(raw);
    const range = limits?.sizes?.[key];
    if (raw === "" || !Number.isInteger(v) || (range && (v < range[0] || v > range[1]))) {
      return { error: `${sizeRule(key, limits)}; ${raw === "" ? "the box is empty" : `“${raw}” is not`}.` };
    }
    body[key] = v;
  }
  if (form.elements.dtype.value) body.dtype = form.elements.dtype.value;  // else the server's default
  body.bias = form.elements.bias.checked;
  return { body };
}

// A size the server refused after all (its limits changed since the page asked): that size's
// rule, with the bound the server quotes.
function refusedSize(err, limits) {
  const said = {};
  for (const [key, label] of FIELDS) {
    said[key] = (item) => {
      const n = quoted(item);
      if (n === null) return `${sizeRule(key, limits)}.`;
      return `${label} must be ${/less/.test(item.type) ? "at most" : "at least"} ${fmtInt(n)} on this server.`;
    };
  }
  return refusal(err, said);
}

function problemsBox(report, form, update) {
  const box = h("div", { class: "problems", id: "shapes-problems" }, h("strong", {}, "This configuration does not work:"),
    h("ul", {}, report.problems.map((p) => h("li", {}, p))));
  const counts = report.valid_head_counts || [];
  // "d_model=… is not divisible by n_heads=…" blames h; a bad h_kv names n_heads too, as the dividend
  if (report.problems.some((p) => /by n_heads\b|^n_heads must/.test(p)) && counts.length) {
    box.append(h("p", {}, `Valid head counts for d_model = ${fmtInt(report.config.d_model)} (pick one):`),
      h("div", { class: "chips", id: "shapes-valid-heads" }, counts.slice(0, 64).map((c) => h("button", {
        type: "button", class: "chip", "data-heads": c,
        onclick: () => { form.elements.n_heads.value = c; update(); form.elements.n_heads.focus(); },
      }, String(c)))));
  }
  const kvCounts = report.valid_kv_head_counts || [];
  if (report.problems.some((p) => /\bn_kv_heads\b/.test(p)) && kvCounts.length) {
    box.append(h("p", {}, `Valid key/value head counts for h = ${fmtInt(report.config.n_heads)} (pick one):`),
      h("div", { class: "chips", id: "shapes-valid-kv-heads" }, kvCounts.slice(0, 64).map((c) => h("button", {
        type: "button", class: "chip", "data-kv-heads": c,
        onclick: () => { form.elements.n_kv_heads.value = c; update(); form.elements.n_kv_heads.focus(); },
      }, String(c)))));
  }
  return box;
}

// "4" for 4.0, "2.67" for 8/3: how many times the MHA cache is larger than this one
const times = (ratio) => (Number.isInteger(ratio) ? String(ratio) : ratio.toPrecision(3));

const fact = (value, label, id) => h("div", { class: "fact", id }, h("b", {}, value), h("span", {}, glossed(label)));

// the layer's own numbers: what §2 shows open
function facts(report) {
  const biases = report.config.bias ? "with biases" : "no biases";
  return h("div", { class: "facts" },
    fact(fmtInt(report.params.total), `parameters in the layer (W_Q, W_K, W_V, W_O, ${biases})`, "shapes-params-total"),
    fact(`${fmtCompact(report.flops.total)}FLOP`, `per forward pass; ${(100 * report.flops.n2_share).toFixed(1)}% in the n·s products QKᵀ and A·V`, "shapes-flops"),
    fact(fmtBytes(report.memory.n2_bytes), "held by the attention pattern (scores + weights)", "shapes-n2"),
  );
}

// the KV cache at these sizes, inside the fold §2 keeps closed (§9 explains the cache)
function kvFacts(report) {
  const kv = report.kv_cache || {};
  return h("div", { class: "facts" },
    fact(fmtBytes(report.kv_cache_bytes), `KV cache for B·s tokens (${fmtBytes(kv.bytes_per_token ?? 0)} per token${kv.ratio_vs_mha > 1 ? `; ${times(kv.ratio_vs_mha)}× smaller than MHA` : ""})`, "shapes-kv"));
}

export function stageTable(report) {
  return h("div", { class: "table-wrap" }, h("table", { id: "shapes-table" },
    h("caption", { class: "note" }, "Every tensor of the forward pass, in order (shaded rows grow with n·s)"),
    h("thead", {}, h("tr", {}, h("th", {}, "stage"), h("th", {}, "symbolic"), h("th", {}, "shape"), h("th", { class: "num" }, "elements"), h("th", { class: "num" }, "memory"))),
    h("tbody", {}, report.stages.map((st) => h("tr", { class: st.n2 ? "n2" : null, "data-stage": st.name },
      h("td", {}, st.label), h("td", { class: "shape" }, st.symbolic), h("td", { class: "shape" }, `(${st.shape.join(", ")})`),
      h("td", { class: "num" }, fmtInt(st.elements)), h("td", { class: "num" }, fmtBytes(st.bytes)))))));
}

function paramTable(report) {
  return h("div", { class: "table-wrap" }, h("table", { id: "shapes-param-table" },
    h("caption", { class: "note" }, "Parameters per matrix, as the real module holds them (nn.Linear stores out × in)"),
    h("thead", {}, h("tr", {}, h("th", {}, "tensor"), h("th", {}, "symbolic"), h("th", {}, "shape"), h("th", { class: "num" }, "count"))),
    h("tbody", {}, report.param_tensors.map((p) => h("tr", {}, h("td", {}, p.name), h("td", { class: "shape" }, p.symbolic),
      h("td", { class: "shape" }, `(${p.shape.join(", ")})`), h("td", { class: "num" }, fmtInt(p.count)))),
    h("tr", { class: "total" }, h("td", { colspan: 3 }, h("strong", {}, "total")), h("td", { class: "num" }, h("strong", {}, fmtInt(report.params.total)))))));
}

function scaleChart(report) {
  const items = report.stages.map((st) => ({ label: st.label, value: st.elements, colour: st.n2 ? "#CC79A7" : "#0072B2" }));
  const c = report.config;
  const title = `Elements per stage, to scale (d_model ${c.d_model}, h ${c.n_heads}, n ${c.seq_len}, B ${c.batch})`;
  const draw = (width) => barChart(items, { title, format: fmtCompact, width });
  return figure(null, { name: "shapes-diagram", caption: "Block diagram: each bar's length is proportional to the tensor's element count", data: report, fit: { max: BAR_WIDTH, draw } });
}

// presetsAsked: the promise of GET /api/shapes/presets, which the page asks for once
export function initShapes(root, presetsAsked) {
  const form = h("form", { class: "controls", id: "shapes-form", "aria-label": "layer sizes", onsubmit: (e) => e.preventDefault() });
  const preset = h("select", { id: "shapes-preset", name: "preset" }, h("option", { value: "" }, "custom"));
  form.append(h("label", { for: "shapes-preset", class: "wide" }, "preset", preset));
  for (const [key, label, value] of FIELDS) if (!KV_FIELDS.has(key)) form.append(numberInput(key, label, value));
  form.append(h("label", { for: "shapes-dtype" }, "dtype", h("select", { id: "shapes-dtype", name: "dtype" })));
  form.append(h("label", { class: "inline", for: "shapes-bias" }, h("input", { id: "shapes-bias", name: "bias", type: "checkbox", checked: true }), "biases"));
  const out = h("div", { id: "shapes-output", "aria-live": "polite" });
  // The KV cache comes seven sections later (§9): here it is one click away, closed. Its one
  // size, the tokens already cached, stays a field of the form (form="shapes-form").
  const kvSizes = h("div", { class: "controls" }, FIELDS.filter(([key]) => KV_FIELDS.has(key)).map(([key, label, value]) => {
    const field = numberInput(key, label, value);
    field.querySelector("input").setAttribute("form", "shapes-form");
    return field;
  }));
  const kvOut = h("div", { id: "shapes-kv-output", "aria-live": "polite" });
  const kvFold = h("details", { class: "more", id: "shapes-kv-fold" },
    h("summary", {}, "Memory while generating, at these sizes (§9 explains it)"),
    h("p", { class: "note" }, glossed("The KV cache: the keys and values a generating model keeps of past tokens, and how many tokens it already holds.")),
    kvSizes, kvOut);
  const sources = new Map();  // the code of each linked function, asked for once
  const fetchCode = (name) => {
    if (!sources.has(name)) sources.set(name, api(`/api/code/${encodeURIComponent(name)}`));
    return sources.get(name);
  };
  // the diagram marks the shape table's rows of the step it shows
  const onStep = (stages) => out.querySelectorAll("#shapes-table tr[data-stage]").forEach((tr) => tr.classList.toggle("current", stages.includes(tr.dataset.stage)));
  const layer = layerDiagram({ fetchCode, onStep });
  layer.root.hidden = true;
  root.append(h("div", { class: "widget-box" }, form, layer.root, out, kvFold));

  let seq = 0;
  let presets = {};
  const kvState = {};  // the KV figures' window, sinks and position, kept across reports
  let limits = null;
  const update = async () => {
    const mine = ++seq;
    const { body, error } = readForm(form, limits);
    // sizes refused leave no diagram of the sizes before them
    if (error) { layer.root.hidden = true; clear(kvOut); clear(out, h("div", { class: "problems", id: "shapes-problems", role: "alert" }, error)); return; }
    try {
      const report = await api("/api/shapes", body);
      if (mine !== seq) return;
      layer.root.hidden = !report.valid;
      if (!report.valid) { clear(kvOut); clear(out, problemsBox(report, form, update)); return; }
      clear(out, h("p", { class: "verdict", id: "shapes-verdict" }, report.verdict),
        report.warnings.length ? h("div", { class: "problems" }, report.warnings.join(" ")) : null,
        facts(report), stageTable(report),
        h("details", { class: "more" }, h("summary", {}, "Each tensor to scale, and each parameter matrix"), scaleChart(report), paramTable(report)));
      clear(kvOut, kvFacts(report), kvFigures(report, kvState));
      layer.update(report);
    } catch (err) {
      if (mine !== seq) return;
      layer.root.hidden = true;
      clear(kvOut);
      clear(out, h("div", { class: "problems", id: "shapes-problems" }, refusedSize(err, limits)));
    }
  };
  const later = debounce(update, 120);
  form.addEventListener("input", (e) => { if (e.target !== preset) { preset.value = ""; later(); } });
  kvSizes.addEventListener("input", () => { preset.value = ""; later(); });
  preset.addEventListener("change", () => {
    const p = presets[preset.value];
    if (!p) return;
    form.elements.d_model.value = p.d_model;
    form.elements.n_heads.value = p.n_heads;
    form.elements.n_kv_heads.value = p.n_kv_heads ?? "";
    form.elements.d_k.value = p.d_k ?? "";
    form.elements.seq_len.value = p.context;
    Object.assign(kvState, { preferredWindow: p.window ?? null, window: p.window ?? null, t: null });
    form.elements.batch.value = 1;
    form.elements.bias.checked = p.bias;
    update();
  });
  presetsAsked.then((all) => {
    presets = { ...presets, ...all };
    preset.append(h("optgroup", { label: "published models" }, Object.entries(all).map(([name, p]) => h("option", { value: name }, p.title || name))));
  }).catch(() => {});
  // the models this host runs: their sizes read from each model's config (a static copy of the
  // page runs its manifest's models in the browser; the server's others are named apart)
  api("/api/models/sizes").then((sizes) => {
    const all = Object.entries(sizes);
    if (!all.length) return;
    for (const [name, z] of all) presets[`model:${name}`] = { ...z, title: name };
    const kvText = (z) => (z.n_kv_heads && z.n_kv_heads < z.n_heads ? `, h_kv ${z.n_kv_heads}` : "");
    const group = (label, models) => (models.length ? h("optgroup", { label }, models.map(([name, z]) => h("option", { value: `model:${name}`, title: `${z.n_layers} layers${z.d_k ? `, heads ${z.d_k} wide` : ""}` },
      `${name}: d_model ${z.d_model}, h ${z.n_heads}${kvText(z)}`))) : null);
    if (!hostIsStatic()) { preset.append(group("models on this server (their own sizes)", all)); return; }
    const here = all.filter(([name]) => hostRuns("models", name));
    const there = all.filter(([name]) => !hostRuns("models", name));
    preset.append(...[group("models on this page (their own sizes)", here), group("models `headlab serve` runs (their own sizes)", there)].filter(Boolean));
  }).catch(() => {});
  api("/api/shapes/limits").then((got) => { limits = got; applyLimits(form, got); }).catch(() => {}).finally(update);
  return { update, form, layer };
}
