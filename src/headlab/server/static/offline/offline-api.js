// The static site's API: answers the page's fetch("/api/…") calls in the browser, so the page's own
// scripts run unchanged without `headlab serve` (loaded before them by the site's index.html only).
//   GET  /api/…           the answer the real server gave when the site was built (api/….json)
//   POST /api/attention   the default model, exported to ONNX by PyTorch, run by onnxruntime-web;
//                         or a model the site adds (the manifest's models after "default": SmolLM2, headlab.site_smollm2),
//                         downloaded when first picked, with a progress bar, and cached
//   POST /api/heads       the same run, whose graph also gives every head's scores (headlab's own
//                         scores, exported with the model); labels (labels.js) gated by the
//                         floors of the same graph with random weights (one per baseline seed),
//                         or by the thresholds alone with "floors": false (always, for an added
//                         model: its random copies do not fit a page; the answer says so)
//   POST /api/shapes      widget 1's report, evaluated here (shapes.js) from the shape statement
//                         Python's report is evaluated from (shape-statement.json)
//   POST /api/switch-off  the text run intact and with a set of heads switched off: the graph of
//                         headlab.heads.switch.SwitchGraph (switch.onnx, fetched on the first
//                         request; an added model's, a few MB, reads the weights already
//                         downloaded for it), whose outputs are switch_off's predictions,
//                         losses, patterns and induction scores; here they are only put in the
//                         server's JSON
//   POST /api/live/…      refused: live training needs `headlab serve`
// What it runs (the models, probes and POST routes) is the builder's manifest, stored in the GET
// /api/health answer under "static_site" (headlab.site.site_manifest), which the page's menus
// also offer by (js/host.js); anything else is refused, saying it needs `headlab serve`.
// Everything is read from this site's own folder: no other address is ever asked.

import { Tokenizer } from "./tokenizer.js";
import { shapesReport } from "./shapes.js";
import { analyseRuns, graphInputs, runGraph } from "./labels.js";
import { loadWordTable, textProbe } from "./words.js";
import { fetchModelFiles } from "./download.js";

const HERE = new URL(".", import.meta.url);  // static/offline/
const SITE = new URL("../../", HERE);         // the site's root
const pageFetch = window.fetch.bind(window);
const STATEMENT_FILE = "shape-statement.json";  // headlab.site.STATEMENT_FILE: the shape statement
const SWITCH_FILE = "switch.onnx";  // headlab.site.SWITCH_FILE: the switch-off graph
const LIVE_NOTE = "live training needs the headlab server (`headlab serve`): this static site shows the stored run only";
const NO_WASM = "This page runs the model in your browser and needs WebAssembly, which this browser does not offer. Use a current Chrome, Firefox or Safari, or run `headlab serve`.";

// where the first render's time goes: benchmarks/bench_static.py reads these marks
const mark = (what) => performance.mark(`headlab:${what}`);
mark("offline-api");

function reply(status, body) {
  return new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json" } });
}

// every model's bytes and the word table, fetched at once (the runtime compiles meanwhile)
const bytes = (file) => pageFetch(new URL(file, HERE)).then((r) => {
  if (!r.ok) throw new Error(`this static site is missing static/offline/${file}`);
  return r.arrayBuffer();
});
const siteConfig = pageFetch(new URL("config.json", HERE)).then((r) => r.json());
const manifest = pageFetch(new URL("api/health.json", SITE)).then((r) => r.json()).then((health) => {
  if (!health.static_site) throw new Error("this static site's api/health.json has no manifest (static_site)");
  return health.static_site;
});
const statement = bytes(STATEMENT_FILE).then((b) => JSON.parse(new TextDecoder().decode(b)));
const models = new Map([["model", bytes("model.onnx").then((b) => new Uint8Array(b))]]);
const words = bytes("words-en.txt.gz").then(loadWordTable);
siteConfig.then((c) => c.rules.baseline_seeds.forEach((seed) =>
  models.set(seed, bytes(`random-${seed}.onnx`).then((b) => new Uint8Array(b)))));
