// How far a long request has got, in the status line: the page makes up an id, sends it as the
// request's progress_id, and while the request runs asks GET /api/progress/{id} every POLL_MS
// (headlab.server.progress): the step under way with its count ("random-weights floors 1/3",
// "ablating heads 40/66"), the seconds so far, and the time the server expects, measured on
// its own machine or estimated from the model's size (it says which). A host that does not
// take progress_id (a static copy of the page runs the model in the browser) is not asked.
import { api } from "./api.js";
import { hostRuns } from "./host.js";

const POLL_MS = 500;
const sleep = (ms) => new Promise((done) => setTimeout(done, ms));

// Whether this host reports progress: it takes POST /api/heads's progress_id.
export function reportsProgress() {
  return hostRuns("heads_options", "progress_id");
}

// 16 random hex digits: the id of one request's progress.
export function progressId() {
  const bytes = crypto.getRandomValues(new Uint8Array(8));
  return [...bytes].map((b) => b.toString(16).padStart(2, "0")).join("");
}

const seconds = (s) => (s < 1 ? "under a second" : `${Math.round(s)} s`);

// "random-weights floors 1/3 — 12 s so far; expected about 47 s in all (measured on this
// machine …)"; "" before the request has started on the server.
export function progressText(p) {
  if (!p || p.state !== "running") return "";
  const count = p.total > 1 ? ` ${p.done}/${p.total}` : "";
  const now = p.label ? `${p.label}${count}` : "starting";
  const expected = p.expected_s == null ? "" : `; expected about ${seconds(p.expected_s)} in all (${p.expected})`;
  return `${p.model}: ${now} — ${seconds(p.elapsed_s)} so far${expected}.`;
}

// `request(id)`'s answer, with `show(text)` called with each progress report while it runs.
export async function withProgress(request, show) {
  if (!reportsProgress()) return request(null);
  const id = progressId();
  let running = true;
  (async () => {
    while (running) {
      await sleep(POLL_MS);
      if (!running) return;
      try {
        const text = progressText(await api(`/api/progress/${id}`));
        if (running && text) show(text);
      } catch {
        // a missed report is no failure: the next one, or the answer, follows
      }
    }
  })();
  try {
    return await request(id);
  } finally {
    running = false;
  }
}
