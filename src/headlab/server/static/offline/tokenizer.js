// The default model's byte-level BPE tokenizer, read from its tokenizer.json: the same steps as the
// Hugging Face `tokenizers` library for this file (added tokens split off, GPT-2's pre-tokenizer
// regex, bytes mapped to printable characters, merges by rank, the start token prepended).
// tests/browser/test_static_site.py checks it equal to Python's tokenization on many texts.

const SPLIT = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;

// GPT-2's byte → character table: printable bytes stand for themselves, the rest from U+0100 on
function byteTable() {
  const keep = [];
  for (let b = 33; b <= 126; b++) keep.push(b);
  for (let b = 161; b <= 172; b++) keep.push(b);
  for (let b = 174; b <= 255; b++) keep.push(b);
  const table = new Array(256);
  let extra = 0;
  for (let b = 0; b < 256; b++) table[b] = String.fromCodePoint(keep.includes(b) ? b : 256 + extra++);
  return table;
}

export class Tokenizer {
  constructor(json) {
    this.vocab = json.model.vocab;
    this.names = Object.fromEntries(Object.entries(this.vocab).map(([t, i]) => [i, t]));
    this.ranks = new Map(json.model.merges.map((m, r) => [Array.isArray(m) ? m.join(" ") : m, r]));
    this.added = json.added_tokens.map((t) => [t.content, t.id]);
    this.start = json.post_processor.single
      .filter((p) => p.SpecialToken)
      .map((p) => json.post_processor.special_tokens[p.SpecialToken.id].ids)
      .flat();
    this.bytes = byteTable();
    this.cache = new Map();
  }

  // the merges of one pre-token (already in byte characters), lowest rank first
  bpe(word) {
    if (this.cache.has(word)) return this.cache.get(word);
    let parts = Array.from(word);
    while (parts.length > 1) {
      let best = -1, bestRank = Infinity;
      for (let i = 0; i < parts.length - 1; i++) {
        const r = this.ranks.get(parts[i] + " " + parts[i + 1]);
        if (r !== undefined && r < bestRank) { bestRank = r; best = i; }
      }
      if (best < 0) break;
      const pair = parts[best] + parts[best + 1];
      const merged = [];
      for (let i = 0; i < parts.length; i++) {
        if (i < parts.length - 1 && parts[i] + " " + parts[i + 1] === parts[best] + " " + parts[best + 1]) {
          merged.push(pair); i++;
        } else merged.push(parts[i]);
      }
      parts = merged;
    }
    const ids = parts.map((p) => this.vocab[p]);
    this.cache.set(word, ids);
    return ids;
  }

  // ids of a run of ordinary text, and each one's character span [start, end) in code points
  // from `base` (a piece of a split character spans that character, as Hugging Face's offsets)
  encodePlain(text, base = 0) {
    const ids = [], offsets = [];
    const utf8 = new TextEncoder();
    let at = base;
    for (const piece of text.match(SPLIT) || []) {
      const owner = [];  // code point of each byte of the piece
      Array.from(piece).forEach((ch, k) => { for (let b = utf8.encode(ch).length; b > 0; b--) owner.push(at + k); });
      const mapped = Array.from(utf8.encode(piece), (b) => this.bytes[b]).join("");
      let byte = 0;
      for (const id of this.bpe(mapped)) {
        const width = this.names[id].length;
        ids.push(id);
        offsets.push([owner[byte], owner[byte + width - 1] + 1]);
        byte += width;
      }
      at += Array.from(piece).length;
    }
    return { ids, offsets };
  }

  // token ids of `text`, the start token included (what Python's tokenizer.encode gives)
  encode(text) {
    return this.encodeWithOffsets(text).ids;
  }

  // ids and character spans (Python's tokenizer.offsets: code points, the start token (0, 0))
  encodeWithOffsets(text) {
    const ids = [...this.start], offsets = this.start.map(() => [0, 0]);
    const add = (part) => { ids.push(...part.ids); offsets.push(...part.offsets); };
    let rest = text, at = 0;
    while (rest.length) {
      let k = -1, hit = null;
      for (const [content, id] of this.added) {
        const i = rest.indexOf(content);
        if (i >= 0 && (k < 0 || i < k)) { k = i; hit = [content, id]; }
      }
      if (!hit) { add(this.encodePlain(rest, at)); break; }
      const before = rest.slice(0, k), width = Array.from(hit[0]).length;
      add(this.encodePlain(before, at));
      at += Array.from(before).length;
      add({ ids: [hit[1]], offsets: [[at, at + width]] });
      at += width;
      rest = rest.slice(k + hit[0].length);
    }
    return { ids, offsets };
  }

  // the display label of each id, as headlab.zoo's token_strings writes it
  labels(ids) {
    return ids.map((i) => {
      const t = this.names[i];
      return t === undefined ? `<${i}>` : t.replaceAll("Ġ", " ").replaceAll("Ċ", "\\n").replaceAll("▁", " ");
    });
  }
}
