// Building the page: elements from data (textContent only: nothing the server sends becomes markup),
// tables, notices, and the formats of money and time.

export function el(tag, attrs = {}, ...children) {
  const SVG = "http://www.w3.org/2000/svg";
  const svg = ["svg", "rect", "text", "title", "g", "line"].includes(tag);
  const node = svg ? document.createElementNS(SVG, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

// A table with a caption (its accessible name): columns are [header, value(row) -> text or Node, class].
export function table(caption, columns, rows, empty = "none") {
  const head = el("tr", {}, columns.map(([h, , cls]) => el("th", { scope: "col", class: cls }, h)));
  const body = rows.length
    ? rows.map((r) => el("tr", {}, columns.map(([, f, cls]) => el("td", { class: cls }, f(r) ?? ""))))
    : [el("tr", {}, el("td", { colspan: columns.length, class: "muted" }, empty))];
  return el("div", { class: "tablewrap" },
    el("table", {}, el("caption", { class: "sr-only" }, caption), el("thead", {}, head), el("tbody", {}, body)));
}

// A message in a live region: errors are `alert`s (read at once), the rest `status`.
export function notice(box, kind, text) {
  box.replaceChildren(text ? el("div", { class: `notice ${kind}`, role: kind === "error" ? "alert" : "status" }, text) : "");
}

export const status = (s) => el("span", { class: `status ${s || ""}` }, s || "-");

export function usd(micros) {
  const n = Number(micros || 0) / 1e6;
  return `$${n.toFixed(n !== 0 && Math.abs(n) < 0.01 ? 6 : 2)}`;
}

export function when(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  return isNaN(d) ? String(iso) : d.toISOString().replace("T", " ").slice(0, 19) + "Z";
}

export function link(href, text) {
  return el("a", { href }, text);
}

export function heading(text, ...rest) {
  // The page's h1 takes focus after a navigation, so a screen reader announces the new page.
  return el("h1", { tabindex: "-1" }, text, ...rest);
}
