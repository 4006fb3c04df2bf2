// What a stored chart shows where it looks wrong, said from its own numbers (GET
// /api/experiments/NAME): each sentence appears only when the data has the feature it explains.

const v3 = (x) => Number(x).toPrecision(3);
const ordinal = (k) => `${k}${[11, 12, 13].includes(k % 100) ? "th" : ({ 1: "st", 2: "nd", 3: "rd" })[k % 10] || "th"}`;

// The longest run of points (index ≥ 1) at which `a` lies above `b`.
function longestAbove(a, b) {
  let run = [], best = [];
  for (let k = 1; k < a.length; k += 1) {
    run = a[k] > b[k] ? [...run, k] : [];
    if (run.length > best.length) best = run;
  }
  return best;
}

// One model of `headlab experiment prune`: why its importance curve can fall as a head goes and
// run above the random orders' mean. The importance is Michel et al.'s |∂L/∂ξ_h|, measured once
// on the whole model (headlab.ablation.head_importance): its size, whatever its sign.
export function pruneNote(m) {
  const curve = m.importance_curve?.losses || [], random = m.random_mean_losses || [];
  if (curve.length < 3 || random.length !== curve.length) return null;
  const order = m.importance_curve.order || [];
  const removed = m.importance_curve.removed || curve.map((_, k) => k);
  let fall = 0, at = 0;
  for (let k = 1; k < curve.length; k += 1) if (curve[k - 1] - curve[k] > fall) [fall, at] = [curve[k - 1] - curve[k], k];
  const parts = [];
  const worse = longestAbove(curve, random);
  const fell = fall >= 0.05 * Math.abs(curve[0]);
  let which = "";
  if (fell) {
    const first = removed[at - 1] + 1, last = removed[at];
    const name = order[last - 1], label = m.labels?.[name];
    which = first === last ? `head ${name}${label ? ` (${label})` : ""}` : `heads ${first} to ${last} of the order`;
    parts.push(`Removing ${which}${first === last ? `, the ${ordinal(last)} to go,` : ""} takes the loss down, from ${v3(curve[at - 1])} to ${v3(curve[at])}: the loss on this text is better without ${first === last ? "it" : "them"}, yet the importance order kept ${first === last ? "it" : "them"} late. A head's importance is the size of the loss's slope as its output is scaled down (Michel et al. 2019), measured once on the whole model, whatever the slope's sign: a head whose removal lowers the loss ranks as high as one whose removal raises it.`);
  }
  if (worse.length >= 2) {
    const kept = fell && at >= worse[0] && at <= worse.at(-1) + 1;
    parts.push(`From ${removed[worse[0]]} to ${removed[worse.at(-1)]} heads removed the importance order does worse than the mean of ${(m.random_curves || []).length || "its"} random orders${kept ? `: it had kept ${which}` : ": one measurement on the whole model does not foresee how the heads left work once others are gone"}.`);
  }
  return parts.length ? parts.join(" ") : null;
}

// The decode-speed chart of `headlab experiment gqa`: a variant that decoded faster with more
// cached positions than with fewer. Each new token attends to every cached position, so more
// positions cannot be faster: that point is a disturbance of the timing, not a property of the
// variant.
export function gqaNote(r) {
  const rows = Array.isArray(r.decode) ? r.decode : [];
  const odd = [];
  for (const k of new Set(rows.map((row) => row.n_kv_heads))) {
    const mine = rows.filter((row) => row.n_kv_heads === k).sort((a, b) => a.context - b.context);
    for (let i = 1; i < mine.length; i += 1) if (mine[i].tokens_per_s > mine[i - 1].tokens_per_s) odd.push([k, mine[i - 1], mine[i]]);
  }
  if (!odd.length) return null;
  const said = odd.map(([k, a, b]) => `h_kv = ${k} decoded faster with ${b.context} cached positions (${b.tokens_per_s.toFixed(1)} tokens/s, ×${b.ratio_vs_mha.toFixed(2)} MHA's) than with ${a.context} (${a.tokens_per_s.toFixed(1)})`);
  const c = r.config || {};
  const timing = c.repeats && c.decode_tokens ? ` Each point is the median of ${c.repeats} timings of ${c.decode_tokens} new tokens, the variants timed in turn; the run keeps the medians, not their spread.` : "";
  return `${said.join("; ")}. Every new token attends to all the cached positions, so more of them cannot make decoding faster: that point is a disturbance of the timing, not a gain of sharing keys; read the trend from the others.${timing}`;
}
