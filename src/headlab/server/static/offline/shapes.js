// Widget 1 in the browser: headlab.shapes.trace_shapes's report, in closed form. The Python traces
// the real layer on the meta device; here each stage's shape is written out from the same table
// (headlab/shapes/config.py STAGES), and tests/browser/test_static_site.py checks the two equal
// over hundreds of random sizes, valid and invalid. Counts are BigInt (FLOPs reach 2**62).

const ITEMSIZE = { float32: 4n, fp32: 4n, float16: 2n, fp16: 2n, half: 2n, bfloat16: 2n, bf16: 2n, float64: 8n, fp64: 8n };
const CANONICAL = { fp32: "float32", fp16: "float16", half: "float16", bf16: "bfloat16", fp64: "float64" };
const LARGE_ELEMENTS = 2n ** 40n, MAX_ELEMENTS = 2n ** 50n, MAX_FLOPS = 2n ** 62n;
const STAGES = {
  x: ["input X", "B×n×d_model"], q_proj: ["Q = X·W_Q", "B×n×h·d_k"], k_proj: ["K = X·W_K", "B×n×h_kv·d_k"],
  v_proj: ["V = X·W_V", "B×n×h_kv·d_k"], q: ["Q split into heads", "B×h×n×d_k"], k: ["K split into heads", "B×h_kv×n×d_k"],
  v: ["V split into heads", "B×h_kv×n×d_k"], k_all: ["K, cached + new", "B×h_kv×s×d_k"], v_all: ["V, cached + new", "B×h_kv×s×d_k"],
  k_rep: ["K expanded to h heads", "B×h×s×d_k"], v_rep: ["V expanded to h heads", "B×h×s×d_k"],
  scores: ["scores QKᵀ/√d_k", "B×h×n×s"], weights: ["weights A = softmax", "B×h×n×s"],
  head_out: ["head outputs A·V", "B×h×n×d_k"], merged: ["heads merged", "B×n×h·d_k"], out: ["Y = merged·W_O", "B×n×d_model"],
};

// Python's "{:,}" for an integer (Number or BigInt)
const group = (v) => String(v).replace(/\B(?=(\d{3})+(?!\d))/g, ",");
const big = (v) => BigInt(v);
const num = (v) => Number(v);

// a / b for BigInts, correctly rounded as Python's int / int is (a sticky bit keeps the rounding exact)
function ratio(a, b) {
  if (a < 2n ** 53n && b < 2n ** 53n) return num(a) / num(b);
  const k = 128n;
  let q = (a << k) / b;
  if ((a << k) % b) q |= 1n;
  return num(q) / 2 ** 128;
}

export function validHeadCounts(d) {
  const small = [];
  for (let h = 1; h * h <= d; h++) if (d % h === 0) small.push(h);
  return [...new Set([...small, ...small.map((h) => d / h)])].sort((a, b) => a - b);
}

function nearest(value, of) {
  const ds = validHeadCounts(of);
  const below = ds.filter((d) => d < value), above = ds.filter((d) => d > value);
  return [...(below.length ? [below[below.length - 1]] : []), ...(above.length ? [above[0]] : [])];
}

function short(values, limit = 16) {
  if (values.length <= limit) return values.join(", ");
  return values.slice(0, limit / 2).join(", ") + ", …, " + values.slice(-limit / 2).join(", ");
}

function sizesOf(c) {
  const h_kv = c.n_kv_heads == null ? c.n_heads : c.n_kv_heads;
  const d_k = c.d_k != null ? c.d_k : c.n_heads > 0 ? Math.floor(c.d_model / c.n_heads) : 0;  // a given head width, else d_model / h
  return { B: c.batch, n: c.seq_len, s: c.cache_len + c.seq_len, d_model: c.d_model, h: c.n_heads, h_kv, d_k };
}