// a missing file is reported by the request that needs it, not as an unhandled rejection now
for (const p of [siteConfig, manifest, statement, words, models.get("model")]) p.catch(() => {});

// no graph rewrites: a session is made in about half the time (measured in headless Chromium),
// and each model runs as PyTorch's exporter wrote it
const SESSION = { executionProviders: ["wasm"], graphOptimizationLevel: "disabled" };

// the model, tokenizer and runtime, loaded once on the first request that needs them
let loaded = null;
function load() {
  if (!loaded) loaded = (async () => {
    if (typeof WebAssembly !== "object") throw new Error(NO_WASM);
    const ort = await import(new URL("ort.wasm.bundle.min.mjs", HERE).href);
    mark("runtime-imported");
    ort.env.wasm.wasmPaths = HERE.href;  // the runtime's .wasm from this folder, never a CDN
    ort.env.wasm.numThreads = 1;         // threads need cross-origin isolation a static host rarely gives
    const [session, tokenizer, config] = await Promise.all([
      ort.InferenceSession.create(await models.get("model"), SESSION),
      pageFetch(new URL("tokenizer.json", HERE)).then((r) => r.json()).then((j) => new Tokenizer(j)),
      siteConfig,
    ]);
    mark("model-ready");
    return { ort, session, tokenizer, config };
  })();
  return loaded;
}

// a model the site adds (static/offline/NAME/: config.json, tokenizer.json, the graph and its
// external data), loaded once, when first asked for: its files fetched with a progress bar
const extras = new Map();
function loadExtra(name) {
  if (!extras.has(name)) extras.set(name, (async () => {
    const { ort } = await load();
    const base = new URL(`${name}/`, HERE);
    const json = (file) => pageFetch(new URL(file, base)).then((r) => {
      if (!r.ok) throw new Error(`this static site is missing static/offline/${name}/${file}`);
      return r.json();
    });
    const config = await json("config.json");
    mark(`${name}-download`);
    const show = (p) => showDownload(name, p);
    const { data, cached } = await fetchModelFiles(pageFetch, base, config.files, name, config.version, show);
    mark(`${name}-downloaded`);
    const [session, tokenizer] = await Promise.all([
      ort.InferenceSession.create(data.get(config.graph), {
        ...SESSION, externalData: config.external_data.map((path) => ({ path, data: data.get(path) })),
      }),
      json("tokenizer.json").then((j) => new Tokenizer(j)),
    ]);
    showDownload(name, { done: -1, cached });
    mark(`${name}-ready`);
    return { ort, session, tokenizer, config, data };
  })().catch((err) => { extras.delete(name); throw err; }));  // a failed download may be retried
  return extras.get(name);
}

// the bar under the head viewer's status line while a model downloads; done −1: it is ready
function showDownload(name, { done, total, cached }) {
  const status = document.getElementById("heads-status");
  if (!status) return;
  let box = document.getElementById("model-download");
  if (!box) {
    box = document.createElement("div");
    box.id = "model-download";
    box.innerHTML = '<progress id="model-download-bar"></progress> <span id="model-download-text" role="status"></span>';
    status.after(box);
  }
  const bar = box.querySelector("progress"), text = box.querySelector("span");
  const mb = (b) => (b / 1e6).toFixed(1);
  bar.hidden = done < 0;
  bar.setAttribute("aria-label", `${name} downloaded`);
  if (done >= 0) {
    bar.max = total;
    bar.value = done;
    text.textContent = `${cached ? "Reading" : "Downloading"} ${name}: ${mb(done)} of ${mb(total)} MB${cached ? " from this browser's cache" : ", once: your browser keeps it for the next visit"}.`;
  } else {
    text.textContent = `${name} runs in your browser${cached ? " (read from this browser's cache)" : ""}; its labels use the thresholds alone (not checked against random-weights floors, as \`headlab heads --no-floors\`).`;
  }
}

