// The words of a text and their English frequencies, for the rare-word score: a port of
// headlab.measure's token_words, is_punctuation and word_zipf (wordfreq's zipf_frequency for
// English, looked up in wordfreq's own table, shipped as words-en.txt.gz by the site build).
// tests/unit/test_site_scores.py checks it equal to Python's on many words and texts.
// Positions are code points (Python's string indices), not UTF-16 units.

const WORD = /[\p{L}\p{N}_]+(?:['’][\p{L}\p{N}_]+)*|[^\p{L}\p{N}_\s]/gu;  // measure.WORD
const PUNCT = /^[\p{P}!"#$%&'()*+,\-./:;<=>?@[\\\]^_`{|}~]+$/u;         // string.punctuation or P*

export function isPunctuation(label) {
  return PUNCT.test(label.trim());
}

// code point index of each UTF-16 index of `text` (one past the end included)
function codePoints(text) {
  const at = new Array(text.length + 1);
  let cp = 0;
  for (let u = 0; u < text.length; ) {
    const width = text.codePointAt(u) > 0xffff ? 2 : 1;
    for (let k = 0; k < width; k++) at[u + k] = cp;
    u += width; cp++;
  }
  at[text.length] = cp;
  return at;
}

// token_words: which word each token belongs to (−1: special or outside every word), and the words
export function tokenWords(text, offsets, special) {
  const at = codePoints(text);
  const chars = Array.from(text);
  const spans = [...text.matchAll(WORD)].map((m) => [at[m.index], at[m.index + m[0].length]]);
  const starts = spans.map(([a]) => a);
  const index = offsets.map(([a, b], t) => {
    while (a < b && /\s/u.test(chars[a])) a++;
    let k = -1;
    for (let s = 0; s < starts.length && starts[s] <= a; s++) k = s;
    return !special[t] && a < b && k >= 0 && a < spans[k][1] ? k : -1;
  });
  return { index, words: spans.map(([a, b]) => chars.slice(a, b).join("")) };
}

// wordfreq's table: a word's line (centibels below 1), looked up in the text itself (a Map of its
// 321,000 words would cost the first render more than the few words of a sentence ever need)
class WordTable {
  constructor(text) {
    this.text = " " + text.replaceAll("\n", " \n ") + " ";  // every word between two spaces
    this.lines = [];  // where each line ends
    for (let at = this.text.indexOf("\n"); at >= 0; at = this.text.indexOf("\n", at + 1)) this.lines.push(at);
    this.found = new Map();
  }

  get(word) {
    if (!this.found.has(word)) {
      const at = word && !/\s/u.test(word) ? this.text.indexOf(` ${word} `) : -1;
      let line = 0;
      if (at >= 0) for (let lo = 0, hi = this.lines.length; lo < hi; ) {
        const mid = (lo + hi) >> 1;
        if (this.lines[mid] < at) { lo = mid + 1; line = lo; } else hi = mid;
      }
      this.found.set(word, at < 0 ? undefined : line);
    }
    return this.found.get(word);
  }

  has(word) {
    return this.get(word) !== undefined;
  }
}

export async function loadWordTable(bytes) {
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  return new WordTable(await new Response(stream).text());
}

// wordfreq's numbers.py: the frequency of a run of digits (Benford's law, years apart)
const DIGIT_FREQS = [0.009, 0.300, 0.175, 0.124, 0.096, 0.078, 0.066, 0.057, 0.050, 0.045];
const benford = (s) => DIGIT_FREQS[Number(s[0])] / 10 ** (s.length - 1);
function yearFreq(s) {
  const year = Number(s);
  const log = year <= 2019 ? -1.9185 - 0.0083 * (2019 - year) : year <= 2039 ? -1.9185 : -1.9185 - 0.2 * (year - 2039);
  return 10 ** log + 0.1 * benford(s);
}
function digitFreq(token) {
  let freq = 1;
  for (const run of token.match(/\p{Nd}[\p{Nd}.,]+/gu) || []) {
    for (const digits of run.match(/\p{Nd}+/gu) || []) freq *= digits.length === 4 ? yearFreq(digits) : benford(digits);
  }
  return freq;
}

// wordfreq's tokens of one of our words: NFC, case-folded, ’ → ', split after "l'" / "qu'"
// before a vowel or h (wordfreq's rule for French-style elisions)
function wordTokens(word) {
  const text = word.normalize("NFC").toLowerCase().replaceAll("ß", "ss").replaceAll("’", "'");
  const tokens = [];
  let rest = text;
  for (let m; (m = rest.match(/^([\p{L}\p{N}_]{1,2}')(?=[aehiouyáéíóúàèìòùâêîôûåïöœ])/u)); ) {
    tokens.push(m[1].slice(0, -1)); rest = rest.slice(m[1].length);  // wordfreq drops the mark
  }
  if (rest) tokens.push(rest);
  return tokens;
}

// 3 significant digits, as wordfreq rounds (Python's round to a count of decimals)
function round3(freq) {
  const digits = Math.floor(-Math.log(freq) / Math.log(10)) + 3;
  return Number(freq.toFixed(Math.min(Math.max(digits, 0), 100)));
}

// word_zipf of one word: NaN for punctuation, 0 for a word wordfreq has never seen
export function wordZipf(word, table) {
  if (isPunctuation(word)) return NaN;
  let inverse = 0;
  for (const token of wordTokens(word)) {
    const smashed = token.replace(/\p{Nd}[\p{Nd}.,]+/gu, (m) => m.replace(/\p{Nd}/gu, "0"));
    if (!table.has(smashed)) return 0;
    let freq = 10 ** (-table.get(smashed) / 100);
    if (smashed !== token) freq *= digitFreq(token);
    inverse += 1 / freq;
  }
  if (!inverse) return 0;
  const zipf = Math.log(round3(1 / inverse)) / Math.log(10) + 9;
  return Number(zipf.toFixed(2));
}

// text_probe's one sequence in the browser: ids, display labels, which positions are special,
// delimiters and movable, each token's word and each word's frequency
export function textProbe(text, tokenizer, config, table) {
  const { ids, offsets } = tokenizer.encodeWithOffsets(text);
  const labels = tokenizer.labels(ids);
  const specials = new Set(config.special_ids);
  const special = ids.map((i) => specials.has(i));
  const movable = special.map((s) => !s);
  const delimiters = labels.map((label, j) => j > 0 && (special[j] || isPunctuation(label)));
  const { index, words } = tokenWords(text, offsets, special);
  const zipf = words.map((w) => wordZipf(w, table));
  return { text, ids, labels, movable, delimiters, wordIndex: index, words, zipf };
}
