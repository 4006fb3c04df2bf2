// tests/unit/test_site_scores.py's driver: the site's own scripts and onnxruntime-web (the WASM
// build the site ships) run the exported graphs in Node on each text.
// node test_site_scores.mjs OFFLINE_DIR CASES_DIR ORT_MODULE → the answers as JSON on stdout
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
const [offline, dir, runtime] = process.argv.slice(2);
const at = (f) => pathToFileURL(`${offline}/${f}`).href;
const { Tokenizer } = await import(at("tokenizer.js"));
const { textProbe, loadWordTable } = await import(at("words.js"));
const { analyseRuns, graphInputs, runGraph } = await import(at("labels.js"));
const ort = await import(pathToFileURL(runtime).href);
ort.env.wasm.numThreads = 1;
const manifest = JSON.parse(readFileSync(dir + "/manifest.json", "utf8"));
const config = JSON.parse(readFileSync(dir + "/config.json", "utf8"));
const tokenizer = new Tokenizer(JSON.parse(readFileSync(manifest.tokenizer, "utf8")));
const table = await loadWordTable(readFileSync(dir + "/words.gz"));
const options = { executionProviders: ["wasm"], graphOptimizationLevel: "disabled" };  // as the site
const open = (file) => ort.InferenceSession.create(readFileSync(`${dir}/${file}`), options);
const model = await open("model.onnx");
const randoms = [];
for (const seed of manifest.seeds) randoms.push(await open(`random-${seed}.onnx`));
const out = [];
for (const text of manifest.texts) {
  const probe = textProbe(text, tokenizer, config, table);
  const feeds = graphInputs(ort, probe);
  const main = await runGraph(model, feeds);
  const rest = [];
  for (const s of randoms) rest.push(await runGraph(s, feeds));
  out.push({ ids: probe.ids, words: probe.words, zipf: probe.zipf.map((z) => (Number.isNaN(z) ? null : z)), ...analyseRuns(main, rest, config) });
}
process.stdout.write(JSON.stringify(out));
