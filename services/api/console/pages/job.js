// A managed job: its recovery history (each status change; each preemption; each placement with
// region and price) and its output across recoveries (a `launch` frame names each cluster).
// At a past moment (`at`) the history is the log's up to then, read once: no action, no live output.
import { get, post, query, stream } from "../api.js";
import { el, heading, link, notice, status, table, usd, when } from "../ui.js";

const REFRESH_MS = 3000;
const FINAL = new Set(["SUCCEEDED", "FAILED", "FAILED_SETUP", "FAILED_CONTROLLER", "FAILED_NO_RESOURCE",
  "CANCELLED"]);

export async function render(root, { me, args, signal, at }) {
  const id = Number(args[0]);
  const msg = el("div", { "aria-live": "polite" });
  const facts = el("div");
  const actions = el("div");
  const placements = el("div");
  const changes = el("div");
  const logs = el("pre", { class: "logs", id: "logs", tabindex: "0", "aria-label": "Managed job output" });
  const logState = el("p", { class: "muted", role: "status", id: "log-state" }, "following…");
  root.append(heading(`Managed job ${id}`), msg, facts, actions,
    el("section", { "aria-labelledby": "h-place" }, el("h2", { id: "h-place" }, "Placements"), placements),
    el("section", { "aria-labelledby": "h-hist" }, el("h2", { id: "h-hist" }, "Recovery history"), changes),
    el("section", { "aria-labelledby": "h-logs" }, el("h2", { id: "h-logs" }, "Output, across recoveries"), logState, logs));
  const say = (e) => { if (e.name !== "AbortError") notice(msg, "error", e.text || String(e)); };

  let shown = "";
  async function refresh() {
    const h = await get(`/jobs/${id}/history${query({ at })}`, { signal });
    const key = JSON.stringify(h);
    if (key === shown) return;
    shown = key;
    facts.replaceChildren(el("dl", { class: "facts" },
      el("dt", {}, "Name"), el("dd", {}, h.name || "-"),
      el("dt", {}, "Status"), el("dd", {}, status(h.status)),
      el("dt", {}, "Owner"), el("dd", {}, `${h.user || "-"} (team ${h.team || "-"})`),
      el("dt", {}, "Preemptions"), el("dd", { id: "preemptions" }, String(h.preemptions))));
    actions.replaceChildren(!at && me.role !== "viewer" && !FINAL.has(h.status)
      ? el("button", { type: "button", class: "danger", onclick: async () => {
        try {
          await post(`/jobs/${id}/cancel`);
          notice(msg, "info", `Cancel of managed job ${id}: requested.`);
          await refresh();
        } catch (e) { say(e); }
      } }, "Cancel managed job") : "");
    placements.replaceChildren(table("Where each launch ran", [
      ["Cluster", (p) => link(`#/cluster/${encodeURIComponent(p.cluster)}`, p.cluster)],
      ["Infra", (p) => p.infra], ["Region", (p) => p.region || "-"], ["Zone", (p) => p.zone || "-"],
      ["Instance", (p) => p.instance_type || "-"], ["Market", (p) => p.market],
      ["Nodes", (p) => String(p.num_nodes), "num"], ["$/h", (p) => usd(p.hourly_price_micros), "num"],
    ], h.placements, "not placed yet"));
    changes.replaceChildren(table("Each status change, oldest first", [
      ["When", (c) => when(c.time)], ["Status", (c) => status(c.status)], ["What", (c) => c.kind],
      ["Cluster", (c) => c.cluster || ""], ["Recoveries", (c) => String(c.recoveries), "num"],
      ["Reason", (c) => c.reason],
    ], h.changes, "no status change yet"));
  }

  await refresh();
  if (at) { // the past does not change: read once; its output is today's stream, not then's
    logState.textContent = "output is not shown at a past moment (Back to now follows it)";
    logs.hidden = true;
    return;
  }
  stream(`/jobs/${id}/logs${query({ tail: 1000 })}`, (event, data) => {
    if (event === "launch") logs.append(`── launch ${data.launch} on cluster ${data.cluster} ──\n`);
    else if (event === "line") logs.append(`${data.line}\n`);
    else if (event === "end") logState.textContent = `managed job ended: ${data.status}`;
    else if (event === "error") logState.textContent = data.detail;
    logs.scrollTop = logs.scrollHeight;
  }, signal).catch((e) => { if (e.name !== "AbortError") logState.textContent = e.text || String(e); });
  const timer = setInterval(() => refresh().catch(say), REFRESH_MS);
  signal.addEventListener("abort", () => clearInterval(timer));
}
