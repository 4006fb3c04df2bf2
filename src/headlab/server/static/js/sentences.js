// The sentences the head widget composes from one /api/heads answer. Each says only what the
// figures it quotes support: a head's offset where its label depends on it, where it rests only
// when it does rest there, a syntactic head "best" only when it beats a fixed offset.

// −2, 0, +3: offsets with a true minus sign
export const signed = (k) => (k < 0 ? `−${-k}` : k > 0 ? `+${k}` : "0");
const pct = (v) => `${(100 * Number(v)).toFixed(1)}%`;
// the positional offsets the label rule names by themselves (headlab.heads.labels.OFFSET_LABELS)
const OFFSET_NAMES = { "-1": "previous-token", 0: "current-token", 1: "next-token" };

// "attends 2 tokens back (offset −2)"
export function offsetWords(offset) {
  const k = Math.abs(offset);
  if (!k) return "attends to its own token (offset 0)";
  return `attends ${k} token${k > 1 ? "s" : ""} ${offset < 0 ? "back" : "ahead"} (offset ${signed(offset)})`;
}

// Where the head rests, said only when the figure shows it resting: at least the sink share the
// answer uses (Gu et al.'s ε). A content head's figure is its weight on the keys the content
// score leaves out (the first position, fixed keys); the others' is the first token's weight
// on the rows where they have nothing to do.
export function restWords(label, rest, threshold) {
  if (rest === null || rest === undefined || !(Number(rest) >= threshold)) return "";
  const v = Number(rest).toFixed(2);
  return label === "content"
    ? `; ${v} of its attention goes to the tokens the content score leaves out (the first position, [CLS], [SEP])`
    : `; on the rows where it has nothing to do it rests on the first token (${v} of its weight)`;
}

// An induction head's two figures (headlab.heads.labels.NEEDS): its label rests on the share of
// the attention it does not rest on the first token that goes to the token after an earlier
// copy, beside the share of all its attention there, which must reach a minimum too.
function inductionWords(scores) {
  const all = Number(scores?.induction), active = Number(scores?.induction_active);
  if (!Number.isFinite(all) || !Number.isFinite(active)) return "";
  return `; where its token occurred before, ${all.toFixed(2)} of its attention goes to the token after the earlier copy: ${active.toFixed(2)} of what it does not rest on the first token`;
}

// Why the head with the highest score of `type` carries another label.
function otherLabel(type, best, row, needs) {
  const need = needs?.[`${type}_active`];
  if (best.passes_threshold === false && need && Number(row?.scores?.[need.score]) < need.min) {
    return `; it gives the copy only ${Number(row.scores[need.score]).toFixed(2)} of its attention where it can act, under the ${need.min} a label needs (it rests on the first token almost always)`;
  }
  if (best.passes_threshold === false) return "; below the threshold for that label";
  if (type === "positional" && OFFSET_NAMES[row?.offset] === best.label) {
    return `; its fixed offset is ${signed(row.offset)}, and a positional head at offset −1, 0 or +1 is called previous-token, current-token or next-token`;
  }
  return "; it passes that threshold too, but the label rule gives a head the label it fits best (a named pattern before content, content before where it rests; within those, the widest margin over the threshold)";
}

// The status line of a pick by type: best = answer.best[type], row = that head's row.
export function typeSentence(answer, type, best, row) {
  const score = Number(best.score).toFixed(3);
  const name = `${best.layer}.${best.head}`;
  if (!best.labelled) {
    return `No head is labelled ${type} on this input; the highest ${type} score is head ${name} (${score}), labelled ${best.label}${otherLabel(type, best, row, answer.needs)}.`;
  }
  const where = type === "positional" && row ? `, ${offsetWords(row.offset)}` : "";
  const copies = type === "induction" ? inductionWords(row?.scores) : "";
  const rest = restWords(row?.label, row?.rest, answer.sinks?.threshold ?? 0.3);
  return `Best ${type} head: ${name} (score ${score})${where}${copies}${rest}.`;
}

// The status line of a syntactic pick: one relation's best head against the best fixed offset.
export function syntaxSentence(syntax, row, threshold, labelled) {
  const arcs = `${pct(row.accuracy)} of ${row.count} arcs (${row.direction})`;
  const offset = `${pct(row.baseline_accuracy)} for the best fixed offset (${signed(row.baseline_offset)})`;
  const margin = Number(row.accuracy) - Number(row.baseline_accuracy);
  const head = `${row.layer}.${row.head}`;
  let text;
  if (margin <= 0) {
    text = `No head follows ${row.relation} arcs better than a fixed offset on the evaluation text: the closest, head ${head}, gets ${arcs} against ${offset}.`;
  } else {
    const short = margin < threshold ? `: ${(100 * margin).toFixed(1)} points better, short of the ${Math.round(100 * threshold)} points a syntactic label needs` : "";
    text = `Best ${row.relation} head on the evaluation text (${syntax.relations.length} relations, Clark et al. 2019): ${head}, ${arcs} against ${offset}${short}.`;
  }
  const labels = labelled ? " The labels take the syntactic score into account." : " The labels leave the syntactic score out (tick “label heads by syntax too” to let it in).";
  return `${text}${labels}${syntax.note ? ` ${syntax.note}` : ""}`;
}
