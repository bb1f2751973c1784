// The jointspace HTTP API as the page calls it: JSON and multipart requests, the API key, and errors that carry
// the API's own `detail`. Paths are relative, so the page also works behind a proxy that mounts it under a prefix.

const KEY_STORAGE = "jointspace.apiKey";

export class ApiError extends Error {
  constructor(status, detail, errors = []) {
    super(detail);
    this.name = "ApiError";
    this.status = status;      // 0: the service could not be reached
    this.detail = detail;
    this.errors = errors;      // a 422's fields: [{loc, msg, type}]
  }

  // What the page says: the API's own words as a sentence for a request it refused (4xx: the detail says what is
  // wrong, e.g. "The upload is not an image this service reads (…)."); the status with them for the service's own
  // failure (5xx).
  get summary() {
    if (this.status >= 500) return `Error ${this.status}: ${this.detail}`;
    const text = String(this.detail).trim();
    const sentence = text.charAt(0).toUpperCase() + text.slice(1);
    return /[.!?)]$/.test(sentence) ? sentence : `${sentence}.`;
  }
}

// The key lives in this tab's sessionStorage only; it is sent as `X-API-Key`, as the service expects.
export const auth = {
  get key() {
    return sessionStorage.getItem(KEY_STORAGE) || "";
  },
  set key(value) {
    if (value) sessionStorage.setItem(KEY_STORAGE, value);
    else sessionStorage.removeItem(KEY_STORAGE);
  },
  onUnauthorized: (detail) => {},     // set by the page: ask for a key
};

function headers() {
  return auth.key ? { "X-API-Key": auth.key } : {};
}

// The API's error: its `detail` (and a 422's `errors`), or the status text when the body is not the API's JSON.
async function errorOf(response) {
  try {
    const body = await response.json();
    if (typeof body.detail === "string" && body.detail) {
      return new ApiError(response.status, body.detail, Array.isArray(body.errors) ? body.errors : []);
    }
  } catch {
    // not JSON: fall through to the status text
  }
  return new ApiError(response.status, response.statusText || "the service answered with an error");
}

// POST/GET `path`; `json` (an object) or `form` (FormData) as the body. Resolves to the Response when it is 2xx,
// else rejects with an ApiError holding the status and the API's detail.
export async function request(path, { json, form, signal } = {}) {
  const init = { method: json !== undefined || form ? "POST" : "GET", headers: headers(), signal };
  if (json !== undefined) {
    init.headers["content-type"] = "application/json";
    init.body = JSON.stringify(json);
  } else if (form) {
    init.body = form;
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new ApiError(0, `Cannot reach the service (${err.message}).`);
  }
  if (!response.ok) {
    const err = await errorOf(response);
    if (response.status === 401) auth.onUnauthorized(err.detail);
    throw err;
  }
  return response;
}

export async function requestJSON(path, options) {
  return (await request(path, options)).json();
}

// GET /readyz (open even with an API key): {ok, status, body}.
export async function readiness() {
  const response = await fetch("readyz", { cache: "no-store" });
  let body = {};
  try {
    body = await response.json();
  } catch {
    body = { status: "error", detail: response.statusText };
  }
  return { ok: response.ok, status: response.status, body };
}

// A URL the page can show or open for a gallery file at `path` (an image, a thumbnail, a video). Without a key it
// is the API URL itself (the browser fetches and caches it, and seeks a video with range requests); with one,
// <img>, <video> and a new tab cannot send the header, so the file is fetched here and shown from a blob: URL,
// which `revoke` releases when it goes away.
export async function fileURL(path, signal) {
  if (!auth.key) return { url: path, revoke: () => {} };
  const blob = await (await request(path, { signal })).blob();
  const objectURL = URL.createObjectURL(blob);
  return { url: objectURL, revoke: () => URL.revokeObjectURL(objectURL) };
}

// A gallery image, or its JPEG thumbnail whose longer side is `size` (null: the file itself).
export function imageURL(id, size, signal) {
  const path = `v1/images/${encodeURIComponent(id)}`;
  return fileURL(size ? `${path}?size=${size}` : path, signal);
}

// A gallery video, to play from `start` seconds (a media fragment).
export async function videoURL(videoId, start, signal) {
  const { url, revoke } = await fileURL(`v1/videos/${encodeURIComponent(videoId)}`, signal);
  return { url: `${url}#t=${start}`, revoke };
}
