// The public API (/api/v1), called with the user's token: the one place the console talks to the server.
// The token lives in sessionStorage: gone with the tab, never in a cookie (so no request is ever made
// with it by another site), never in the URL.

const KEY = "spz.console.token";

export const token = {
  get: () => sessionStorage.getItem(KEY),
  set: (t) => sessionStorage.setItem(KEY, t),
  clear: () => sessionStorage.removeItem(KEY),
};

export class ApiError extends Error {
  constructor(status, title, detail, body = null) {
    super(detail);
    this.status = status;
    this.title = title;
    this.detail = detail;
    this.body = body; // the whole problem (a 422's positioned `problems`, for instance)
  }
  // One plain sentence for the page: the server's own problem detail (RFC 9457), never a stack.
  get text() {
    return this.status ? `${this.title} (${this.status}): ${this.detail}` : this.detail;
  }
}

function headers(extra = {}) {
  const h = { Accept: "application/json", ...extra };
  const t = token.get();
  if (t) h.Authorization = `Bearer ${t}`;
  return h;
}

async function problemOf(res) {
  let body = null;
  try {
    body = await res.json();
  } catch {
    body = null;
  }
  const detail = (body && body.detail) || res.statusText || "the server refused the request";
  return new ApiError(res.status, (body && body.title) || `HTTP ${res.status}`, String(detail), body);
}

const UNREACHABLE = "the API server cannot be reached; is it running (spz api status)?";

export async function call(method, path, body, { signal } = {}) {
  let res;
  try {
    res = await fetch(`/api/v1${path}`, {
      method,
      headers: headers(body === undefined ? {} : { "Content-Type": "application/json" }),
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new ApiError(0, "Unreachable", UNREACHABLE);
  }
  // A short request is let finish when its page goes (its answer is dropped): only streams are
  // cut, so an aborted request always means a stream the page stopped.
  if (signal && signal.aborted) throw new DOMException("the page was left", "AbortError");
  if (!res.ok) throw await problemOf(res);
  return (res.headers.get("content-type") || "").includes("json") ? res.json() : null;
}

export const get = (path, opts) => call("GET", path, undefined, opts);
export const post = (path, body, opts) => call("POST", path, body === undefined ? {} : body, opts);
export const put = (path, body, opts) => call("PUT", path, body, opts);
export const del = (path, opts) => call("DELETE", path, undefined, opts);

export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== "") q.set(k, v);
  const s = q.toString();
  return s ? `?${s}` : "";
}

// A server-sent events stream read with fetch and a ReadableStream, not EventSource: EventSource
// cannot send the Authorization header. `onFrame(event, data)` for each frame; resolves when the
// server ends the stream, rejects with AbortError when `signal` aborts it.
export async function stream(path, onFrame, signal) {
  let res;
  try {
    res = await fetch(`/api/v1${path}`, { headers: headers({ Accept: "text/event-stream" }), signal });
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new ApiError(0, "Unreachable", UNREACHABLE);
  }
  if (!res.ok) throw await problemOf(res);
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value;
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      let event = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) event = line.slice(7);
        else if (line.startsWith("data: ")) data.push(line.slice(6));
      }
      if (data.length) onFrame(event, JSON.parse(data.join("\n")));
    }
  }
}
