// Talks to the headlab server. Every number on the page comes through here.

export class ApiError extends Error {
  constructor(message, status, errors = []) {
    super(message);
    this.status = status;
    this.errors = errors;  // a 422's problems one by one: [{loc: ["body", field], msg, type}]
  }
}

// A refusal in the page's words: the first problem whose field the page names (`said[field]`
// turns that problem into a sentence), else the server's own one-line detail.
export function refusal(err, said) {
  const item = (err.errors || []).find((e) => said[e.loc?.at(-1)]);
  return item ? said[item.loc.at(-1)](item) : err.message;
}

// The number a validator's message quotes ("… at most 2000 characters" → 2000), or null.
export function quoted(item) {
  const m = /(\d[\d,_]*)/.exec(item?.msg || "");
  return m ? Number(m[1].replace(/[,_]/g, "")) : null;
}

export async function api(path, body, method) {
  const options = body === undefined ? (method ? { method } : {}) : {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  };
  const response = await fetch(path, options);
  let data;
  try {
    data = await response.json();
  } catch {
    data = { detail: response.statusText };
  }
  if (!response.ok) {
    const detail = typeof data.detail === "string" ? data.detail : JSON.stringify(data.detail);
    throw new ApiError(detail || `HTTP ${response.status}`, response.status, Array.isArray(data.errors) ? data.errors : []);
  }
  return data;
}
