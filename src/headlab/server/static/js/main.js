// Entry point: wires each section of the page to the API.
import { api } from "./api.js";
import { h, clear, fmtInt, fmtBytes, fmtCompact, missing } from "./dom.js";
import { initShapes } from "./shapes-widget.js";
import { initHeads } from "./heads-widget.js";
import { initSwitchOff } from "./switch-off.js";
import { renderExperiment } from "./experiments.js";
import { initLiveTrain } from "./live-train.js";
import { setHost } from "./host.js";

const status = document.getElementById("server-status");

function setStatus(text, error = false) {
  status.textContent = text;
  status.classList.toggle("error", error);
}

async function costCompare(el) {
  const base = { d_model: 512, seq_len: 128, batch: 1 };
  const rows = await Promise.all([1, 8].map((n_heads) => api("/api/shapes", { ...base, n_heads })));
  const share = rows[1].params.W_O / rows[1].params.total;
  document.getElementById("wo-share").textContent = `${fmtInt(rows[1].params.W_O)} of ${fmtInt(rows[1].params.total)} (${(100 * share).toFixed(0)}%)`;
  clear(el, h("div", { class: "table-wrap" }, h("table", { id: "cost-table" },
    h("caption", { class: "note" }, "d_model = 512, n = 128, B = 1, traced by headlab.shapes"),
    h("thead", {}, h("tr", {}, h("th", {}, "heads"), h("th", {}, "d_k"), h("th", { class: "num" }, "parameters"), h("th", { class: "num" }, "FLOPs"), h("th", { class: "num" }, "attention-pattern memory"))),
    h("tbody", {}, rows.map((r) => h("tr", {}, h("td", {}, String(r.config.n_heads)), h("td", {}, String(r.config.sizes.d_k)),
      h("td", { class: "num" }, fmtInt(r.params.total)), h("td", { class: "num" }, fmtInt(r.flops.total)), h("td", { class: "num" }, fmtBytes(r.memory.n2_bytes))))))),
    h("p", { id: "cost-sentence" }, costSentence(rows[0], rows[1])));
}

// What the table shows, in words that match its figures: "the same" only where they are equal.
function costSentence(one, many) {
  const times = (a, b) => `${(a / b).toFixed(3)}× those of one head`;
  const params = many.params.total === one.params.total ? "The same parameters" : `Parameters ${times(many.params.total, one.params.total)}`;
  const flops = many.flops.total === one.flops.total
    ? ` and the same FLOPs: ${many.config.n_heads} score products of width ${many.config.sizes.d_k} cost what one of width ${one.config.sizes.d_k} does.`
    : `; FLOPs ${times(many.flops.total, one.flops.total)}.`;
  return `${params}${flops} What grows is the pattern memory, ${fmtBytes(many.memory.n2_bytes)} instead of ${fmtBytes(one.memory.n2_bytes)}: ${many.config.n_heads} separate n × n weight matrices instead of one.`;
}

async function paramsTable(el, asked) {
  const presets = await asked;
  const entries = Object.entries(presets);
  const traced = (p, n_kv_heads) => api("/api/shapes", { d_model: p.d_model, n_heads: p.n_heads, n_kv_heads, d_k: p.d_k ?? null, bias: p.bias, seq_len: 1, batch: 1 });
  const reports = await Promise.all(entries.map(([, p]) => traced(p, p.n_kv_heads)));
  // a shared-K/V layer beside the same layer with one K/V head per query head, at its own d_k
  const unshared = await Promise.all(entries.map(([, p]) => (p.n_kv_heads && p.n_kv_heads < p.n_heads ? traced(p, p.n_heads) : null)));
  // a table wider than a phone (or, with its eight columns, a desktop) scrolls: the keyboard can too
  clear(el, h("div", { class: "table-wrap", tabindex: "0", role: "region", "aria-label": "attention parameters of published layers" }, h("table", { id: "params-presets" },
    h("thead", {}, h("tr", {}, h("th", {}, "model"), h("th", { class: "num" }, "d_model"), h("th", { class: "num" }, "h / h_kv"), h("th", { class: "num" }, "4·d_model²"), h("th", { class: "num" }, "attention parameters per layer"), h("th", { class: "num" }, "with h_kv = h"), h("th", { class: "num" }, "h·d_k"), h("th", {}, "source"))),
    h("tbody", {}, entries.map(([name, p], k) => h("tr", { "data-preset": name }, h("td", {}, p.title || name), h("td", { class: "num" }, fmtInt(p.d_model)),
      h("td", { class: "num" }, `${p.n_heads} / ${p.n_kv_heads ?? p.n_heads}`),
      h("td", { class: "num" }, fmtInt(4 * p.d_model * p.d_model)),
      h("td", { class: "num" }, fmtInt(reports[k].params.total)),
      h("td", { class: "num" }, unshared[k] ? fmtInt(unshared[k].params.total) : "—"),
      h("td", { class: "num" }, fmtInt(reports[k].config.sizes.h * reports[k].config.sizes.d_k)), h("td", { class: "note" }, p.source)))))),
    h("p", { id: "params-sentence" }, paramsSentence(entries, reports, unshared)));
}

