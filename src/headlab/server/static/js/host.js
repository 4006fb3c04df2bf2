// What the page's host runs. `headlab serve` runs everything the page offers; a static copy of
// the page (`headlab static`) runs only what its builder listed in the stored GET /api/health
// answer under "static_site" (headlab.site.site_manifest): the page offers nothing else, and
// says in one line what needs the server. Set once from the health answer, before any widget.
let site = null;

export function setHost(health) {
  site = health?.static_site ?? null;
}

// Whether the host runs `name` of `kind`: "models", "probes", "head_types", "routes" (the POST
// routes, e.g. "switch-off"), "heads_options" (POST /api/heads's optional fields, e.g. "evidence").
export function hostRuns(kind, name) {
  return !site || (site[kind] ?? []).includes(name);
}

// The manifest's line on what this static site leaves out ("" when served by headlab serve).
export function hostNote() {
  return site?.note ?? "";
}

// Whether the page is a static copy (`headlab static`), which runs the models of its manifest in
// the reader's browser, rather than served by `headlab serve`.
export function hostIsStatic() {
  return site !== null;
}
