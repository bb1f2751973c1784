// The jointspace HTTP API as the page calls it: JSON and multipart requests, the API key, and errors that carry
// the API's own `detail`. Paths are relative, so the page also works behind a proxy that mounts it under a prefix.

const KEY_STORAGE = "jointspace.apiKey";

export class ApiError extends Error {
  constructor(status, detail) {
    super(detail);
    this.name = "ApiError";
    this.status = status;      // 0: the service could not be reached
    this.detail = detail;
  }

  get summary() {
    return this.status ? `Error ${this.status}: ${this.detail}` : this.detail;
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

async function detailOf(response) {
  try {
    const body = await response.json();
    if (typeof body.detail === "string" && body.detail) return body.detail;
  } catch {
    // not JSON: fall through to the status text
  }
  return response.statusText || "the service answered with an error";
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
    const detail = await detailOf(response);
    if (response.status === 401) auth.onUnauthorized(detail);
    throw new ApiError(response.status, detail);
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

// A URL a <video> can play for a gallery video, from `start` seconds (a media fragment). Without a key the API URL
// itself (the browser seeks with range requests); with one, the file is fetched here and played from a blob: URL.
export async function videoURL(videoId, start, signal) {
  const url = `v1/videos/${encodeURIComponent(videoId)}`;
  if (!auth.key) return { url: `${url}#t=${start}`, revoke: () => {} };
  const blob = await (await request(url, { signal })).blob();
  const objectURL = URL.createObjectURL(blob);
  return { url: `${objectURL}#t=${start}`, revoke: () => URL.revokeObjectURL(objectURL) };
}

// A URL an <img> can show for a gallery image. Without a key it is the API URL itself (the browser fetches and
// caches it); with one, <img> cannot send the header, so the image is fetched here and shown from a blob: URL,
// which the caller revokes when the image goes away.
export async function imageURL(id, size, signal) {
  const url = `v1/images/${encodeURIComponent(id)}?size=${size}`;
  if (!auth.key) return { url, revoke: () => {} };
  const blob = await (await request(url, { signal })).blob();
  const objectURL = URL.createObjectURL(blob);
  return { url: objectURL, revoke: () => URL.revokeObjectURL(objectURL) };
}