function stageFlops(z, name) {
  const [B, n, s, d, h, hkv, dk] = [z.B, z.n, z.s, z.d_model, z.h, z.h_kv, z.d_k].map(big);
  const tokens = B * n, pattern = B * h * n * s;
  return { q_proj: 2n * tokens * d * h * dk, k_proj: 2n * tokens * d * hkv * dk, v_proj: 2n * tokens * d * hkv * dk,
    scores: 2n * pattern * dk, head_out: 2n * pattern * dk, out: 2n * tokens * h * dk * d }[name] ?? 0n;
}

function problemsOf(c, z) {
  const [B, n, s, d, h, dk] = [z.B, z.n, z.s, z.d_model, z.h, z.d_k].map(big);
  const largest = [B * n * d, B * h * n * s, d * d, B * h * s * dk, h * dk * d, B * n * h * dk].reduce((a, b) => (a > b ? a : b));
  if (largest > MAX_ELEMENTS) {
    return [`the largest tensor would hold ${group(largest)} elements (about 2**${Math.log2(num(largest)).toFixed(0)}), over the limit of 2**50; choose smaller sizes`];
  }
  const problems = [];
  if (c.d_k == null && z.d_model % z.h) problems.push(`d_model=${z.d_model} is not divisible by n_heads=${z.h}, so the heads cannot split the width evenly; nearest valid head counts: ${nearest(z.h, z.d_model).join(" or ")} (any divisor of ${z.d_model}: ${short(validHeadCounts(z.d_model))})`);
  if ((z.h <= z.d_model || c.d_k != null) && z.h % z.h_kv) problems.push(`n_heads=${z.h} is not divisible by n_kv_heads=${z.h_kv}, so the query heads cannot share K/V heads in equal groups; nearest valid K/V head counts: ${nearest(z.h_kv, z.h).join(" or ")} (any divisor of ${z.h}: ${short(validHeadCounts(z.h))})`);
  const flops = Object.keys(STAGES).reduce((a, k) => a + stageFlops(z, k), 0n);
  if (!problems.length && flops > MAX_FLOPS) problems.push(`the layer would take ${group(flops)} FLOPs (about 2**${Math.log2(num(flops)).toFixed(0)}), over the limit of 2**62; choose a smaller batch, sequence or width`);
  return problems;
}

function symbolic(c, z, pattern) {
  const same = z.h_kv === z.h ? { h_kv: "h" } : {};
  if (c.cache_len === 0) same.s = "n";
  return pattern.split("×").map((dim) => dim.split("·").map((f) => same[f] ?? f).join("·")).join("×");
}

function stageShapes(z, cached) {
  const { B, n, s, d_model: d, h, h_kv: hkv, d_k: dk } = z;
  const out = { x: [B, n, d], q_proj: [B, n, h * dk], k_proj: [B, n, hkv * dk], v_proj: [B, n, hkv * dk],
    q: [B, h, n, dk], k: [B, hkv, n, dk], v: [B, hkv, n, dk] };
  if (cached) Object.assign(out, { k_all: [B, hkv, s, dk], v_all: [B, hkv, s, dk] });
  if (hkv !== h) Object.assign(out, { k_rep: [B, h, s, dk], v_rep: [B, h, s, dk] });
  return Object.assign(out, { scores: [B, h, n, s], weights: [B, h, n, s], head_out: [B, h, n, dk], merged: [B, n, h * dk], out: [B, n, d] });
}

// Python's "{:.1f}": JavaScript's toFixed rounds an exact tie up, Python to the even digit.
// A double is a tie at one decimal exactly when 4·x is an odd integer (x = k + 0.25 or k + 0.75).
function fixed1(x) {
  const q = x * 4;
  if (!Number.isInteger(q) || Math.abs(q) % 2 !== 1) return x.toFixed(1);
  let n = Math.floor(x * 10);
  if (n % 2) n += 1;
  return (n / 10).toFixed(1);
}

