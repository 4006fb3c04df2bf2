// A model's files, fetched once with their progress in bytes and kept by the browser (the Cache
// API, where the page's origin offers it: https or this machine) so that a later visit reads them
// from the disk. The site's config names each file and its size, and a hash of them all that
// names the cache: a rebuilt site with other weights uses a cache of its own, and the old one is
// deleted.

const PREFIX = "headlab-";

// the browser's cache for `name` at `version`, the other versions of it deleted; null where the
// page cannot use one (an insecure origin, a private window that refuses storage)
async function openCache(name, version) {
  if (typeof caches !== "object") return null;
  try {
    const mine = `${PREFIX}${name}-${version}`;
    for (const key of await caches.keys()) {
      if (key.startsWith(`${PREFIX}${name}-`) && key !== mine) await caches.delete(key);
    }
    return await caches.open(mine);
  } catch {
    return null;
  }
}

// one file's bytes from a response, read chunk by chunk: onBytes(count) after each chunk
async function readAll(response, size, onBytes) {
  const reader = response.body.getReader();
  const out = new Uint8Array(size);
  let at = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    if (at + value.length > size) throw new Error(`a file of this site is larger than its config says (${size} bytes)`);
    out.set(value, at);
    at += value.length;
    onBytes(value.length);
  }
  if (at !== size) throw new Error(`a file of this site was cut short: ${at} of ${size} bytes`);
  return out;
}

// every file of `files` ([{name, bytes}]) under `base`, one after another, as Uint8Arrays by
// name; progress({done, total, cached}) after each chunk. `fetchFile(url)` is the page's own
// fetch. Returns {data: Map, cached: whether every file came from the browser's cache}.
export async function fetchModelFiles(fetchFile, base, files, name, version, progress) {
  const total = files.reduce((sum, f) => sum + f.bytes, 0);
  const cache = await openCache(name, version);
  const data = new Map();
  let done = 0, cached = true;
  for (const file of files) {
    const url = new URL(file.name, base).href;
    let response = cache ? await cache.match(url) : undefined;
    const hit = Boolean(response);
    cached &&= hit;
    if (!response) {
      response = await fetchFile(url);
      if (!response.ok) throw new Error(`this static site is missing ${file.name} (HTTP ${response.status})`);
    }
    const bytes = await readAll(response, file.bytes, (n) => { done += n; progress({ done, total, cached }); });
    if (cache && !hit) {
      try {
        await cache.put(url, new Response(bytes, { headers: { "content-length": String(file.bytes) } }));
      } catch { /* a full disk or a refused quota: the next visit downloads again */ }
    }
    data.set(file.name, bytes);
  }
  return { data, cached };
}