// What the table's shared-K/V rows show, from their own traced figures: the saving is against the
// same layer with a K/V head per query head, and 4·d_model² holds only where h·d_k = d_model.
function paramsSentence(entries, reports, unshared) {
  const out = [];
  entries.forEach(([name, p], k) => {
    const u = unshared[k];
    if (!u) return;
    const r = reports[k], { h: hq, h_kv, d_k, d_model } = r.config.sizes;
    const title = p.title || name;
    const saved = `${title}'s ${h_kv} K/V head${h_kv > 1 ? "s" : ""} for ${hq} query heads cut${h_kv > 1 ? "" : "s"} ${fmtInt(u.params.total - r.params.total)} parameters against the same layer with ${hq} (${fmtInt(r.params.total)} instead of ${fmtInt(u.params.total)})`;
    const width = hq * d_k === d_model ? "." : `; its heads are ${d_k} wide, so h·d_k = ${fmtInt(hq * d_k)}, not d_model = ${fmtInt(d_model)}: W_Q and W_O are ${fmtInt(d_model)} × ${fmtInt(hq * d_k)}, ${r.params.total === 4 * d_model * d_model ? "and the total equals 4·d_model² only by coincidence" : `and the total is ${(r.params.total / (4 * d_model * d_model)).toFixed(2)}× 4·d_model²`}.`;
    out.push(saved + width);
  });
  return out.length ? `Sharing K/V heads saves parameters against the same layer with as many K/V heads as query heads, at the same head width: ${out.join(" ")}` : "";
}

async function kvCompare(el, asked) {
  const presets = await asked;
  const gqa = Object.entries(presets).filter(([, p]) => p.n_kv_heads && p.n_kv_heads < p.n_heads);
  if (!gqa.length) { clear(el, missing("No GQA preset in headlab.shapes yet.")); return; }
  const reports = await Promise.all(gqa.map(([, p]) => api("/api/shapes", { d_model: p.d_model, n_heads: p.n_heads, n_kv_heads: p.n_kv_heads, d_k: p.d_k ?? null, bias: p.bias, seq_len: p.context, batch: 1, dtype: "bfloat16" })));
  clear(el, h("div", { class: "table-wrap" }, h("table", { id: "kv-table" },
    h("caption", { class: "note" }, "One layer's KV cache at the model's full context, bfloat16, B = 1"),
    h("thead", {}, h("tr", {}, h("th", {}, "model"), h("th", { class: "num" }, "h / h_kv"), h("th", { class: "num" }, "KV cache"), h("th", { class: "num" }, "same layer as MHA"), h("th", { class: "num" }, "saving"))),
    h("tbody", {}, gqa.map(([name, p], k) => {
      const kv = reports[k].kv_cache;
      return h("tr", {}, h("td", {}, p.title || name), h("td", { class: "num" }, `${p.n_heads} / ${p.n_kv_heads}`),
        h("td", { class: "num" }, fmtBytes(kv.bytes)), h("td", { class: "num" }, fmtBytes(kv.mha_bytes)), h("td", { class: "num" }, `${fmtCompact(kv.mha_bytes / kv.bytes)}×`));
    })))));
}

