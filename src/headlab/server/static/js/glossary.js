// The page's own words and where each is explained: the definitions live in index.html (the
// glossary, #glossary, and the sections that explain the KV cache and streaming); glossed(text)
// turns a sentence the page builds into text with each term's first use linked to its place.
import { h } from "./dom.js";

// [anchor, what matches it]: the first pattern that matches a stretch of text wins
export const TERMS = [
  ["term-ablation", /\bablat\w*/i],
  ["term-composition", /\b[QKV]-composition\b|\bcompositions?\b/i],
  ["term-nats", /\bnats\b/],
  ["term-floor", /\b(?:random-weights |random )?floors?\b/],
  ["term-margin", /\bmargins?\b/],
  ["term-shuffled", /\bshuffled tokens\b|\bshuffled\b/],
  ["term-rotary", /\brotary\b/],
  ["term-s", /\b[Bn]·s\b/],
  ["kv-cache", /\bKV cache\b/],
  ["streaming", /\bstreaming\b/i],
];

// `text` as a list of strings and links: each term's first match in it links to its anchor.
export function glossed(text) {
  const parts = [String(text)];
  for (const [anchor, pattern] of TERMS) {
    for (let i = 0; i < parts.length; i++) {
      const part = parts[i];
      if (typeof part !== "string") continue;
      const m = pattern.exec(part);
      if (!m) continue;
      const link = h("a", { class: "term", href: `#${anchor}` }, m[0]);
      parts.splice(i, 1, part.slice(0, m.index), link, part.slice(m.index + m[0].length));
      break;
    }
  }
  return parts.filter((p) => p !== "");
}
