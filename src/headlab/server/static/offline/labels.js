// The heads' labels from the scores the exported graph gives (model.onnx, random-*.onnx: every
// score is headlab.heads.scores.ScoreGraph's, computed in the graph, never here), and the graph's
// inputs and outputs. What is left for JavaScript is the labelling rule's glue, read from the
// library through config.json: the random-weights floors (Baselines.floors: mean + K_SD · sd),
// label_head's tiers (headlab.heads.labels.decide), and the report's best heads and sinks
// (heads/report.py). tests/unit/test_site_scores.py and tests/browser/test_static_site.py check
// the answers equal analyse's and `headlab heads --json`'s.
//
// A run is the graph's outputs on one text: scores (T, H), offsets (H,), rests (R, H), with
// H = L · (h + 1) heads (each layer's h heads, then its averaged head) and the rows named by
// config.score_names and config.rest_names.

const f32 = Math.fround;

// the graph's inputs for a text probe (words.js textProbe; site.GRAPH_INPUTS): the token ids,
// the delimiters and the fixed (special) tokens, each token's word and that word's frequency
// (NaN: none), each (1, n)
export function graphInputs(ort, probe) {
  const n = probe.ids.length;
  const tensor = (type, data) => new ort.Tensor(type, data, [1, n]);
  const zipf = Float32Array.from(probe.wordIndex, (w) => (w >= 0 ? probe.zipf[w] : NaN));
  return {
    tokens: tensor("int64", BigInt64Array.from(probe.ids, BigInt)),
    delimiters: tensor("bool", Uint8Array.from(probe.delimiters, Number)),
    fixed: tensor("bool", Uint8Array.from(probe.movable, (m) => (m ? 0 : 1))),
    word_index: tensor("int64", BigInt64Array.from(probe.wordIndex, BigInt)),
    zipf: tensor("float32", zipf),
  };
}

// one graph's run on those inputs (site.GRAPH_OUTPUTS): {L, h, n, weights (L, h, n, n),
// averaged (L, n, n), scores (T, L · (h + 1)), offsets (L · (h + 1),), rests (R, L · (h + 1))}
export async function runGraph(session, feeds) {
  const out = await session.run(feeds);
  const [L, h, n] = out.weights.dims;
  return { L, h, n, weights: out.weights.data, averaged: out.averaged.data,
    scores: out.scores.data, offsets: out.offsets.data, rests: out.rests.data };
}

// every head of every layer: {layer, head (−1: the averaged head), scores, offset, rests}
export function scoreLayers(run, config) {
  const { L, h } = run;
  const H = L * (h + 1);
  const named = (names, data, k) => Object.fromEntries(names.map((name, t) => [name, data[t * H + k]]));
  const out = [];
  for (let k = 0; k < H; k++) {
    const layer = Math.floor(k / (h + 1)), i = k % (h + 1);
    out.push({ layer, head: i < h ? i : -1, offset: Number(run.offsets[k]),
      scores: named(config.score_names, run.scores, k), rests: named(config.rest_names, run.rests, k) });
  }
  return out;
}

// Baselines.floors: per layer, the random-weights mean + k · sd (sample) over its heads and seeds
export function floorsOf(randomScored, rules) {
  const floors = {};
  const heads = randomScored.flat().filter((s) => s.head >= 0);
  for (const s of heads) floors[s.layer] ??= {};
  for (const layer of Object.keys(floors)) {
    const mine = heads.filter((s) => s.layer === Number(layer));
    for (const type of Object.keys(mine[0].scores)) {
      const v = mine.map((s) => s.scores[type]);
      const mean = v.reduce((a, b) => a + b, 0) / v.length;
      const sd = v.length > 1 ? Math.sqrt(v.reduce((a, b) => a + (b - mean) ** 2, 0) / (v.length - 1)) : 0;
      floors[layer][type] = f32(f32(mean) + f32(rules.k_sd * f32(sd)));
    }
  }
  return floors;
}

// labels.NEEDS: a type judged on the attention off the first token (induction_active) passes
// only where the plain score it is a share of reaches its minimum too
const enough = (k, scores, rules) => !rules.needs?.[k] || (scores[rules.needs[k].score] ?? 0) >= rules.needs[k].min;

// label_head: tier by tier, the passing type by the widest share of the way to 1; floors gate
export function labelHead(scores, offset, rules, floors) {
  for (const tier of rules.tiers) {
    let best = null, margin = -Infinity;
    for (const k of tier) {
      if (!(k in scores)) continue;
      const need = Math.max(rules.thresholds[k], floors?.[k] ?? 0);
      if (scores[k] < need || !enough(k, scores, rules)) continue;
      const m = (scores[k] - rules.thresholds[k]) / (1 - rules.thresholds[k]);
      if (m > margin) { best = k; margin = m; }
    }
    if (best === "positional") return rules.offset_labels[String(offset)] ?? "positional";
    if (best) return rules.labels[best];
  }
  return "mixed";
}

const round4 = (v) => Math.round(v * 1e4) / 1e4;

// one head's entry as HeadScore.to_dict writes it (scores unrounded: the graph's own numbers)
function entry(s, rules, floors) {
  const label = labelHead(s.scores, s.offset, rules, s.head >= 0 ? floors?.[s.layer] : null);
  const kind = rules.rest_of_label[label];
  const rest = kind in s.rests ? s.rests[kind] : null;
  return { layer: s.layer, head: s.head, label, offset: s.offset, scores: s.scores, rest: rest === null ? null : round4(rest) };
}

// the report's heads, averaged heads, best head per type and sinks (HeadReport.to_dict)
export function report(scored, rules, floors) {
  const heads = scored.filter((s) => s.head >= 0).map((s) => entry(s, rules, floors));
  const averaged = scored.filter((s) => s.head < 0).map((s) => entry(s, rules, null));
  const best = {};
  for (const [kind, score] of Object.entries(rules.best_types)) {
    const withScore = heads.filter((s) => score in s.scores);
    if (!withScore.length) continue;
    const labelled = withScore.filter((s) => s.label === kind);
    const top = (labelled.length ? labelled : withScore).reduce((a, b) => (b.scores[score] > a.scores[score] ? b : a));
    const value = top.scores[score];
    best[kind] = { layer: top.layer, head: top.head, score: round4(value), passes_threshold: value >= rules.thresholds[score] && enough(score, top.scores, rules), label: top.label, labelled: labelled.length > 0 };
  }
  const layers = [...new Set(heads.map((s) => s.layer))].sort((a, b) => a - b).map((layer) => {
    const mine = heads.filter((s) => s.layer === layer);
    const sinks = mine.filter((s) => s.scores.first_token > rules.sink_threshold).map((s) => s.head);
    return { layer, share: round4(sinks.length / mine.length), heads: sinks };
  });
  return { heads, averaged, best, thresholds: rules.thresholds, needs: rules.needs, sinks: { threshold: rules.sink_threshold, layers } };
}

// analyse(model, probe) and analyse(model, probe, floors=…) of one text from the graphs' runs on
// it: main the model's, randoms each random-weights model's. Returns both reports and the floors.
export function analyseRuns(main, randoms, config) {
  const scored = scoreLayers(main, config);
  const floors = floorsOf(randoms.map((r) => scoreLayers(r, config)), config.rules);
  return { thresholds: report(scored, config.rules, null), gated: report(scored, config.rules, floors), floors };
}
