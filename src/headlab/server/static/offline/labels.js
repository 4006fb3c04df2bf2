// Every head score and label of headlab.heads, for one sequence, in the reader's browser: a port of
// pattern_scores (heads/scores.py), build_targets (heads/targets.py), label_head (heads/labels.py)
// and the report's best heads and sinks (heads/report.py). Their data-dependent rows, argmaxes
// and loops do not trace into a fixed ONNX graph, so they live here too; the constants (the
// thresholds, tiers, baseline seeds) come from the library through config.json,
// and tests/unit/test_site_scores.py checks this file equal to headlab.heads.analyse.
//
// Shapes (one sequence, B = 1): a head's weights A are a Float32Array (n, n), row-major: query i,
// key j. Targets are Uint8Array (n, n) or (n,). Scores are float32 values (Math.fround) as
// PyTorch's are, so a score exactly at a threshold falls on the same side.

const f32 = Math.fround;

function grid(n, rule) {
  const out = new Uint8Array(n * n);
  for (let i = 0; i < n; i++) for (let j = 0; j < n; j++) out[i * n + j] = rule(i, j) ? 1 : 0;
  return out;
}

const visibleKeys = (n, causal) => Array.from({ length: n }, (_, i) => (causal ? i + 1 : n));

// Targets (heads/targets.py targets_of): every type's target keys on the token ids, built once
export function buildTargets(ids, causal, delimiters, fixed, rare) {
  const n = ids.length;
  const same = (i, j) => ids[i] === ids[j];
  const dup = (i, j) => j < i && same(i, j);                  // duplicate_token_pattern
  const indMul = (i, j) => j >= 1 && dup(i, j - 1);           // induction_pattern
  const copies = (i, j) => (causal ? dup(i, j) : i !== j && same(i, j));
  const k = visibleKeys(n, causal);
  const t = {
    n, ids, causal, delimiters, fixed, rare, k,
    induction: grid(n, (i, j) => indMul(i, j) && !same(i, j)),
    duplicate: grid(n, (i, j) => copies(i, j) && !indMul(i, j)),
    inductionMul: grid(n, indMul),
    duplicateMul: grid(n, dup),
    tokenRules: grid(n, (i, j) => (i !== j && same(i, j)) || indMul(i, j)),
    previousMul: grid(n, (i, j) => j === i - 1),
    first: Uint8Array.from({ length: n }, (_, j) => (j === 0 ? 1 : 0)),
  };
  // offset_mass's targets: key i + shift, visible, from a query with a choice
  t.shift = Object.fromEntries([-1, 0, 1].map((d) => [d, grid(n, (i, j) => j === i + d && j < k[i] && k[i] >= 2)]));
  t.positional = positionalTable(t);
  return t;
}

// positional_score's head-independent part: which (query, offset) pairs count, how many reach each
function positionalTable(t) {
  const { n, k } = t;
  const D = 2 * n - 1;
  const ok = new Uint8Array(n * D), reach = new Array(D).fill(0);
  for (let i = 0; i < n; i++) for (let d = 0; d < D; d++) {
    const key = i + d - (n - 1);
    if (key >= 0 && key < k[i] && k[i] >= 2 && !t.tokenRules[i * n + key]) { ok[i * D + d] = 1; reach[d]++; }
  }
  return { D, ok, reach, need: Math.max(1, k.filter((v) => v >= 2).length / 2) };
}

// rare_word_targets for one sequence: wordIndex (n,) each token's word (−1 none), zipf per word
export function rareTargets(wordIndex, zipf, causal) {
  const n = wordIndex.length;
  const inWord = new Uint8Array(n);
  const known = zipf.filter((z) => !Number.isNaN(z));
  if (known.length) {
    const lowest = Math.min(...known);
    for (let j = 0; j < n; j++) inWord[j] = wordIndex[j] >= 0 && zipf[wordIndex[j]] === lowest ? 1 : 0;
  }
  const rare = Uint8Array.from(inWord);
  rare[0] = 0;  // where a sink rests: attention there says nothing about rarity
  const any = rare.some((r) => r);
  const rows = new Uint8Array(n);
  let seen = false;
  for (let i = 0; i < n; i++) {
    seen = seen || rare[i] === 1;
    rows[i] = (causal ? seen : any) && !inWord[i] && wordIndex[i] >= 0 ? 1 : 0;
  }
  return { rare, rows };
}

