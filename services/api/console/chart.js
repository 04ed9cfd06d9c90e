// A horizontal bar chart of a report's lines, drawn as SVG (no library): one bar per line, its
// label and value written beside it, and the whole described for a screen reader.
import { el } from "./ui.js";

const ROW = 26;
const LABEL_W = 150;
const VALUE_W = 110;

// `scale`: the value a full bar stands for (100 for a percentage); by default the largest value.
export function bars(title, items, width = 640, scale = null) {
  const max = scale ?? Math.max(0, ...items.map((i) => i.value));
  const barW = width - LABEL_W - VALUE_W;
  const height = Math.max(1, items.length) * ROW + 8;
  const svg = el("svg", { class: "chart", role: "img", viewBox: `0 0 ${width} ${height}`, width, height,
    "aria-label": `${title}: ${items.map((i) => `${i.label} ${i.text}`).join(", ") || "no lines"}` },
  el("title", {}, title));
  items.forEach((item, n) => {
    const y = n * ROW + 4;
    const w = max > 0 ? Math.max(1, Math.round((Math.min(item.value, max) / max) * barW)) : 1;
    svg.append(el("g", {},
      el("text", { x: 0, y: y + 16 }, item.label.length > 22 ? `${item.label.slice(0, 21)}…` : item.label),
      el("rect", { x: LABEL_W, y, width: w, height: ROW - 8, rx: 2 }),
      el("text", { x: LABEL_W + w + 6, y: y + 16 }, item.text)));
  });
  return svg;
}