function codeDialog() {
  const dialog = document.getElementById("code-dialog");
  document.getElementById("code-close").addEventListener("click", () => dialog.close());
  document.querySelectorAll("button[data-code]").forEach((button) => {
    button.addEventListener("click", async () => {
      const name = button.dataset.code;
      document.getElementById("code-title").textContent = name;
      try {
        const code = await api(`/api/code/${encodeURIComponent(name)}`);
        document.getElementById("code-where").textContent = `${code.path}, line ${code.line}`;
        document.getElementById("code-body").textContent = code.source;
      } catch (err) {
        document.getElementById("code-where").textContent = err.message;
        document.getElementById("code-body").textContent = "";
      }
      dialog.showModal();
    });
  });
}

// A stored run is fetched when its section comes within a screen or two of view: a full run's
// results can weigh megabytes, and the first load should not carry the ones nobody scrolls to.
async function experiments() {
  let listing = { available: [] };
  try { listing = await api("/api/experiments"); } catch { /* shown per section below */ }
  const show = async (el, name) => {
    try {
      renderExperiment(el, name, await api(`/api/experiments/${name}`));
    } catch (err) {
      clear(el, h("p", { class: "error" }, `Could not show ${name}: ${err.message}`));
    }
  };
  const near = new IntersectionObserver((entries) => entries.forEach((entry) => {
    if (!entry.isIntersecting) return;
    near.unobserve(entry.target);
    show(entry.target, entry.target.dataset.experiment);
  }), { rootMargin: "1200px 0px" });
  for (const el of document.querySelectorAll("[data-experiment]")) {
    const name = el.dataset.experiment;
    if (!listing.available.includes(name)) {
      clear(el, missing(`The ${name} experiment has no shipped results in this version yet, so nothing is shown here. Run: headlab experiment ${name} --ship`));
      continue;
    }
    clear(el, h("p", { class: "note" }, `The stored run of headlab experiment ${name} loads as you scroll to it.`));
    near.observe(el);
  }
}

// A link into a folded part of the page (§9's caveats) opens the fold it points into: the link
// is followed by hash or, to the hash already in the address bar, by a click.
function openFolds() {
  const open = (hash) => {
    const target = hash.length > 1 && document.getElementById(decodeURIComponent(hash.slice(1)));
    for (let fold = target && target.closest("details"); fold; fold = fold.parentElement.closest("details")) fold.open = true;
    if (target) target.scrollIntoView();
  };
  window.addEventListener("hashchange", () => open(location.hash));
  document.addEventListener("click", (ev) => {
    const link = ev.target.closest?.("a[href^='#']");
    if (link && link.getAttribute("href") === location.hash) open(location.hash);
  });
  if (location.hash) open(location.hash);
}

function guard(fn, el) {
  return fn(el).catch((err) => clear(el, h("p", { class: "error" }, `Could not load: ${err.message}`)));
}

async function start() {
  codeDialog();
  openFolds();
  try {
    const health = await api("/api/health");
    setHost(health);  // what this host runs: everything, or a static site's list
    setStatus(`Connected to headlab ${health.version}: live figures are computed now; stored ones name the run that made them.`);
  } catch (err) {
    setStatus(`The headlab server does not answer (${err.message}). Start it with: headlab serve`, true);
    return;
  }
  // the published presets, asked for once: the calculator's menu and both tables draw from it
  const presets = api("/api/shapes/presets");
  initShapes(document.getElementById("shapes-widget"), presets);
  const viewer = initHeads(document.getElementById("heads-widget"), document.getElementById("label-summary"));
  initSwitchOff(document.getElementById("switch-widget"), viewer.state);
  initLiveTrain(document.getElementById("live-train-widget"));
  guard(costCompare, document.getElementById("cost-compare"));
  guard((el) => paramsTable(el, presets), document.getElementById("params-table"));
  guard((el) => kvCompare(el, presets), document.getElementById("kv-compare"));
  experiments();
}

start();