// mass_where_possible: the attention on the target keys, averaged over the rows that have one
function massWherePossible(A, target, n) {
  let total = 0, count = 0;
  for (let i = 0; i < n; i++) {
    let hit = 0, any = false;
    for (let j = 0; j < n; j++) if (target[i * n + j]) { any = true; hit += A[i * n + j]; }
    if (any) { total += hit; count++; }
  }
  return count ? f32(total / count) : 0;
}

// resting_weight: the mean weight on key 0 over the rows marked idle (n,)
function restingWeight(A, idle, n) {
  let total = 0, count = 0;
  for (let i = 0; i < n; i++) if (idle[i]) { total += A[i * n]; count++; }
  return count ? f32(total / count) : 0;
}

// pattern_score, TransformerLens's "mul": Σ(A ⊙ P) / ΣA
function mulScore(A, P, n) {
  let hit = 0, all = 0;
  for (let k = 0; k < n * n; k++) { all += A[k]; if (P[k]) hit += A[k]; }
  return all > 0 ? f32(hit / all) : 0;
}

// key_mass_score: the share of all attention that falls on the marked keys (n,)
function keyMass(A, keys, n) {
  let hit = 0, all = 0;
  for (let i = 0; i < n; i++) for (let j = 0; j < n; j++) { all += A[i * n + j]; if (keys[j]) hit += A[i * n + j]; }
  return all > 0 ? f32(hit / all) : 0;
}

function offsetMass(A, shift, t) {
  return massWherePossible(A, t.shift[shift], t.n);
}

function argmaxRow(A, i, n) {
  let best = 0;
  for (let j = 1; j < n; j++) if (A[i * n + j] > A[i * n + best]) best = j;
  return best;
}

// positional_score: the share of queries whose argmax falls at the most common offset δ
function positional(A, t) {
  const { n } = t;
  const { D, ok, reach, need } = t.positional;
  const counts = new Array(D).fill(0);
  for (let i = 0; i < n; i++) {
    const d = argmaxRow(A, i, n) - i + (n - 1);
    if (ok[i * D + d]) counts[d]++;
  }
  let best = 0;
  const masked = counts.map((c, d) => (reach[d] >= need ? c : -1));
  for (let d = 1; d < D; d++) if (masked[d] > masked[best]) best = d;
  return { score: f32(counts[best] / Math.max(reach[best], 1)), offset: best - (n - 1) };
}

function rareWord(A, rare, rows, n) {
  let hit = 0, count = 0;
  for (let i = 0; i < n; i++) if (rows[i]) { count++; if (rare[argmaxRow(A, i, n)]) hit++; }
  return count ? f32(hit / count) : 0;
}

function diffuse(A, t) {
  const { k } = t;
  let total = 0, rows = 0;
  for (let i = 0; i < t.n; i++) {
    if (k[i] < 2) continue;
    let h = 0;
    for (let j = 0; j < t.n; j++) { const a = A[i * t.n + j]; if (a > 0) h -= a * Math.log(a); }
    total += h / Math.log(k[i]); rows++;
  }
  return rows ? f32(total / rows) : 0;
}

// content_score's head-independent part: each query's movable keys V_i (sees), their count,
// and the keys the score leaves out (where a content head's rest is read)
function contentTable(t) {
  if (t.content) return t.content;
  const { n, causal, fixed } = t;
  // the first position is left out whatever it holds: heads rest there (attention sinks)
  const leftOut = fixed.map((v, j) => (j === 0 ? 1 : v));
  const sees = grid(n, (i, j) => !leftOut[j] && (!causal || j <= i));
  const size = Array.from({ length: n }, (_, i) => sees.subarray(i * n, (i + 1) * n).reduce((a, b) => a + b, 0));
  t.content = { sees, size, leftOut };
  return t.content;
}