// the model a request names: the default one, or one the site adds
async function modelFor(name) {
  if (name === "default") return load();
  await load();  // the runtime (and the default model, which the page draws first)
  return loadExtra(name);
}

// what the labels need beyond the model: the random-weights models (the floors), once
let scoring = null;
function loadScoring() {
  if (!scoring) scoring = (async () => {
    const { ort, config: c } = await load();
    const randoms = [];
    for (const seed of c.rules.baseline_seeds) {  // one at a time: the runtime is single-threaded
      randoms.push(await ort.InferenceSession.create(await models.get(seed), SESSION));
      mark(`random-${seed}-ready`);
    }
    const ready = { randoms };
    mark("scoring-ready");
    return ready;
  })();
  return scoring;
}

// each model's switch-off graph, fetched and loaded on its first switch-off (most readers never
// ask): the default model's switch.onnx; an added model's, named by its config, reads the 4-bit
// blocks it shares with the model's graph from the files already downloaded for it
const switching = new Map();
function loadSwitch(name) {
  if (!switching.has(name)) switching.set(name, (async () => {
    const { ort } = await load();
    if (name === "default") return ort.InferenceSession.create(new Uint8Array(await bytes(SWITCH_FILE)), SESSION);
    const { config, data } = await loadExtra(name);
    const base = new URL(`${name}/`, HERE);
    const file = { name: config.switch.graph, bytes: config.switch.bytes };
    const status = document.getElementById("switch-status");
    const say = ({ done, total, cached }) => {
      if (status) status.textContent = `${cached ? "Reading" : "Downloading"} ${name}'s switch-off graph: ${(done / 1e6).toFixed(1)} of ${(total / 1e6).toFixed(1)} MB (once; its weights are the ones already here)…`;
    };
    const got = await fetchModelFiles(pageFetch, base, [file], name, config.version, say);
    if (status) status.textContent = "Running the model twice…";
    return ort.InferenceSession.create(got.data.get(file.name), {
      ...SESSION, externalData: config.switch.external_data.map((path) => ({ path, data: data.get(path) })),
    });
  })().catch((err) => { switching.delete(name); throw err; }));  // a failed fetch is tried again next time
  return switching.get(name);
}

// nested arrays (L, h, n, n) from a flat Float32Array, unrounded: the weights PyTorch's graph gives
function nest(data, dims) {
  const build = (offset, d) => {
    if (d === dims.length - 1) return Array.from(data.subarray(offset, offset + dims[d]));
    const step = dims.slice(d + 1).reduce((a, b) => a * b, 1);
    return Array.from({ length: dims[d] }, (_, i) => build(offset + i * step, d + 1));
  };
  return build(0, 0);
}

const either = (names) => names.map((n) => `'${n}'`).join(" and ");

// the text of a request as the server checks it (and against the manifest): a sentence saying
// what is wrong, or null
function textProblem(body, site) {
  if (body.model && !site.models.includes(body.model)) return `model: ${either(site.models)} ${site.models.length > 1 ? "run" : "runs"} in this static site; the '${body.model}' model needs \`headlab serve\``;
  if (body.probe && !site.probes.includes(body.probe)) return `probe: ${either(site.probes)} run in this static site; the '${body.probe}' probe needs \`headlab serve\``;
  if (body.probe === "repeat" && body.text !== undefined) return "probe 'repeat' takes no text; leave the text out or use probe 'text'";
  if (typeof body.text === "string" && !body.text.trim()) return "the text is empty: give at least one word";
  return null;
}

