// What the token labels on the axes are, said once beside them: byte-level BPE's letters for
// bytes ("âĢĶ" is the three bytes of "—"), WordPiece's "##", the special tokens a tokenizer adds.

// GPT-2's byte ↔ letter table (Radford et al. 2019, its encoder.py bytes_to_unicode): the 188
// printable bytes stand for themselves; the other 68 (0–32, 127–160, 173), in order, become the
// letters U+0100 … U+0143 (Ā … Ń), so that a space is Ġ and a newline Ċ.
const printable = (b) => (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
const BYTE_OF = new Map();
for (let b = 0, n = 0; b < 256; b += 1) BYTE_OF.set(String.fromCharCode(printable(b) ? b : 256 + n++), b);
const letterOf = (b) => [...BYTE_OF].find(([, v]) => v === b)[0];

// The bytes a byte-level token label stands for (the page shows Ġ as a space, Ċ as "\n"), or
// null when a letter is not one of the table's.
function toBytes(label) {
  const out = [];
  for (const ch of label.replace(/\\n/g, "Ċ").replace(/ /g, "Ġ")) {
    if (!BYTE_OF.has(ch)) return null;
    out.push(BYTE_OF.get(ch));
  }
  return out;
}

function utf8(bytes) {
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(new Uint8Array(bytes));
  } catch {
    return null;
  }
}

const CONTROL = /[\x00-\x1f\x7f-\x9f]/;

// The first run of tokens whose letters are the UTF-8 bytes of a printable character beyond
// ASCII ("â" "Ģ" "Ķ" → "—"): {tokens, bytes, text}; else the first letter that stands for a byte
// with no letter of its own (a control byte, random tokens' "Ĝ"): {tokens, bytes, text: null};
// else null (a WordPiece model, or plain ASCII text).
export function byteExample(tokens) {
  for (let i = 0; i < tokens.length; i += 1) {
    if (!/[^\x00-\x7f]/.test(tokens[i])) continue;
    const bytes = [];
    for (let j = i; j < Math.min(tokens.length, i + 4); j += 1) {
      const more = toBytes(tokens[j]);
      if (!more) break;
      bytes.push(...more);
      const text = utf8(bytes);
      if (text !== null && /[^\x00-\x7f]/.test(text) && !CONTROL.test(text)) return { tokens: tokens.slice(i, j + 1), bytes, text };
    }
  }
  for (const token of tokens) {
    const ch = [...token].find((c) => c.charCodeAt(0) >= 0x100 && BYTE_OF.has(c) && c !== letterOf(32) && c !== letterOf(10));
    if (ch) return { tokens: [ch], bytes: [BYTE_OF.get(ch)], text: null };
  }
  return null;
}

const hex = (bytes) => bytes.map((b) => b.toString(16).toUpperCase().padStart(2, "0")).join(" ");
const quoted = (list) => list.map((t) => `“${t}”`).join(" ");

// One note on the tokens of an answer, or "" when nothing in them needs one.
export function tokenNote(model, tokens) {
  const parts = [];
  const special = [...new Set(tokens.filter((t) => /^(<\|.*\|>|\[[A-Z]+\])$/.test(t) && t !== "[UNK]"))];
  if (special.length) parts.push(`${quoted(special)} ${special.length > 1 ? "are special tokens" : "is a special token"} the tokenizer adds, not part of the text.`);
  if (tokens.includes("[UNK]")) parts.push("“[UNK]” stands for a character the tokenizer has no piece for.");
  const piece = tokens.find((t) => t.startsWith("##"));
  if (piece) parts.push(`“${piece}” continues the word before it: ${model}'s tokenizer (WordPiece) marks a piece that does not start a word with ##.`);
  const ex = byteExample(tokens);
  if (ex) {
    parts.push(`Tokens like ${quoted(ex.tokens)} are bytes, not letters: ${model}'s tokenizer (byte-level BPE, as GPT-2's) works on the text's UTF-8 bytes and writes each byte as one letter. `
      + `The printable bytes stand for themselves; the other 68 (the space, control bytes, 7F to A0, AD) become Ā to Ń: a space is ${letterOf(32)}, shown here as a space, and a newline ${letterOf(10)}, shown as \\n. `
      + (ex.text === null ? `Here “${ex.tokens[0]}” is the byte ${hex(ex.bytes)}, ${ex.bytes[0] < 0x80 ? "a control character with no letter of its own" : "one byte of a character that UTF-8 writes in several"}.` : `Here ${quoted(ex.tokens)} are the bytes ${hex(ex.bytes)}: “${ex.text}”.`));
  }
  return parts.join(" ");
}