// content_score: the share of the head's attention its own position profile does not explain,
// by offset (cell i − j) and by key position (cell j), leave-one-out, each row weighted by its
// share on movable keys; the smaller of the two
function content(A, t) {
  const { n } = t;
  const { sees, size } = contentTable(t);
  const u = new Float64Array(n * n), pooled = new Uint8Array(n * n), w = new Float64Array(n);
  for (let i = 0; i < n; i++) {
    let m = 0;
    for (let j = 0; j < n; j++) if (sees[i * n + j]) m += A[i * n + j];
    w[i] = m;
    if (size[i] < 2 || !(m > 0)) continue;
    for (let j = 0; j < n; j++) if (sees[i * n + j]) { u[i * n + j] = (A[i * n + j] * size[i]) / m; pooled[i * n + j] = 1; }
  }
  let best = Infinity;
  for (const cell of [(i, j) => i - j + n - 1, (i, j) => j]) best = Math.min(best, unexplained(u, pooled, w, size, n, cell));
  return f32(Math.min(1, Math.max(0, best)));
}

// Σ_i w_i (1 − overlap(Â_i, P_i)) / (rows with two keys) for one profile: P_i the w-weighted mean of the
// other rows' u at each key's cell, on the keys whose cell another row sees
function unexplained(u, pooled, w, size, n, cell) {
  const total = new Float64Array(2 * n), weight = new Float64Array(2 * n), count = new Float64Array(2 * n);
  for (let i = 0; i < n; i++) for (let j = 0; j < n; j++) {
    const k = i * n + j;
    if (pooled[k]) { const c = cell(i, j); total[c] += w[i] * u[k]; weight[c] += w[i]; count[c]++; }
  }
  const p = new Float64Array(n), q = new Float64Array(n);
  let num = 0, den = 0;
  for (let i = 0; i < n; i++) {
    // every row with two keys counts, whatever its share there: a rest on a fixed key is explained
    if (size[i] >= 2) den++;
    let any = false, ma = 0, mb = 0;
    p.fill(0); q.fill(0);
    for (let j = 0; j < n; j++) {
      const k = i * n + j, c = cell(i, j);
      if (!pooled[k] || count[c] - 1 < 1) continue;
      any = true;
      p[j] = u[k]; q[j] = (total[c] - w[i] * u[k]) / Math.max(weight[c] - w[i], 1e-30); ma += p[j]; mb += q[j];
    }
    if (!any) continue;
    let overlap = 0;
    for (let j = 0; j < n; j++) overlap += Math.min(p[j] / Math.max(ma, 1e-12), q[j] / Math.max(mb, 1e-12));
    num += w[i] * (1 - overlap);
  }
  return num / Math.max(den, 1e-30);
}

// the rows off each type's targets (where resting_weight looks), per probe
function idleRows(t) {
  const rows = (m) => Uint8Array.from({ length: t.n }, (_, i) => (m.subarray(i * t.n, (i + 1) * t.n).some((v) => v) ? 0 : 1));
  return { duplicate: rows(t.duplicate), induction: rows(t.induction), rare: t.rare ? t.rare.rows.map((v) => 1 - v) : null };
}