// the request's text as a probe (the server's "text" or "repeat") for the model it names, or
// {error}: the shared part of every route that runs a model
async function readText(body) {
  const problem = textProblem(body, await manifest);
  if (problem) return { error: problem };
  const model = body.model || "default";
  const { tokenizer, config } = await modelFor(model);
  // no text: the built-in sentence with a repeat, as the server's "repeat" probe
  const kind = typeof body.text === "string" ? "text" : "repeat";
  const text = kind === "text" ? body.text : config.repeat_sentence;
  const probe = textProbe(text, tokenizer, config, await words);
  const ids = probe.ids;
  if (ids.length > config.max_len) {
    const server = config.context > config.max_len ? ` in this static site (\`headlab serve\` takes up to ${config.context})` : "";
    return { error: `the text is ${ids.length} tokens but the model takes at most ${config.max_len}${server}; shorten it` };
  }
  return { model, probe: kind, text, ids, tokens: tokenizer.labels(ids), textProbe: probe, config };
}

// every layer's attention weights and every head's scores on the request's text: the shared
// part of /api/attention and /api/heads
export async function runText(body) {
  const read = await readText(body);
  if (read.error) return read;
  const { ort, session } = await modelFor(read.model);
  const feeds = graphInputs(ort, read.textProbe);
  const run = await runGraph(session, feeds);
  return { ...run, ...read, feeds };
}

async function attention(body) {
  const run = await runText(body);
  if (run.error) return reply(422, { detail: run.error });
  return reply(200, {
    model: run.model, text: run.text, tokens: run.tokens, ids: run.ids, causal: run.config.causal,
    n_layers: run.L, n_heads: run.h, n_kv_heads: run.config.n_kv_heads || run.config.n_heads,
    weights: nest(run.weights, [run.L, run.h, run.n, run.n]), averaged: nest(run.averaged, [run.L, run.n, run.n]),
    computed: "in your browser (onnxruntime-web)",
  });
}

// the model's run and each random-weights model's on the probe: one run of each graph, as analyse
async function scoreText(run) {
  const { config } = run;
  if (config.floors === false) return { ...analyseRuns(run, [], config), startToken: !run.textProbe.movable[0], noFloors: true };
  const { randoms } = await loadScoring();
  const rest = [];
  for (const s of randoms) rest.push(await runGraph(s, run.feeds));  // one at a time: the runtime is single-threaded
  return { ...analyseRuns(run, rest, config), startToken: !run.textProbe.movable[0] };
}

// HeadReport.sink_position: where a sink rests on this probe
function restsOn(token, start) {
  const what = start ? "the start token" : `the first word, '${token.trim()}'`;
  return { position: 0, token, start_token: start, note: `a sink rests on ${what}` + (start ? "" : "; the rare-word score leaves position 0 out") };
}

async function heads(body) {
  if (body.floors !== undefined && typeof body.floors !== "boolean") return reply(422, { detail: `floors: must be true (labels gated by random-weights floors) or false (thresholds alone), got ${JSON.stringify(body.floors)}` });
  const run = await runText(body);
  if (run.error) return reply(422, { detail: run.error });
  mark("weights");
  const scored = await scoreText(run);
  mark("scored");
  const gated = body.floors !== false && !scored.noFloors;
  const chosen = gated ? scored.gated : scored.thresholds;
  return reply(200, {
    model: run.model, text: run.text, probe: run.probe, tokens: run.tokens, ids: run.ids, causal: run.config.causal,
    n_layers: run.L, n_heads: run.h, n_kv_heads: run.config.n_kv_heads || run.config.n_heads,
    ...chosen,
    sinks: { ...chosen.sinks, rests_on: restsOn(run.tokens[0] || "", scored.startToken) },
    floors: gated ? scored.floors : null,
    label_rule: gated ? "threshold and random-weights floor" : "threshold only (unchecked against chance)",
    ...(scored.noFloors ? { floors_note: `${run.model}'s random-weights floors need \`headlab serve\` (three random copies of it do not fit a page): its labels here use the thresholds alone, as \`headlab heads --no-floors\`` } : {}),
    weights: nest(run.weights, [run.L, run.h, run.n, run.n]),
    averaged_weights: nest(run.averaged, [run.L, run.n, run.n]),
    syntax_labels: false, computed: "in your browser (onnxruntime-web)",
  });
}

