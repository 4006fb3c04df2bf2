// Talks to the headlab server. Every number on the page comes through here.

export class ApiError extends Error {
  constructor(message, status) {
    super(message);
    this.status = status;
  }
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
    throw new ApiError(detail || `HTTP ${response.status}`, response.status);
  }
  return data;
}
