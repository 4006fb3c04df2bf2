// tests/unit/test_site_scores.py's driver: the site's scripts on PyTorch's weights, in Node.
// node test_site_scores.mjs OFFLINE_DIR CASES_DIR → the port's answers as JSON on stdout
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
const [offline, dir] = process.argv.slice(2);
const at = (f) => pathToFileURL(`${offline}/${f}`).href;
const { Tokenizer } = await import(at("tokenizer.js"));
const { textProbe, loadWordTable } = await import(at("words.js"));
const { analyseRuns } = await import(at("scores.js"));
const manifest = JSON.parse(readFileSync(dir + "/manifest.json", "utf8"));
const config = JSON.parse(readFileSync(dir + "/config.json", "utf8"));
const tokenizer = new Tokenizer(JSON.parse(readFileSync(manifest.tokenizer, "utf8")));
const table = await loadWordTable(readFileSync(dir + "/words.gz"));
const floats = (f) => { const b = readFileSync(f); return new Float32Array(b.buffer, b.byteOffset, b.length / 4); };
const out = [];
for (const [k, text] of manifest.texts.entries()) {
  const probe = textProbe(text, tokenizer, config, table);
  const n = probe.ids.length;
  const run = (name) => ({ L: manifest.L, h: manifest.h, n,
    weights: floats(`${dir}/${k}/${name}-weights.bin`), averaged: floats(`${dir}/${k}/${name}-averaged.bin`) });
  const result = analyseRuns(probe, run("model"), manifest.seeds.map((s) => run(`random-${s}`)), config);
  out.push({ ids: probe.ids, words: probe.words, zipf: probe.zipf.map((z) => (Number.isNaN(z) ? null : z)), ...result });
}
process.stdout.write(JSON.stringify(out));