export function formatBytes(n) {
  for (const unit of ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]) {
    if (Math.abs(n) < 1024 || unit === "PiB") {
      const [whole, frac] = (unit === "B" ? n.toFixed(0) : fixed1(n)).split(".");
      return `${group(whole)}${frac === undefined ? "" : "." + frac} ${unit}`;
    }
    n /= 1024;
  }
}

const g6 = (x) => String(Number(x.toPrecision(6)));  // Python's "{:g}" for the ratios met here

function summary(r, c) {
  const p = r.params, fl = r.flops, mem = r.memory, kv = r.kv_cache;
  const mha = c.kind === "MHA" && c.bias && c.sizes.h * c.sizes.d_k === c.d_model;
  const compared = kv.ratio_vs_mha !== 1
    ? `plain MHA would hold ${formatBytes(kv.mha_bytes)}, ${g6(kv.ratio_vs_mha)}× as much`
    : "this is MHA: every head keeps its own keys and values";
  return [
    "parameters: " + Object.entries(p).map(([k, v]) => `${k} ${group(v)}`).join(", ") + (mha ? " (= 4·d_model² + 4·d_model)" : ""),
    `FLOPs: ${group(r.flopsBig)}; ${fixed1(fl.n2_share * 100)}% of them in QKᵀ and A·V, the n·s part (a multiply-add counts 2; bias, scale and softmax are not counted)`,
    `attention pattern (scores + weights): ${formatBytes(mem.n2_bytes)}; all activations ${formatBytes(mem.activation_bytes)}`,
    `KV cache: ${formatBytes(kv.bytes_per_token)} per token, ${formatBytes(kv.bytes)} for ${group(kv.tokens)} tokens (B·s); ${compared}`,
    ...r.warnings.map((w) => `warning: ${w}`),
    `verdict: ${r.verdict}`,
  ];
}

function empty(config, problems) {
  return { valid: false, problems, warnings: [], config, stages: [], params: { W_Q: 0, W_K: 0, W_V: 0, W_O: 0, total: 0 },
    param_tensors: [], flops: { total: 0, n2: 0, n2_share: 0.0 }, memory: { n2_bytes: 0, activation_bytes: 0, param_bytes: 0 },
    kv_cache_bytes: 0, kv_cache: {}, shape_preserving: false, verdict: "", summary: problems, source: "table" };
}

function params(c, z) {
  const width = { W_Q: [z.h * z.d_k, "h·d_k"], W_K: [z.h_kv * z.d_k, "h_kv·d_k"], W_V: [z.h_kv * z.d_k, "h_kv·d_k"], W_O: [z.d_model, "d_model"] };
  const rows = [];
  for (const [m, [w, sym]] of Object.entries(width)) {
    const fanIn = m === "W_O" ? [z.h * z.d_k, "h·d_k"] : [z.d_model, "d_model"];
    const out = symbolic(c, z, sym);
    rows.push({ name: `${m}.weight`, symbolic: `${out}×${fanIn[1]}`, shape: [w, fanIn[0]], count: w * fanIn[0] });
    if (c.bias) rows.push({ name: `${m}.bias`, symbolic: out, shape: [w], count: w });
  }
  return rows;
}