// widget 1: the report evaluated here from the shape statement, which also says what a request
// may ask (the fields, their limits, which may be null)
async function shapes(body) {
  const answer = shapesReport(await statement, body);
  return answer.error ? reply(422, { detail: answer.error }) : reply(200, answer);
}

// the heads of a switch-off request, sorted and each once, or {error} (as the server's schema
// and headlab.ablation.full_mask say it)
function headsOff(body, L, h) {
  if (body.mode !== undefined && body.mode !== "mean" && body.mode !== "zero") return { error: `mode: 'mean' or 'zero', got ${JSON.stringify(body.mode)}` };
  if (!Array.isArray(body.off) || !body.off.length) return { error: "off: give at least one [layer, head] pair to switch off" };
  const named = new Map();
  for (const pair of body.off) {
    if (!Array.isArray(pair) || pair.length !== 2 || !pair.every(Number.isInteger)) return { error: `off: each head is a [layer, head] pair of whole numbers, got ${JSON.stringify(pair)}` };
    const [l, k] = pair;
    if (!(l >= 0 && l < L && k >= 0 && k < h)) return { error: `head ${l}.${k} does not exist; layers 0..${L - 1}, heads 0..${h - 1}` };
    named.set(l * h + k, [l, k]);
  }
  return { heads: [...named.entries()].sort((a, b) => a[0] - b[0]).map(([, pair]) => pair) };
}

// POST /api/switch-off: the graph's two runs (site.SWITCH_OUTPUTS, each output's first axis the
// intact run, then the switched-off one) in the JSON of headlab.heads.switch.SwitchedOff.to_dict
async function switchOff(body) {
  const problem = textProblem(body, await manifest);
  if (problem) return reply(422, { detail: problem });
  const model = body.model || "default";
  const { ort, tokenizer, config } = await modelFor(model);
  const L = config.n_layers, h = config.n_heads;
  const off = headsOff(body, L, h);
  if (off.error) return reply(422, { detail: off.error });
  const read = await readText(body);
  if (read.error) return reply(422, { detail: read.error });
  const session = await loadSwitch(model);
  const mode = body.mode ?? "mean";
  const mask = new Float32Array(L * h);
  for (const [l, k] of off.heads) mask[l * h + k] = 1;
  const n = read.ids.length;
  const out = await session.run({
    tokens: new ort.Tensor("int64", BigInt64Array.from(read.ids, BigInt), [1, n]),
    off: new ort.Tensor("float32", mask, [L, h]),
    mean: new ort.Tensor("float32", Float32Array.of(mode === "mean" ? 1 : 0), []),
  });
  const k = out.top_ids.dims[3];
  const rows = Array.from(out.repeat_rows.data, Boolean);  // (1, n − 1)
  const counts = { repeat: rows.filter(Boolean).length, all: rows.length };
  const loss = {};
  ["repeat", "all"].forEach((key, j) => {
    const [intact, switched] = [out.loss.data[j], out.loss.data[2 + j]];  // (2 runs, 2 kinds)
    loss[key] = counts[key] ? { intact, off: switched, rise: switched - intact, rows: counts[key] } : null;
  });
  const run = (r) => {
    const ids = Array.from(out.top_ids.data.subarray(r * n * k, (r + 1) * n * k), Number);
    const probs = out.top_probs.data.subarray(r * n * k, (r + 1) * n * k);
    const labels = tokenizer.labels(ids);
    return {
      predictions: Array.from({ length: n }, (_, i) => Array.from({ length: k }, (_, j) =>
        ({ id: ids[i * k + j], token: labels[i * k + j], p: probs[i * k + j] }))),
      losses: Array.from(out.losses.data.subarray(r * (n - 1), (r + 1) * (n - 1))),
      induction: nest(out.induction.data.subarray(r * L * h, (r + 1) * L * h), [L, h]),
      weights: nest(out.weights.data.subarray(r * L * h * n * n, (r + 1) * L * h * n * n), [L, h, n, n]),
    };
  };
  return reply(200, {
    model, probe: read.probe, text: read.text, tokens: read.tokens, ids: read.ids,
    causal: config.causal, n_layers: L, n_heads: h, ...config.layout,
    sequences: 1, mode, off: off.heads, loss, repeat_rows: rows,
    intact: run(0), switched_off: run(1), computed: "in your browser (onnxruntime-web)",
  });
}