// pattern_scores for one head: A (n, n) on the probe's tokens
export function headScores(A, t) {
  const pos = positional(A, t);
  const scores = { previous: offsetMass(A, -1, t) };
  if (!t.causal) scores.next = offsetMass(A, 1, t);
  scores.self = offsetMass(A, 0, t);
  scores.positional = pos.score;
  scores.duplicate = massWherePossible(A, t.duplicate, t.n);
  scores.induction = massWherePossible(A, t.induction, t.n);
  t.idle ??= idleRows(t);
  const rests = { duplicate: restingWeight(A, t.idle.duplicate, t.n), induction: restingWeight(A, t.idle.induction, t.n) };
  scores.content = content(A, t);
  rests.content = keyMass(A, contentTable(t).leftOut, t.n);
  if (t.rare) {
    scores.rare_word = rareWord(A, t.rare.rare, t.rare.rows, t.n);
    rests.rare_word = restingWeight(A, t.idle.rare, t.n);
  }
  scores.first_token = keyMass(A, t.first, t.n);
  scores.delimiter = keyMass(A, t.delimiters, t.n);
  scores.diffuse = diffuse(A, t);
  scores.previous_mul = mulScore(A, t.previousMul, t.n);
  scores.duplicate_mul = mulScore(A, t.duplicateMul, t.n);
  scores.induction_mul = mulScore(A, t.inductionMul, t.n);
  return { scores, offset: pos.offset, rests };
}

// label_head: tier by tier, the passing type by the widest share of the way to 1; floors gate
export function labelHead(scores, offset, rules, floors) {
  for (const tier of rules.tiers) {
    let best = null, margin = -Infinity;
    for (const k of tier) {
      if (!(k in scores)) continue;
      const need = Math.max(rules.thresholds[k], floors?.[k] ?? 0);
      if (scores[k] < need) continue;
      const m = (scores[k] - rules.thresholds[k]) / (1 - rules.thresholds[k]);
      if (m > margin) { best = k; margin = m; }
    }
    if (best === "positional") return rules.offset_labels[String(offset)] ?? "positional";
    if (best) return rules.labels[best];
  }
  return "mixed";
}

// every head of every layer: weights (L, h, n, n) and averaged (L, n, n)
export function scoreLayers(run, t) {
  const { L, h, n } = run;
  const out = [];
  for (let l = 0; l < L; l++) {
    for (let k = 0; k <= h; k++) {
      const pick = (r) => (k < h ? r.weights.subarray(((l * h) + k) * n * n, ((l * h) + k + 1) * n * n) : r.averaged.subarray(l * n * n, (l + 1) * n * n));
      out.push({ layer: l, head: k < h ? k : -1, ...headScores(pick(run), t) });
    }
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

const round4 = (v) => Math.round(v * 1e4) / 1e4;

// one head's entry as HeadScore.to_dict writes it (scores unrounded: the browser's own numbers)
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
    best[kind] = { layer: top.layer, head: top.head, score: round4(value), passes_threshold: value >= rules.thresholds[score], label: top.label, labelled: labelled.length > 0 };
  }
  const layers = [...new Set(heads.map((s) => s.layer))].sort((a, b) => a - b).map((layer) => {
    const mine = heads.filter((s) => s.layer === layer);
    const sinks = mine.filter((s) => s.scores.first_token > rules.sink_threshold).map((s) => s.head);
    return { layer, share: round4(sinks.length / mine.length), heads: sinks };
  });
  return { heads, averaged, best, thresholds: rules.thresholds, sinks: { threshold: rules.sink_threshold, layers } };
}

// analyse(model, probe) and analyse(model, probe, floors=…) of one text probe from its runs:
// main the model's, randoms each random-weights model's, where a run is
// {L, h, n, weights (L, h, n, n), averaged (L, n, n)} on the probe's tokens (one forward each).
// Returns both reports and the floors.
export function analyseRuns(probe, main, randoms, config) {
  const rare = rareTargets(probe.wordIndex, probe.zipf, config.causal);
  const fixed = Uint8Array.from(probe.movable, (m) => (m ? 0 : 1));
  const t = buildTargets(probe.ids, config.causal, Uint8Array.from(probe.delimiters, Number), fixed, rare);
  const scored = scoreLayers(main, t);
  const floors = floorsOf(randoms.map((r) => scoreLayers(r, t)), config.rules);
  return { thresholds: report(scored, config.rules, null), gated: report(scored, config.rules, floors), floors };
}