// the JSON of POST /api/shapes for a request body (the server's defaults filled in)
export function shapesReport(body) {
  const c0 = { d_model: 512, n_heads: 8, seq_len: 10, batch: 1, n_kv_heads: null, bias: true, dtype: "float32", cache_len: 0, d_k: null, ...body };
  const c = { ...c0, dtype: CANONICAL[c0.dtype] ?? c0.dtype };
  const z = sizesOf(c);
  const kind = z.h_kv === z.h ? "MHA" : z.h_kv === 1 ? "MQA" : "GQA";
  const config = { d_model: c.d_model, n_heads: c.n_heads, seq_len: c.seq_len, batch: c.batch, n_kv_heads: c.n_kv_heads,
    bias: c.bias, dtype: c.dtype, cache_len: c.cache_len, d_k: c.d_k, kind, sizes: z };
  const counts = { valid_head_counts: validHeadCounts(c.d_model), valid_kv_head_counts: validHeadCounts(c.n_heads) };
  const problems = problemsOf(c, z);
  if (problems.length) return { ...empty(config, problems), ...counts };
  const item = ITEMSIZE[c.dtype];
  const stages = Object.entries(stageShapes(z, c.cache_len > 0)).map(([name, shape]) => {
    const elements = shape.map(big).reduce((a, b) => a * b, 1n);
    return { name, label: STAGES[name][0], symbolic: symbolic(c, z, STAGES[name][1]), shape, dtype: c.dtype,
      elements: num(elements), bytes: num(elements * item), flops: stageFlops(z, name), n2: name === "scores" || name === "weights", big: elements };
  });
  const flopsBig = stages.reduce((a, st) => a + st.flops, 0n);
  const n2 = stages.filter((st) => st.name === "scores" || st.name === "head_out").reduce((a, st) => a + st.flops, 0n);
  const ptensors = params(c, z);
  const p = { W_Q: 0, W_K: 0, W_V: 0, W_O: 0 };
  for (const t of ptensors) p[t.name.split(".")[0]] += t.count;
  p.total = ptensors.reduce((a, t) => a + t.count, 0);
  const kvBytes = (heads) => big(z.B) * big(heads) * big(z.d_k) * big(z.s) * item * 2n;
  const tokens = z.B * z.s, ours = kvBytes(z.h_kv), mhaB = kvBytes(z.h);
  const kv = { bytes: num(ours), bytes_per_token: num(ours / big(tokens)), tokens, mha_bytes: num(mhaB),
    mha_bytes_per_token: num(mhaB / big(tokens)), ratio_vs_mha: ratio(mhaB, ours), mqa_bytes: num(kvBytes(1)),
    mqa_bytes_per_token: num(kvBytes(1) / big(tokens)),
    // headlab's SinkCache keeps keys before rotary too: three buffers per kept position
    sink_bytes_per_token: num(3n * big(z.h_kv) * big(z.d_k) * item) };
  const bigOnes = stages.filter((st) => st.big > LARGE_ELEMENTS);
  const warnings = bigOnes.length ? [`${bigOnes.map((st) => st.name).join(", ")} would hold over 2**40 elements each (up to ${group(bigOnes.reduce((a, st) => (st.big * item > a ? st.big * item : a), 0n))} bytes): no single accelerator holds that; fused kernels (FlashAttention, SDPA) never store the n·s pattern, and real runs split the batch or the sequence`] : [];
  const maps = z.h * z.d_k === z.d_model ? "h·d_k = d_model back to d_model" : `h·d_k = ${group(z.h * z.d_k)} back to d_model = ${group(z.d_model)}`;
  const verdict = `${kind}, h=${z.h}, h_kv=${z.h_kv}, d_k=${z.d_k}; shape-preserving: B×n×d_model in and out (W_O maps ${maps}), so the output adds onto the residual stream and blocks stack`;
  const flops = { total: num(flopsBig), n2: num(n2), n2_share: flopsBig ? ratio(n2, flopsBig) : 0.0 };
  for (const st of stages) if (st.flops) flops[st.name] = num(st.flops);
  const bytesOf = (list) => num(list.reduce((a, st) => a + st.big * item, 0n));
  const memory = { n2_bytes: bytesOf(stages.filter((st) => st.n2)), activation_bytes: bytesOf(stages), param_bytes: p.total * num(item) };
  const report = { valid: true, problems: [], warnings, config,
    stages: stages.map(({ big: _b, ...st }) => ({ ...st, flops: num(st.flops) })), params: p, param_tensors: ptensors,
    flops, memory, kv_cache_bytes: kv.bytes, kv_cache: kv, shape_preserving: true, verdict };
  report.summary = summary({ ...report, flopsBig }, config);
  report.source = "table";  // a closed form, as headlab.shapes.table_shapes (the server traces)
  return { ...report, ...counts };
}