// a GET answer written at build time: api/<route>.json; the models' list says which run here
async function stored(route) {
  const response = await pageFetch(new URL(`api/${route}.json`, SITE));
  if (!response.ok) return reply(404, { detail: `this static site has no stored answer for /api/${route}` });
  const answer = await response.json();
  return reply(200, route === "models" ? here(answer, await manifest) : answer);
}

// the builder's models, as this site offers them: those its manifest lists (the default one and
// the ones it adds)
function here(models, site) {
  return models.map((m) => site.models.includes(m.name)
    ? { ...m, available: true, description: m.name === "default" ? m.description : `${m.description}; runs in your browser, downloaded when first picked` }
    : { ...m, available: false, reason: "runs with `headlab serve`, not in this static site" });
}

async function answer(path, init) {
  const method = (init?.method || "GET").toUpperCase();
  const route = decodeURIComponent(path.slice("/api/".length));
  const body = init?.body ? JSON.parse(init.body) : {};
  if (method === "GET") return stored(route);
  // a POST route runs here when the manifest lists it (and this file answers it)
  const runs = { attention, heads, shapes, "switch-off": switchOff };
  if ((await manifest).routes.includes(route) && Object.hasOwn(runs, route)) return runs[route](body);
  if (route.startsWith("live")) return reply(503, { detail: LIVE_NOTE });
  return reply(501, { detail: `/api/${route} needs the headlab server (\`headlab serve\`)` });
}

// start fetching and compiling the runtime and the model now, while the page draws the rest
load().then(loadScoring).catch(() => {});  // a failure is reported by the request that needs them

window.fetch = async (input, init) => {
  const path = typeof input === "string" ? input : input.url;
  if (typeof path === "string" && path.startsWith("/api/")) {
    try {
      return await answer(path, init);
    } catch (err) {
      return reply(500, { detail: err.message || String(err) });
    }
  }
  return pageFetch(input, init);
};

// the models the site adds to the default one, named by the status line once the manifest is read
let added = [];
manifest.then((m) => { added = m.models.filter((name) => name !== "default"); relabel(document); }).catch(() => {});

// every figure says where its numbers come from: "live" ones are computed in this browser here
const SAY = { "badge-live": "computed in your browser", "badge-stored": "stored" };
function relabel(root) {
  for (const [cls, words] of Object.entries(SAY)) {
    for (const el of root.querySelectorAll(`.${cls}`)) if (el.textContent !== words) el.textContent = words;
  }
  const status = document.getElementById("server-status");
  if (!status) return;
  const extra = added.length ? ` (and ${added.join(", ")}, downloaded when you pick it in the head viewer; its labels use the thresholds alone)` : "";
  const text = `A static copy of the explainer: the default model${extra} runs in your browser (onnxruntime-web) and the shape calculator computes here; stored figures name the run that made them; head scores and labels are computed here too. Each section says what of it needs \`headlab serve\`.`;
  const ours = status.textContent.startsWith("A static copy of the explainer");
  if ((status.textContent.startsWith("Connected to headlab") || ours) && status.textContent !== text) status.textContent = text;
}
new MutationObserver(() => relabel(document)).observe(document.documentElement, { childList: true, subtree: true, characterData: true });
document.addEventListener("DOMContentLoaded", () => {
  relabel(document);
  if (typeof WebAssembly !== "object") document.getElementById("server-status").textContent = NO_WASM;
});
